package main_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/iidp/metasync/test/testenv"
)

// consulDaemon starts `serve` on the fixture of xdsFixture in ns, with
// the Consul facade (its flags given by environment, as a Deployment
// would) serving the keys of chain model-to-endpoints, and returns the
// HTTP address, the facade's address and the backends.
func consulDaemon(t *testing.T, ns string, n int, extra ...string) (addr, consulAddr string, backends []string, d *daemon) {
	t.Helper()
	testenv.Need(t, env)
	ip := localIPv4()
	if ip == "" {
		t.Skip("no IPv4 address but loopback: an EndpointSlice may not point at 127.0.0.1")
	}
	backends, config := xdsFixture(t, ns, ip, n)
	addr, consulAddr = testenv.FreeAddr(t), testenv.FreeAddr(t)
	args := append([]string{"--config", config, "--kubeconfig", env.WriteKubeconfig(t, env.APIServerAddr()), "--listen", addr}, extra...)
	d = start(t, []string{"METASYNC_CONSUL_LISTEN=" + consulAddr, "METASYNC_CONSUL_SERVICES=chains/model-to-endpoints"}, args...)
	waitHTTP(t, d, addr)
	return addr, consulAddr, backends, d
}

// addrsOf are the Service.Address:Service.Port of entries, sorted.
func addrsOf(entries []*consulapi.ServiceEntry) []string {
	var out []string
	for _, e := range entries {
		out = append(out, net.JoinHostPort(e.Service.Address, strconv.Itoa(e.Service.Port)))
	}
	sort.Strings(out)
	return out
}

// TestConsulClientOnTheControlPlane: hashicorp/consul/api, the library of
// Prometheus' consul_sd, Traefik and most Go services written for
// Consul, against `serve --consul-listen` on the real control plane:
// Agent().Self(), Catalog().Services, Health().Service, and a blocking
// loop of Health().Service that follows an endpoint change within a
// second.
func TestConsulClientOnTheControlPlane(t *testing.T) {
	_, consulAddr, backends, _ := consulDaemon(t, "consul-e2e", 2)
	client, err := consulapi.NewClient(&consulapi.Config{Address: consulAddr})
	if err != nil {
		t.Fatal(err)
	}
	self, err := client.Agent().Self()
	if err != nil {
		t.Fatal(err)
	}
	if dc := self["Config"]["Datacenter"]; dc != "metasync" {
		t.Errorf("Agent().Self() datacenter %v, want metasync", dc)
	}
	var services map[string][]string
	testenv.Eventually(t, "the catalog lists the model", func() string {
		var err error
		services, _, err = client.Catalog().Services(nil)
		if err != nil {
			return err.Error()
		}
		if _, ok := services["xds-model"]; !ok {
			return fmt.Sprint(services)
		}
		return ""
	})
	// The catalog lists the chain's first index's keys; the answer waits
	// for the chain's every resource to have synced (503 before).
	var entries []*consulapi.ServiceEntry
	var meta *consulapi.QueryMeta
	testenv.Eventually(t, "the service is answered", func() string {
		var err error
		if entries, meta, err = client.Health().Service("xds-model", "", true, nil); err != nil {
			return err.Error()
		}
		return ""
	})
	want := slices.Sorted(slices.Values(backends))
	if got := addrsOf(entries); !slices.Equal(got, want) {
		t.Fatalf("Health().Service = %v, want %v", got, want)
	}
	if meta.LastIndex == 0 || !meta.KnownLeader {
		t.Errorf("QueryMeta %+v: want an index and a known leader", meta)
	}
	e := entries[0]
	if e.Node.Address != e.Service.Address || e.Service.Service != "xds-model" || len(e.Checks) != 1 || e.Checks.AggregatedStatus() != consulapi.HealthPassing {
		t.Errorf("entry %+v %+v %+v: not shaped as Consul shapes it", e.Node, e.Service, e.Checks)
	}
	if e.Service.ID == entries[1].Service.ID {
		t.Errorf("two instances share the ID %q", e.Service.ID)
	}
	cat, _, err := client.Catalog().Service("xds-model", "", nil)
	if err != nil || len(cat) != 2 || cat[0].ServiceName != "xds-model" || cat[0].ServicePort == 0 {
		t.Errorf("Catalog().Service = %v, %v", cat, err)
	}
	unknown, um, err := client.Health().Service("no-such-model", "", true, nil)
	if err != nil || len(unknown) != 0 || um.LastIndex == 0 {
		t.Errorf("an unknown service: %v %+v %v, want no entry, with an index", unknown, um, err)
	}

	// A blocking loop, as a watcher of the service runs it.
	type update struct {
		addrs []string
		at    time.Time
	}
	updates := make(chan update, 16)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		index := meta.LastIndex
		for ctx.Err() == nil {
			q := (&consulapi.QueryOptions{WaitIndex: index, WaitTime: time.Minute}).WithContext(ctx)
			entries, m, err := client.Health().Service("xds-model", "", true, q)
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			if m.LastIndex < index {
				t.Errorf("X-Consul-Index went backwards: %d after %d", m.LastIndex, index)
			}
			if m.LastIndex != index {
				updates <- update{addrsOf(entries), time.Now()}
			}
			index = m.LastIndex
		}
	}()
	time.Sleep(200 * time.Millisecond) // the query waits
	deleted := time.Now()
	if err := env.Kube.DiscoveryV1().EndpointSlices("consul-e2e").Delete(ctx, "xds-app-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case u := <-updates:
		took := u.at.Sub(deleted)
		t.Logf("the blocking query answered %v after the delete: %v", took.Round(time.Millisecond), u.addrs)
		if !slices.Equal(u.addrs, []string{backends[0]}) {
			t.Errorf("after the delete: %v, want %v", u.addrs, backends[:1])
		}
		if took > time.Second {
			t.Errorf("the change reached the client in %v, want within a second", took)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the blocking query did not answer the change")
	}
}

