package xds

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/iidp/metasync/test/testenv"
)

// adsClientOf opens a raw ADS stream to s.
func adsClientOf(t *testing.T, s *Server) discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := s.Transport(nil)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return stream
}

// TestUnknownTarget: a target whose index or chain does not exist is
// logged once per client and index or chain, with the closest name (or
// the other kind, when the name is one), and listed as unknown, with
// why, by the status route; a known target is not.
func TestUnknownTarget(t *testing.T) {
	logs := &testenv.Buffer{}
	s := New(engine.Inspect(), slog.New(slog.NewJSONHandler(logs, nil)), nil)
	ask := func(st discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient, node string, names ...string) {
		t.Helper()
		if err := st.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: node}, TypeUrl: TypeListener, ResourceNames: names}); err != nil {
			t.Fatal(err)
		}
	}
	unknown := func(node string) map[string]string {
		for _, c := range s.Clients() {
			if c.Node == node {
				out := map[string]string{}
				for _, u := range c.Unknown {
					out[u.Name] = u.Error
				}
				return out
			}
		}
		return nil
	}
	a := adsClientOf(t, s)
	rs := responses(a)
	ask(a, "a", "chains/model-to-endpoint/model1", "indexes/model-to-endpoints/model1", "nonsense", "chains/model-to-endpoints/model1")
	if recv(rs, 5*time.Second) == nil {
		t.Fatal("no response")
	}
	want := map[string]string{
		"chains/model-to-endpoint/model1":   `no chain "model-to-endpoint" (did you mean model-to-endpoints? xds:///chains/model-to-endpoints/KEY)`,
		"indexes/model-to-endpoints/model1": `no index "model-to-endpoints": it is one of the chains: xds:///chains/model-to-endpoints/KEY`,
		"nonsense":                          `"nonsense" is not a target: targets are xds:///chains/CHAIN/KEY and xds:///indexes/INDEX/KEY`,
	}
	testenv.Eventually(t, "the unknown targets in the status", func() string {
		got := unknown("a")
		if len(got) != len(want) {
			return "unknown: " + strings.Join(keysOf(got), ", ")
		}
		for name, why := range want {
			if got[name] != why {
				return name + ": " + got[name]
			}
		}
		return ""
	})
	// Another key of the same chain: listed, not logged again.
	ask(a, "a", "chains/model-to-endpoint/model1", "chains/model-to-endpoint/model2")
	testenv.Eventually(t, "the second key listed", func() string {
		if got := unknown("a"); len(got) != 2 || got["chains/model-to-endpoint/model2"] == "" {
			return "unknown: " + strings.Join(keysOf(got), ", ")
		}
		return ""
	})
	count := func() int { return strings.Count(logs.String(), `no chain \"model-to-endpoint\"`) }
	if n := count(); n != 1 {
		t.Errorf("logged %d times for one client:\n%s", n, logs)
	}
	if !strings.Contains(logs.String(), `"msg":"xDS client asked for an unknown index or chain`) || !strings.Contains(logs.String(), `"client":"a"`) {
		t.Errorf("the log does not say it, with the client:\n%s", logs)
	}

	// Another client: logged for it too.
	b := adsClientOf(t, s)
	rb := responses(b)
	ask(b, "b", "chains/model-to-endpoint/model1")
	recv(rb, 5*time.Second)
	testenv.Eventually(t, "the second client's log line", func() string {
		if n := count(); n != 2 {
			return fmt.Sprintf("logged %d times", n)
		}
		return ""
	})

	// The status route says it in JSON.
	rec := httptest.NewRecorder()
	s.StatusHandler()(rec, httptest.NewRequest("GET", "/v1/xds/clients", nil))
	var body struct {
		Clients []ClientStatus `json:"clients"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || !strings.Contains(rec.Body.String(), `"unknown":[{"name":"chains/model-to-endpoint/model1","error":"no chain`) {
		t.Errorf("status route: %v\n%s", err, rec.Body)
	}

	// Asked no more: no longer listed.
	ask(a, "a", "chains/model-to-endpoints/model1")
	testenv.Eventually(t, "nothing unknown", func() string {
		if got := unknown("a"); len(got) != 0 {
			return "unknown: " + strings.Join(keysOf(got), ", ")
		}
		return ""
	})
}

func keysOf(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestNackSeriesFromTheStart: metasync_xds_nacks_total has its four
// series at 0 before any NACK, so that an alert on its rate sees the
// first one.
func TestNackSeriesFromTheStart(t *testing.T) {
	reg := prometheus.NewRegistry()
	New(engine.Inspect(), slog.New(slog.NewTextHandler(io.Discard, nil)), reg)
	want := `
# HELP metasync_xds_nacks_total xDS responses that a client rejected, by resource type.
# TYPE metasync_xds_nacks_total counter
metasync_xds_nacks_total{type="cluster"} 0
metasync_xds_nacks_total{type="endpoint"} 0
metasync_xds_nacks_total{type="listener"} 0
metasync_xds_nacks_total{type="route"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "metasync_xds_nacks_total"); err != nil {
		t.Error(err)
	}
}
