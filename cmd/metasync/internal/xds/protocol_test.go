package xds

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/genproto/googleapis/rpc/status"
)

// The ADS protocol's tests over the seam, with a stream in memory
// (memStream): no HTTP/2, no gRPC.

// statusOf is the gRPC status that err ends a stream with (0 for none).
func statusOf(err error) (int, string) {
	var se *statusError
	if errors.As(err, &se) {
		return se.code, se.message
	}
	if err != nil {
		return codeInternal, err.Error()
	}
	return codeOK, ""
}

// clientOf is the status of the connected client of node, or false.
func clientOf(s *Server, node string) (ClientStatus, bool) {
	for _, c := range s.Clients() {
		if c.Node == node {
			return c, true
		}
	}
	return ClientStatus{}, false
}

// endpointsIn is the number of endpoints of the one assignment of r, or
// -1.
func endpointsIn(r *discoveryv3.DiscoveryResponse) int {
	cla := &endpointv3.ClusterLoadAssignment{}
	if r == nil || len(r.GetResources()) != 1 || r.GetResources()[0].UnmarshalTo(cla) != nil || len(cla.GetEndpoints()) == 0 {
		return -1
	}
	return len(cla.GetEndpoints()[0].GetLbEndpoints())
}

// TestProtocolOverSeam: a stream in memory asks for the four types of a
// target (and the Listener of an unknown one), ACKs, NACKs an
// assignment (kept, shown, not sent again), gets the push of a change,
// lets a Listener go, and ends: each response counted once written.
func TestProtocolOverSeam(t *testing.T) {
	route(t, "seam-app", "seam-model", "10.9.0.1:80")
	node := &corev3.Node{Id: "seam-node"}
	known := "chains/model-to-endpoints/seam-model"
	listeners := testutil.ToFloat64(xdsSrv.pushes.WithLabelValues("listener"))
	m := openMem(t, xdsSrv, Peer{Addr: "192.0.2.1:5000"})
	ask := func(typeURL string, nonce string, names ...string) *discoveryv3.DiscoveryResponse {
		t.Helper()
		m.send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: typeURL, ResourceNames: names, ResponseNonce: nonce})
		if nonce != "" {
			if r := m.recv(300 * time.Millisecond); r != nil {
				t.Fatalf("an ACK of %s answered: %v", typeNames[typeURL], r)
			}
			return nil
		}
		r := m.recv(5 * time.Second)
		if r == nil || r.GetTypeUrl() != typeURL {
			t.Fatalf("%s %v: %v", typeNames[typeURL], names, r)
		}
		return r
	}
	r := ask(TypeListener, "", known, "chains/nope/k")
	if len(r.GetResources()) != 1 || r.GetVersionInfo() != "1" || r.GetNonce() != "1" {
		t.Fatalf("listeners: %v", r)
	}
	ask(TypeListener, "1", known, "chains/nope/k")
	for _, typeURL := range []string{TypeRoute, TypeCluster} {
		if r = ask(typeURL, "", known); len(r.GetResources()) != 1 {
			t.Fatalf("%s: %v", typeNames[typeURL], r)
		}
		ask(typeURL, r.GetNonce(), known)
	}
	if r = ask(TypeEndpoint, "", known); endpointsIn(r) != 1 {
		t.Fatalf("assignment: %v", r)
	}
	m.send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: TypeEndpoint, ResourceNames: []string{known}, ResponseNonce: r.GetNonce(),
		ErrorDetail: &status.Status{Code: 3, Message: "rejected on purpose"}})
	if again := m.recv(300 * time.Millisecond); again != nil {
		t.Fatalf("the rejected assignment was sent again: %v", again)
	}
	eventually(t, "the NACK shown", func() string {
		if c, _ := clientOf(xdsSrv, "seam-node"); c.Types["endpoint"].Rejected != r.GetNonce() || c.Types["endpoint"].Why != "rejected on purpose" {
			return "not shown"
		}
		return ""
	})
	route(t, "seam-app", "seam-model", "10.9.0.1:80", "10.9.0.2:80")
	if r = m.recv(5 * time.Second); endpointsIn(r) != 2 {
		t.Fatalf("the push of a change: %v", r)
	}
	if r = ask(TypeListener, ""); len(r.GetResources()) != 0 || r.GetNonce() != "2" {
		t.Fatalf("no Listener asked for: %v", r)
	}
	if n := testutil.ToFloat64(xdsSrv.pushes.WithLabelValues("listener")) - listeners; n != 2 {
		t.Errorf("%v Listener responses counted, want 2", n)
	}
	m.close()
	if done, err := m.ended(5 * time.Second); !done || err != nil {
		t.Fatalf("the stream the client ended: ended %v, %v", done, err)
	}
	if _, ok := clientOf(xdsSrv, "seam-node"); ok {
		t.Error("the client is still shown once its stream ended")
	}
}

// TestProtocolRefusals: the protocol ends a stream with the status a
// transport writes: a request that does not decode, a name too long, no
// request in time, a caller without a valid token (told at the open,
// before anything is sent, from the Peer's authorization).
func TestProtocolRefusals(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ends := func(t *testing.T, m *memStream, code int, about string) {
		t.Helper()
		done, err := m.ended(5 * time.Second)
		if got, msg := statusOf(err); !done || got != code || !strings.Contains(msg, about) {
			t.Errorf("ended %v with %d %q, want %d about %q", done, got, msg, code, about)
		}
	}
	t.Run("undecodable", func(t *testing.T) {
		m := openMem(t, xdsSrv, Peer{Addr: "192.0.2.1:5000"})
		m.raw([]byte{0x0a, 0x7f})
		ends(t, m, codeInvalid, "")
	})
	t.Run("name too long", func(t *testing.T) {
		m := openMem(t, xdsSrv, Peer{Addr: "192.0.2.1:5000"})
		m.send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: []string{strings.Repeat("x", MaxNameLength+1)}})
		ends(t, m, codeInvalid, "over")
	})
	t.Run("no first request", func(t *testing.T) {
		s := New(engine.Inspect(), quiet, nil)
		l := DefaultLimits()
		l.FirstRequest = 50 * time.Millisecond
		s.SetLimits(l)
		m := openMem(t, s, Peer{Addr: "192.0.2.1:5000"})
		ends(t, m, codeDeadlineExceeded, "no DiscoveryRequest")
	})
	t.Run("token", func(t *testing.T) {
		s := New(engine.Inspect(), quiet, nil)
		var remote string
		s.SetAuthorizer(func(r *http.Request, thing string) (string, int, string) {
			remote = r.RemoteAddr
			if r.Header.Get("Authorization") != "Bearer good" {
				return "", http.StatusUnauthorized, "no valid token"
			}
			return "someone", 0, ""
		})
		refused := openMem(t, s, Peer{Addr: "192.0.2.7:5000", Authorization: "Bearer bad"})
		ends(t, refused, codeUnauthenticated, "no valid token")
		if remote != "192.0.2.7:5000" {
			t.Errorf("the Authorizer saw the caller at %q", remote)
		}
		ok := openMem(t, s, Peer{Addr: "192.0.2.7:5000", Authorization: "Bearer good"})
		ok.send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: []string{"chains/model-to-endpoints/seam-model"}})
		if r := ok.recv(5 * time.Second); r == nil {
			t.Fatal("the caller with a valid token is not answered")
		}
		if c := s.Clients(); len(c) != 1 || c[0].User != "someone" {
			t.Errorf("clients %v, want one of someone", c)
		}
	})
}
