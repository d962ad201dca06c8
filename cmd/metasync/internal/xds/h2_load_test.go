package xds

// The server's HTTP/2 under real clients and large responses: how it
// writes, and grpc-go under load.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"golang.org/x/net/http2"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// countingListener counts the writes to its connections.
type countingListener struct {
	net.Listener
	writes, bytes atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{c, l}, nil
}

type countingConn struct {
	net.Conn
	l *countingListener
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.l.writes.Add(1)
	c.l.bytes.Add(int64(len(b)))
	return c.Conn.Write(b)
}

// TestTLSWrites: over TLS, grpc-go's client gets its answers; the writes
// each response costs are counted.
func TestTLSWrites(t *testing.T) {
	names := make([]string, 400)
	for i := range names {
		names[i] = fmt.Sprintf("chains/model-to-endpoints/tls-%04d-%s", i, strings.Repeat("x", 60))
	}
	for _, useTLS := range []bool{false, true} {
		t.Run(fmt.Sprint("tls=", useTLS), func(t *testing.T) {
			s := New(engine.Inspect(), slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			cl := &countingListener{Listener: ln}
			creds := insecure.NewCredentials()
			var cfg *tls.Config
			if useTLS {
				var pool *x509.CertPool
				cfg, pool = selfSigned(t)
				creds = credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "localhost"})
			}
			srv := s.Transport(cfg)
			go func() { _ = srv.Serve(s.Listener(cl)) }()
			t.Cleanup(func() { srv.Close() })
			conn, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithTransportCredentials(creds))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: names[:1]}); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Recv(); err != nil {
				t.Fatal(err)
			}
			w0, b0 := cl.writes.Load(), cl.bytes.Load()
			if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: names, ResponseNonce: "1", VersionInfo: "1"}); err != nil {
				t.Fatal(err)
			}
			resp, err := st.Recv()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("a response of %d Listeners (%d bytes on the wire): %d writes to the socket", len(resp.Resources), cl.bytes.Load()-b0, cl.writes.Load()-w0)
		})
	}
}

// TestWritesPerFrame: a response through s.Listener, read by a raw
// client (run under strace to count the server's write(2)s).
func TestWritesPerFrame(t *testing.T) {
	_, addr, _ := limitedServer(t, Limits{})
	names := make([]string, 400)
	for i := range names {
		names[i] = fmt.Sprintf("chains/model-to-endpoints/wpf-%04d-%s", i, strings.Repeat("x", 60))
	}
	r := dialRaw(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30})
	_ = r.fr.WriteWindowUpdate(0, 1<<30)
	r.headers(1, adsPath, false)
	m := message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: names})
	for ; len(m) > 0; m = m[min(len(m), 16384):] {
		_ = r.fr.WriteData(1, false, m[:min(len(m), 16384)])
	}
	got := 0
	for got < 190000 {
		ev := r.next(false)
		if ev.data == nil {
			t.Fatalf("%+v", ev)
		}
		got += len(ev.data)
	}
	t.Logf("%d bytes", got)
}

// TestBigResponsesToGRPCGo: grpc-go (its BDP window growth, and a fixed
// small window) gets responses of megabytes, pushed back to back.
func TestBigResponsesToGRPCGo(t *testing.T) {
	_, addr, _ := limitedServer(t, Limits{})
	names := make([]string, 1000)
	for i := range names {
		names[i] = fmt.Sprintf("chains/model-to-endpoints/big-%04d-%s", i, strings.Repeat("y", 980))
	}
	for _, opts := range [][]grpc.DialOption{nil, {grpc.WithInitialWindowSize(1 << 16), grpc.WithInitialConnWindowSize(1 << 16)}} {
		conn, err := grpc.NewClient("passthrough:///"+addr, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))...)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		// Two requests before any read: the second comes whole while the
		// first's response waits (a third would wait on the client's
		// read of that response, which this client makes after its
		// sends: a client that sends and reads in turn, as a bidi
		// stream's client does, reads first).
		for _, typ := range []string{TypeListener, TypeCluster} {
			if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: typ, ResourceNames: names}); err != nil {
				t.Fatal(err)
			}
		}
		size := 0
		for i := range 2 + 1 { // LDS, CDS: one response each; RDS: one per name
			if i == 1 {
				if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeRoute, ResourceNames: names}); err != nil {
					t.Fatal(err)
				}
			}
			r, err := st.Recv()
			if err != nil {
				t.Fatalf("after %v: %v", time.Since(start), err)
			}
			size += proto.Size(r)
			time.Sleep(200 * time.Millisecond) // reads slowly
			_ = st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: r.TypeUrl, ResourceNames: names, VersionInfo: r.VersionInfo, ResponseNonce: r.Nonce})
		}
		t.Logf("%d bytes in %v", size, time.Since(start))
		cancel()
		conn.Close()
	}
}

