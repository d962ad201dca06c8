package xds

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	gosync "sync"
	"testing"
	"time"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// fakeAccess is an Authorizer of the unit tests: tokens name users, and
// each user may read the access URLs it is granted. The real one
// (auth.TokenAuth.Check) is proven against the control plane in
// cmd/metasync.
type fakeAccess struct {
	mu      gosync.Mutex
	users   map[string]string          // token → user
	grants  map[string]map[string]bool // user → access URLs ("*": all)
	unsure  bool                       // every review fails (503)
	reviews int
}

func (f *fakeAccess) check(r *http.Request, thing string) (string, int, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reviews++
	token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	user, ok := f.users[token]
	if !ok {
		return "", http.StatusUnauthorized, "token not valid"
	}
	if thing == "" {
		return user, 0, ""
	}
	if f.unsure {
		return user, http.StatusServiceUnavailable, "review failed"
	}
	if g := f.grants[user]; g["*"] || g[thing] {
		return user, 0, ""
	}
	return user, http.StatusForbidden, user + " may not get " + thing
}

func (f *fakeAccess) set(fn func(f *fakeAccess)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// authedServer serves the tests' engine with access checked by f.
func authedServer(t *testing.T, f *fakeAccess) (*Server, string) {
	t.Helper()
	s := New(engine.Inspect(), slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	s.SetAuthorizer(f.check)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := s.Transport(nil)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return s, ln.Addr().String()
}

// tokenStream opens an ADS stream to addr that sends token ("" none).
func tokenStream(t *testing.T, addr, token string) discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return stream
}

// listenerNames are the Listeners a response holds.
func listenerNames(t *testing.T, r *discoveryv3.DiscoveryResponse) []string {
	t.Helper()
	var names []string
	for _, a := range r.GetResources() {
		l := &listenerv3.Listener{}
		if err := a.UnmarshalTo(l); err != nil {
			t.Fatal(err)
		}
		names = append(names, l.GetName())
	}
	return names
}

// TestAuthTokens: with an Authorizer, a stream without a valid token
// ends UNAUTHENTICATED before anything is sent; a client reads only the
// targets it is granted (the others have no Listener, and the status
// route names them); access not told (a failed review) holds the
// response back instead of saying the Listener does not exist; access
// taken away removes the Listener; a token that stops being valid ends
// the stream.
func TestAuthTokens(t *testing.T) {
	a, _ := backend(t)
	route(t, "auth-app", "auth-model", a)
	f := &fakeAccess{
		users:  map[string]string{"t-all": "all", "t-index": "index"},
		grants: map[string]map[string]bool{"all": {"*": true}, "index": {"/v1/indexes/model-to-app/*": true}},
	}
	old := recheckEvery
	recheckEvery = 100 * time.Millisecond
	t.Cleanup(func() { recheckEvery = old })
	s, addr := authedServer(t, f)
	chain, index := "chains/model-to-endpoints/auth-model", "indexes/model-to-app/auth-model"
	ask := func(st discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient) {
		t.Helper()
		if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: []string{chain, index}}); err != nil {
			t.Fatal(err)
		}
	}

	for name, token := range map[string]string{"no token": "", "a token not known": "t-nobody"} {
		st := tokenStream(t, addr, token)
		_ = st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: []string{chain}})
		if _, err := st.Recv(); status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s: %v, want UNAUTHENTICATED", name, err)
		}
	}

	limited := tokenStream(t, addr, "t-index")
	rs := responses(limited)
	ask(limited)
	r := recv(rs, 5*time.Second)
	if got := listenerNames(t, r); len(got) != 1 || got[0] != index {
		t.Fatalf("a client granted the index only: Listeners %v, want [%s]", got, index)
	}
	var found bool
	for _, c := range s.Clients() {
		if c.User == "index" {
			found = true
			if len(c.Denied) != 1 || c.Denied[0] != "/v1/chains/model-to-endpoints/*" {
				t.Errorf("status of the limited client: denied %v", c.Denied)
			}
		}
	}
	if !found {
		t.Errorf("status has no client of user index: %+v", s.Clients())
	}

	// Reviews fail: nothing is said until they answer again.
	f.set(func(f *fakeAccess) { f.unsure = true })
	full := tokenStream(t, addr, "t-all")
	frs := responses(full)
	ask(full)
	if r := recv(frs, 1500*time.Millisecond); r != nil {
		t.Fatalf("while access could not be told: %v, want no response", listenerNames(t, r))
	}
	f.set(func(f *fakeAccess) { f.unsure = false })
	r = recv(frs, 5*time.Second)
	if got := listenerNames(t, r); len(got) != 2 {
		t.Fatalf("once access is told: Listeners %v, want both", got)
	}

	// Access to the chain taken away: its Listener goes.
	f.set(func(f *fakeAccess) { f.grants["all"] = map[string]bool{"/v1/indexes/model-to-app/*": true} })
	r = recv(frs, 5*time.Second)
	if got := listenerNames(t, r); r == nil || len(got) != 1 || got[0] != index {
		t.Fatalf("after the chain's access went: Listeners %v, want [%s]", got, index)
	}
	// The token itself goes: the stream ends.
	f.set(func(f *fakeAccess) { delete(f.users, "t-all") })
	deadline := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-frs:
			if ok {
				continue
			}
		case <-deadline:
			t.Fatal("the stream of a token no longer valid goes on")
		}
		break
	}
	if _, err := full.Recv(); status.Code(err) != codes.Unauthenticated {
		t.Errorf("stream of a token no longer valid ended with %v, want UNAUTHENTICATED", err)
	}
}

