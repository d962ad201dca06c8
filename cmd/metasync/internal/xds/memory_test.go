package xds

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"

	"github.com/iidp/metasync/test/testenv"
)

// lightFollower is an ADS client on a raw HTTP/2 connection, as light
// as a client can be: it asks for the assignment name, tells got when
// the first one came, and reads no more (its goroutine ends).
func lightFollower(b *testing.B, addr, name string, secure bool, got chan<- struct{}) net.Conn {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	if secure {
		tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
		if err := tc.Handshake(); err != nil {
			b.Fatal(err)
		}
		c = tc
	}
	_, _ = c.Write([]byte(http2.ClientPreface))
	fr := http2.NewFramer(c, c)
	_ = fr.WriteSettings()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", adsPath}, {":authority", addr},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
	req, _ := proto.Marshal(&discoveryv3.DiscoveryRequest{TypeUrl: TypeEndpoint, ResourceNames: []string{name}})
	_ = fr.WriteData(1, false, append([]byte{0, 0, 0, byte(len(req) >> 8), byte(len(req))}, req...))
	go func() {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
				_ = fr.WriteSettingsAck()
			}
			if _, ok := f.(*http2.DataFrame); ok {
				// Reading on would cost this process a goroutine a
				// client: the server's pushes wait in the socket's
				// buffers, which hold many.
				got <- struct{}{}
				return
			}
		}
	}()
	return c
}

// BenchmarkClientMemory: the heap and stack that 2,000 connected ADS
// clients (in this process, one stream each, following one assignment)
// hold, over their number: the server's cost of a client, and the light
// client's own heap (its framer and connection, under 2 KiB; over TLS,
// its TLS connection too). With XDS_HEAP_PROFILE=FILE it writes the heap
// profile with the clients connected, for go tool pprof
// -sample_index=inuse_space.
func BenchmarkClientMemory(b *testing.B) {
	for _, secure := range []bool{false, true} {
		b.Run(fmt.Sprintf("tls=%v", secure), func(b *testing.B) { benchClientMemory(b, secure) })
	}
}

func benchClientMemory(b *testing.B, secure bool) {
	const clients = 2000
	route(b, "mem-app", "mem-model", "10.7.0.9:80", "10.7.0.10:80")
	srv := New(engine.Inspect(), slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	srv.SetLimits(Limits{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var config *tls.Config
	if secure {
		config, _ = selfSigned(b)
	}
	tr := srv.Transport(config)
	go func() { _ = tr.Serve(srv.Listener(ln)) }()
	defer tr.Close()
	for b.Loop() {
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		g0 := runtime.NumGoroutine()
		got := make(chan struct{}, clients)
		var conns []net.Conn
		for range clients {
			conns = append(conns, lightFollower(b, ln.Addr().String(), "chains/model-to-endpoints/mem-model", secure, got))
		}
		for i := range clients {
			select {
			case <-got:
			case <-time.After(30 * time.Second):
				b.Fatalf("%d of %d clients got an assignment", i, clients)
			}
		}
		// A collection shrinks a stack at most by half: five let each
		// stack come down to what its goroutine uses at rest.
		for range 5 {
			runtime.GC()
		}
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/clients, "heap-B/client")
		b.ReportMetric(float64(after.StackInuse-before.StackInuse)/clients, "stack-B/client")
		b.ReportMetric(float64(runtime.NumGoroutine()-g0)/clients, "goroutines/client")
		if file := os.Getenv("XDS_HEAP_PROFILE"); file != "" {
			f, err := os.Create(file)
			if err != nil {
				b.Fatal(err)
			}
			_ = pprof.Lookup("heap").WriteTo(f, 0)
			f.Close()
		}
		for _, c := range conns {
			c.Close()
		}
	}
}

// selfSigned is a server TLS config of a certificate for localhost,
// 127.0.0.1 and xds, and the pool of its CA.
func selfSigned(t testing.TB) (*tls.Config, *x509.CertPool) {
	ca := testenv.NewCA(t, "xds-test-ca")
	certPEM, keyPEM, _ := ca.Issue(t, "localhost", "127.0.0.1", "xds")
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM)
	return &tls.Config{Certificates: []tls.Certificate{cert}}, pool
}

// BenchmarkHeaderBlockFlood: 2,048 connections, each holding a header
// block of 60 KiB begun and never ended: the heap they hold together
// (header-blocks-MiB), bounded by h2MaxBlockBytes (64 MiB) whatever
// their number, and how many of them were cut for it.
func BenchmarkHeaderBlockFlood(b *testing.B) {
	const conns = 2048
	srv := New(engine.Inspect(), slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	srv.SetLimits(Limits{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	tr := srv.Transport(nil)
	go func() { _ = tr.Serve(srv.Listener(ln)) }()
	defer tr.Close()
	for b.Loop() {
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		var cs []net.Conn
		block := make([]byte, 15000)
		for range conns {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			cs = append(cs, c)
			fr := http2.NewFramer(c, c)
			_, _ = c.Write([]byte(http2.ClientPreface))
			_ = fr.WriteSettings()
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block})
			for range 3 {
				_ = fr.WriteContinuation(1, false, block)
			}
		}
		time.Sleep(time.Second) // read by the server
		held := tr.blockBytes.Load()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		for _, c := range cs {
			c.Close()
		}
		b.ReportMetric(float64(held)/(1<<20), "header-blocks-MiB")
		b.ReportMetric(float64(int64(after.HeapInuse)-int64(before.HeapInuse))/(1<<20), "heap-MiB")
	}
}
