package main_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/iidp/metasync/test/testenv"
)

// idleADSStream opens a raw h2c connection to addr from the loopback
// address from, and on it an ADS stream that never sends a request. It
// returns the connection (nil when it was refused or closed at once).
func idleADSStream(addr, from string) net.Conn {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 2 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil
	}
	fr := http2.NewFramer(c, c)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", addr},
		{":path", "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil || fr.WriteSettings() != nil ||
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true}) != nil {
		c.Close()
		return nil
	}
	go func() { _, _ = io.Copy(io.Discard, c) }()
	return c
}

// TestXDSFlood: one caller floods the xDS port with connections, each
// with an ADS stream that never asks for anything, as fast as it can.
// Another caller's grpc-go xDS client still routes through the daemon,
// the probes answer, the flood's idle streams end after the first-request
// deadline, and the refusals are counted.
func TestXDSFlood(t *testing.T) {
	testenv.Need(t, env)
	ip := localIPv4()
	if ip == "" {
		t.Skip("no IPv4 address but loopback: an EndpointSlice may not point at 127.0.0.1")
	}
	backends, config := xdsFixture(t, "xds-flood", ip, 1)
	addr, xdsAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	d := start(t, nil, "--config", config, "--kubeconfig", env.WriteKubeconfig(t, ""), "--listen", addr, "--xds-listen", xdsAddr,
		"--xds-max-connections", "200", "--xds-max-connections-per-caller", "16")
	waitHTTP(t, d, addr)

	// The flood, from 127.0.0.2: 500 connections with an idle stream.
	start := time.Now()
	held := 0
	for range 500 {
		if c := idleADSStream(xdsAddr, "127.0.0.2"); c != nil {
			held++
			t.Cleanup(func() { c.Close() })
		}
	}
	t.Logf("flood: 500 connections opened in %v", time.Since(start).Round(time.Millisecond))

	// The victim, from 127.0.0.1: grpc-go's own xDS client.
	bootstrap := fmt.Sprintf(`{"xds_servers":[{"server_uri":%q,"channel_creds":[{"type":"insecure"}],"server_features":["xds_v3"]}],"node":{"id":"victim"}}`, xdsAddr)
	callStart := time.Now()
	got := callXDS(t, bootstrap, "chains/model-to-endpoints/xds-model", 20*time.Second)
	if got[backends[0]] != 1 {
		t.Errorf("the victim's call during the flood: %v", got)
	}
	t.Logf("the victim's first call answered after %v", time.Since(callStart).Round(time.Millisecond))
	for _, path := range []string{"/livez", "/readyz", "/metrics"} {
		resp, err := (&http.Client{Timeout: 2 * time.Second}).Get(base(addr) + path)
		if err != nil {
			t.Errorf("GET %s during the flood: %v", path, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("GET %s during the flood: %d", path, resp.StatusCode)
		}
	}
	refused := 0
	for _, reason := range []string{"connections_per_caller", "connections"} {
		n, _ := strconv.Atoi(metric(t, base(addr), `metasync_xds_refused_total{reason="`+reason+`"}`))
		refused += n
	}
	if refused == 0 {
		t.Errorf("no refusal counted of a flood of 500 connections from one address (held %d)", held)
	}
	if open, _ := strconv.Atoi(metric(t, base(addr), "metasync_xds_connections")); open > 200 {
		t.Errorf("%d xDS connections open, over --xds-max-connections 200", open)
	}
	if !strings.Contains(d.stderr.String(), "xDS refused at a limit") {
		t.Errorf("no refusal logged:\n%s", d.stderr)
	}
}