// TestConsulAttacks: what a caller cannot do to the Consul facade: hold
// more blocking queries than its limit (429), make one wait beyond 10
// minutes (a wait of hours is cut), hold one with an index the daemon
// never gave (answered at once), learn anything from an unknown service
// but that it has no instance, or write (every write is a 4xx).
func TestConsulAttacks(t *testing.T) {
	addr, consulAddr, _, _ := consulDaemon(t, "consul-attack", 1, "--consul-max-blocking-per-caller", "4")
	get := func(ctx context.Context, method, path string) (*http.Response, string, error) {
		req, _ := http.NewRequestWithContext(ctx, method, "http://"+consulAddr+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = fmt.Fprint(&b, readAll(resp))
		return resp, b.String(), nil
	}
	var index string
	testenv.Eventually(t, "the facade answers", func() string {
		resp, body, err := get(context.Background(), "GET", "/v1/health/service/xds-model")
		if err != nil {
			return err.Error()
		}
		if resp.StatusCode != 200 || !strings.Contains(body, "xds-model") {
			return fmt.Sprint(resp.StatusCode, body)
		}
		index = resp.Header.Get("X-Consul-Index")
		return ""
	})

	// Many blocking queries from one caller: the fifth is refused.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := 0; i < 4; i++ {
		go func() { _, _, _ = get(ctx, "GET", "/v1/health/service/xds-model?wait=100h&index="+index) }()
	}
	testenv.Eventually(t, "four blocking queries wait", func() string {
		if got := metric(t, base(addr), "metasync_consul_blocking_queries"); got != "4" {
			return got
		}
		return ""
	})
	resp, body, err := get(context.Background(), "GET", "/v1/health/service/xds-model?index="+index)
	if err != nil || resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
		t.Errorf("a fifth blocking query: %v %v %s, want 429 with Retry-After", resp, err, body)
	}
	if got := metric(t, base(addr), `metasync_consul_refused_total{reason="blocking_per_caller"}`); got != "1" {
		t.Errorf("refusals counted %q, want 1", got)
	}
	// A query that asks no wait is no blocking query: it is answered.
	if resp, _, err := get(context.Background(), "GET", "/v1/catalog/services"); err != nil || resp.StatusCode != 200 {
		t.Errorf("a read beside the blocking queries: %v %v", resp, err)
	}
	cancel()
	testenv.Eventually(t, "the blocking queries end with their clients", func() string {
		if got := metric(t, base(addr), "metasync_consul_blocking_queries"); got != "0" {
			return got
		}
		return ""
	})

	// An index the daemon never gave: answered at once, with its own.
	start := time.Now()
	resp, _, err = get(context.Background(), "GET", "/v1/health/service/xds-model?index=18446744073709551615&wait=10m")
	if err != nil || resp.StatusCode != 200 || time.Since(start) > 5*time.Second || resp.Header.Get("X-Consul-Index") != index {
		t.Errorf("a huge index: %v %v after %v, want 200 at once with index %s", resp, err, time.Since(start), index)
	}

	// Unknown services, and what is not an index or a wait.
	for path, code := range map[string]int{
		"/v1/health/service/no-such-model":                200,
		"/v1/catalog/service/%2e%2e%2fetc":                200,
		"/v1/health/service/xds-model?index=-1":           400,
		"/v1/health/service/xds-model?index=x":            400,
		"/v1/health/service/xds-model?wait=forever":       400,
		"/v1/health/service/xds-model?filter=Service.Tag": 400,
		"/v1/health/service/xds-model?dc=elsewhere":       500,
		"/v1/kv/secret":     404,
		"/v1/acl/tokens":    404,
		"/v1/catalog/nodes": 404,
	} {
		resp, body, err := get(context.Background(), "GET", path)
		if err != nil || resp.StatusCode != code {
			t.Errorf("GET %s: %v %v %s, want %d", path, resp, err, body, code)
		} else if code == 200 && strings.TrimSpace(body) != "[]" {
			t.Errorf("GET %s: %s, want []", path, body)
		}
	}
	// Writes.
	for _, w := range []struct{ method, path string }{
		{"PUT", "/v1/agent/service/register"}, {"PUT", "/v1/catalog/register"}, {"PUT", "/v1/kv/x"},
		{"DELETE", "/v1/kv/x"}, {"POST", "/v1/health/service/xds-model"}, {"PUT", "/v1/agent/service/deregister/xds-model"},
		{"DELETE", "/v1/catalog/services"},
	} {
		resp, _, err := get(context.Background(), w.method, w.path)
		if err != nil || resp.StatusCode < 400 || resp.StatusCode >= 500 {
			t.Errorf("%s %s: %v %v, want a 4xx", w.method, w.path, resp, err)
		}
	}
	req, _ := http.NewRequest("PUT", "http://"+consulAddr+"/v1/catalog/register", strings.NewReader(`{"Node":"evil","Address":"6.6.6.6","Service":{"Service":"xds-model","Port":1}}`))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 405 {
		t.Errorf("a registration with a body: %v %v, want 405", resp, err)
	} else {
		resp.Body.Close()
	}
	if _, body, err := get(context.Background(), "GET", "/v1/health/service/xds-model"); err != nil || strings.Contains(body, "6.6.6.6") {
		t.Errorf("a refused write changed the answer: %s %v", body, err)
	}
}