// TestAuthDeniedCostsNothing: a client denied every target follows none
// (no engine subscription) however many names it asks for; made-up
// names cost no review; what it is denied is forgotten when it stops
// asking; a name longer than MaxNameLength ends the stream.
func TestAuthDeniedCostsNothing(t *testing.T) {
	f := &fakeAccess{users: map[string]string{"t-none": "none"}, grants: map[string]map[string]bool{}}
	s, addr := authedServer(t, f)
	st := tokenStream(t, addr, "t-none")
	rs := responses(st)
	open := engine.Inspect().Subscriptions().Open
	var names []string
	for i := range MaxNames {
		names = append(names, fmt.Sprintf("chains/model-to-endpoints/m%d", i))
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeEndpoint, ResourceNames: names}); err != nil {
		t.Fatal(err)
	}
	made := []string{}
	for i := range 500 {
		made = append(made, fmt.Sprintf("indexes/no-such-%d/k", i))
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: made}); err != nil {
		t.Fatal(err)
	}
	if r := recv(rs, 5*time.Second); r == nil || r.GetTypeUrl() != TypeListener || len(r.GetResources()) != 0 {
		t.Fatalf("Listeners of made-up indexes: %v", r)
	}
	if got := engine.Inspect().Subscriptions().Open - open; got != 0 {
		t.Errorf("a client denied everything holds %d engine subscriptions, want 0", got)
	}
	f.mu.Lock()
	reviews := f.reviews
	f.mu.Unlock()
	if reviews > 3 { // the stream's authentication, and one review of the chain
		t.Errorf("%d reviews for 1000 names of one chain and 500 made-up indexes, want at most 3", reviews)
	}
	denied := func() []string {
		for _, c := range s.Clients() {
			return c.Denied
		}
		return nil
	}
	if d := denied(); len(d) != 1 {
		t.Errorf("denied %v, want the chain's access once", d)
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeEndpoint, ResourceNames: []string{}}); err != nil {
		t.Fatal(err)
	}
	testenvEventually(t, func() bool { return len(denied()) == 0 })
	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: []string{"indexes/model-to-app/" + strings.Repeat("k", MaxNameLength)}}); err != nil {
		t.Fatal(err)
	}
	for range rs {
	}
	if _, err := st.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a name over MaxNameLength: %v, want INVALID_ARGUMENT", err)
	}
}

// testenvEventually waits up to 5 s for ok.
func testenvEventually(t *testing.T, ok func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("not within 5 s")
		}
	}
}