// TestGRPCGoStress: grpc-go clients subscribe to large name sets
// (1000 names of ~1 KB), re-subscribe rapidly, ACK and NACK, cancel
// streams mid-response, while the engine changes; every subscription
// is answered, no stream fails but by the client's cancel, and the
// server lets go of everything after.
func TestGRPCGoStress(t *testing.T) {
	s, addr, _ := limitedServer(t, Limits{})
	models := []string{"st-m0", "st-m1", "st-m2"}
	for i, m := range models {
		route(t, "st-app"+fmt.Sprint(i), m, fmt.Sprintf("10.9.0.%d:80", i+1))
	}
	stop := make(chan struct{})
	var engineChanges atomic.Int64
	go func() { // the engine changes
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(30 * time.Millisecond):
			}
			m := i % len(models)
			var addrs []string
			for j := 0; j <= i%3; j++ {
				addrs = append(addrs, fmt.Sprintf("10.9.%d.%d:80", i%200, j+1))
			}
			route(t, "st-app"+fmt.Sprint(m), models[m], addrs...)
			engineChanges.Add(1)
		}
	}()
	budget := durationEnv("XDS_STRESS_FOR", 5*time.Second)
	deadline := time.Now().Add(budget)
	var wg sync.WaitGroup
	var streams, responses, canceled atomic.Int64
	errs := make(chan string, 100)
	for cl := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
			if err != nil {
				errs <- err.Error()
				return
			}
			defer conn.Close()
			rng := rand.New(rand.NewSource(int64(cl)))
			for it := 0; time.Now().Before(deadline); it++ {
				streams.Add(1)
				if why := stressStream(rng, conn, cl, it, models, &responses, &canceled); why != "" {
					select {
					case errs <- why:
					default:
					}
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	close(errs)
	n := 0
	for e := range errs {
		if n++; n <= 10 {
			t.Error(e)
		}
	}
	t.Logf("%d streams, %d responses, %d cancelled mid-way, %d engine changes", streams.Load(), responses.Load(), canceled.Load(), engineChanges.Load())
	eventually(t, "the server lets go of the clients", func() string { return serverState(s) })
}

func stressStream(rng *rand.Rand, conn *grpc.ClientConn, cl, it int, models []string, responses, canceled *atomic.Int64) string {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return fmt.Sprintf("client %d stream %d: %v", cl, it, err)
	}
	var mu sync.Mutex
	subs := map[string][]string{}
	got := map[string]int{} // responses per type
	want := map[string]int{}
	recvErr := make(chan error, 1)
	sendMu := sync.Mutex{}
	closedSend := false
	send := func(r *discoveryv3.DiscoveryRequest) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		if closedSend {
			return nil
		}
		return st.Send(r)
	}
	go func() {
		for {
			r, err := st.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			responses.Add(1)
			mu.Lock()
			got[r.TypeUrl]++
			names := subs[r.TypeUrl]
			mu.Unlock()
			ack := &discoveryv3.DiscoveryRequest{TypeUrl: r.TypeUrl, ResourceNames: names, VersionInfo: r.VersionInfo, ResponseNonce: r.Nonce}
			if rng := rand.Intn(4); rng == 0 { // NACK
				ack.VersionInfo = ""
				ack.ErrorDetail = &rpcstatus.Status{Code: 3, Message: "no thanks"}
			}
			if err := send(ack); err != nil {
				recvErr <- err
				return
			}
		}
	}()
	types := []string{TypeListener, TypeCluster, TypeRoute, TypeEndpoint}
	steps := 1 + rng.Intn(6)
	cancelAt := -1
	if rng.Intn(3) == 0 {
		cancelAt = rng.Intn(steps)
	}
	for step := range steps {
		typ := types[rng.Intn(len(types))]
		names := stressNames(rng, typ, models, fmt.Sprintf("s%d-%d-%d", cl, it, step))
		mu.Lock()
		subs[typ] = names
		want[typ] = got[typ] + 1
		mu.Unlock()
		if err := send(&discoveryv3.DiscoveryRequest{TypeUrl: typ, ResourceNames: names}); err != nil {
			return fmt.Sprintf("client %d stream %d step %d: send: %v", cl, it, step, err)
		}
		if step == cancelAt {
			time.Sleep(time.Duration(rng.Intn(20)) * time.Millisecond)
			cancel()
			canceled.Add(1)
			<-recvErr
			return ""
		}
		// The subscription is answered within 10 s (EDS of an unknown
		// model aside: none here).
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			ok := got[typ] >= want[typ]
			mu.Unlock()
			if ok {
				break
			}
			select {
			case err := <-recvErr:
				return fmt.Sprintf("client %d stream %d step %d (%s): %v", cl, it, step, typ, err)
			case <-time.After(5 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				return fmt.Sprintf("client %d stream %d step %d: no %s response in 10 s", cl, it, step, typ)
			}
		}
	}
	sendMu.Lock()
	closedSend = true
	_ = st.CloseSend()
	sendMu.Unlock()
	select {
	case err := <-recvErr:
		if err != io.EOF {
			return fmt.Sprintf("client %d stream %d: ended %v", cl, it, err)
		}
	case <-time.After(10 * time.Second):
		return fmt.Sprintf("client %d stream %d: no end after CloseSend", cl, it)
	}
	return ""
}

// stressNames are the names a stress stream subscribes to, of type typ:
// chains of some of models for endpoints, else names that start with
// prefix, many or a few; cluster and assignment names are the targets'
// cluster names.
func stressNames(rng *rand.Rand, typ string, models []string, prefix string) []string {
	var names []string
	switch {
	case typ == TypeEndpoint:
		for _, m := range models {
			if rng.Intn(2) == 0 {
				names = append(names, "chains/model-to-endpoints/"+m)
			}
		}
		if len(names) == 0 {
			names = []string{"chains/model-to-endpoints/" + models[0]}
		}
	case rng.Intn(2) == 0:
		names = bigNames(prefix, 1000, 980)
	default:
		names = bigNames(prefix, 1+rng.Intn(20), rng.Intn(100))
	}
	if typ == TypeEndpoint || typ == TypeCluster {
		// Cluster and assignment names are the targets' cluster names.
		for i, n := range names {
			tg, _ := parseTarget(n)
			names[i] = tg.clusterName()
		}
	}
	return names
}