// TestConsulConnectionHog: callers that open connections to the Consul
// facade and keep them alive (a read each, then nothing) cannot keep
// another caller out. With --consul-max-blocking 4 the facade keeps 68
// connections, 34 of them at most from one address: two addresses
// opening 100 each, the facade closes their idle ones to make room, and
// a third caller's reads answer at once.
func TestConsulConnectionHog(t *testing.T) {
	addr, consulAddr, _, _ := consulDaemon(t, "consul-hog", 1, "--consul-max-blocking", "4")
	testenv.Eventually(t, "the facade answers", func() string {
		resp, err := http.Get("http://" + consulAddr + "/v1/health/service/xds-model")
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			return resp.Status
		}
		return ""
	})
	var hogs []net.Conn
	for _, ip := range []string{"127.0.0.2", "127.0.0.4"} {
		for range 100 {
			c := dialFrom(t, ip, consulAddr)
			fmt.Fprintf(c, "GET /v1/agent/self HTTP/1.1\r\nHost: x\r\n\r\n")
			hogs = append(hogs, c)
		}
	}
	kept, deadline := 0, time.Now().Add(3*time.Second)
	for _, c := range hogs {
		_ = c.SetDeadline(deadline)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			continue // closed to make room, or never accepted
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		kept++
	}
	t.Logf("%d of 200 hogging reads answered", kept)
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.3")}}
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: dialer.DialContext, DisableKeepAlives: true}}
	for i := range 5 {
		start := time.Now()
		resp, err := client.Get("http://" + consulAddr + "/v1/health/service/xds-model")
		if err != nil {
			t.Fatalf("read %d of another caller beside the hogs: %v", i, err)
		}
		body := readAll(resp)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(body, "xds-model") || time.Since(start) > time.Second {
			t.Fatalf("read %d of another caller beside the hogs: %d %s after %v", i, resp.StatusCode, body, time.Since(start))
		}
	}
	m := samples(t, base(addr))
	if n := m["metasync_consul_connections_open"]; n > 68 {
		t.Errorf("%v connections open, limit 68", n)
	}
	if n := m["metasync_consul_connections_evicted_total"]; n < 100 {
		t.Errorf("%v idle connections closed to make room, want at least 100", n)
	}
}

// readAll is the body of resp, as text.
func readAll(resp *http.Response) string {
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}
