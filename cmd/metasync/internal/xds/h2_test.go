package xds

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"
)

// rawClient is an HTTP/2 client of frames, for what a gRPC client never
// sends.
type rawClient struct {
	t   *testing.T
	c   net.Conn
	fr  *http2.Framer
	dec *hpack.Decoder
	// lenient: a write that fails (the server closed) is no failure.
	lenient bool
}

func dialRaw(t *testing.T, addr string, settings ...http2.Setting) *rawClient {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_, _ = c.Write([]byte(http2.ClientPreface))
	fr := http2.NewFramer(c, c)
	fr.MaxHeaderListSize = 1 << 20
	_ = fr.WriteSettings(settings...)
	return &rawClient{t: t, c: c, fr: fr, dec: hpack.NewDecoder(4096, nil)}
}

// headers opens stream id as a gRPC call of path, with the fields more.
func (r *rawClient) headers(id uint32, path string, endStream bool, more ...string) {
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	fields := []string{":method", "POST", ":scheme", "http", ":path", path, ":authority", "xds",
		"content-type", "application/grpc", "te", "trailers"}
	fields = append(fields, more...)
	for i := 0; i < len(fields); i += 2 {
		_ = enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true, EndStream: endStream}); err != nil && !r.lenient {
		r.t.Fatal(err)
	}
}

// message frames a DiscoveryRequest as a gRPC message.
func message(req *discoveryv3.DiscoveryRequest) []byte {
	b, _ := proto.Marshal(req)
	return append([]byte{0, byte(len(b) >> 24), byte(len(b) >> 16), byte(len(b) >> 8), byte(len(b))}, b...)
}

// event is what the server did that a test waits for.
type event struct {
	status string // grpc-status of trailers, or ":status" when not 200
	rst    http2.ErrCode
	goAway http2.ErrCode
	data   []byte
	closed bool
	id     uint32
}

// next reads frames (acknowledging settings, granting window for what
// it reads when grant) until one of interest.
func (r *rawClient) next(grant bool) event {
	r.t.Helper()
	_ = r.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		f, err := r.fr.ReadFrame()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "reset") {
				return event{closed: true}
			}
			r.t.Fatalf("reading: %v", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = r.fr.WriteSettingsAck()
			}
		case *http2.RSTStreamFrame:
			return event{rst: f.ErrCode, id: f.StreamID}
		case *http2.GoAwayFrame:
			return event{goAway: f.ErrCode}
		case *http2.DataFrame:
			if grant && len(f.Data()) > 0 {
				_ = r.fr.WriteWindowUpdate(0, uint32(len(f.Data())))
				_ = r.fr.WriteWindowUpdate(f.StreamID, uint32(len(f.Data())))
			}
			return event{data: append([]byte(nil), f.Data()...), id: f.StreamID}
		case *http2.HeadersFrame:
			fields, err := r.dec.DecodeFull(f.HeaderBlockFragment())
			if err != nil {
				r.t.Fatal(err)
			}
			for _, hf := range fields {
				if hf.Name == "grpc-status" || hf.Name == ":status" && hf.Value != "200" {
					return event{status: hf.Value, id: f.StreamID}
				}
			}
		}
	}
}

// TestRequestOverTheWindow: a request larger than the stream's window
// (64 KiB) is read whole: the window is given back as its parts come.
func TestRequestOverTheWindow(t *testing.T) {
	_, addr, _ := limitedServer(t, Limits{})
	r := dialRaw(t, addr)
	r.headers(1, adsPath, false)
	names := make([]string, 1000)
	for i := range names {
		names[i] = fmt.Sprintf("chains/model-to-endpoints/window-model-%04d-%s", i, strings.Repeat("x", 80))
	}
	m := message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: names})
	if len(m) <= h2Window {
		t.Fatalf("a request of %d bytes, not over the window", len(m))
	}
	// Sent as the window allows: what the client may send, it sends;
	// then it waits for the server's window updates.
	window := int64(h2Window)
	done := make(chan error, 1)
	updates := make(chan uint32, 64)
	go func() {
		for len(m) > 0 {
			for window == 0 {
				window += int64(<-updates)
			}
			n := min(int64(len(m)), window, 16384)
			if err := r.fr.WriteData(1, false, m[:n]); err != nil {
				done <- err
				return
			}
			m, window = m[n:], window-n
		}
		done <- nil
	}()
	_ = r.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		f, err := r.fr.ReadFrame()
		if err != nil {
			t.Fatalf("no response to a request over the window: %v", err)
		}
		switch f := f.(type) {
		case *http2.WindowUpdateFrame:
			if f.StreamID == 1 {
				updates <- f.Increment
			}
		case *http2.DataFrame:
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			return // the Listeners' response
		case *http2.HeadersFrame, *http2.RSTStreamFrame, *http2.GoAwayFrame:
			if _, ok := f.(*http2.HeadersFrame); ok {
				continue
			}
			t.Fatalf("the stream ended: %v", f)
		}
	}
}

// TestRequestsHeldByTheWindow: a client that sends requests and reads
// nothing fills its stream's window and no more: the server queues what
// the window holds, not what the client would send.
func TestRequestsHeldByTheWindow(t *testing.T) {
	s, addr, _ := limitedServer(t, Limits{})
	r := dialRaw(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	r.headers(1, adsPath, false)
	// The frames read in a goroutine of their own; the window updates
	// of stream 1 come here.
	updates := make(chan uint32, 1024)
	go func() {
		for {
			f, err := r.fr.ReadFrame()
			if err != nil {
				close(updates)
				return
			}
			if w, ok := f.(*http2.WindowUpdateFrame); ok && w.StreamID == 1 {
				updates <- w.Increment
			}
		}
	}()
	// Requests as the window allows, for a second: the first is
	// answered (its response waits on the client's window of 0), the
	// others wait, and hold their credit.
	window, sent, credit := int64(h2Window), 0, int64(0)
	deadline := time.Now().Add(time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		m := message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: []string{fmt.Sprintf("chains/model-to-endpoints/held-%d", i)}})
		for window < int64(len(m)) && time.Now().Before(deadline) {
			select {
			case inc, ok := <-updates:
				if !ok {
					t.Fatal("the connection ended")
				}
				window += int64(inc)
				credit += int64(inc)
			case <-time.After(50 * time.Millisecond):
			}
		}
		if window < int64(len(m)) {
			break
		}
		if err := r.fr.WriteData(1, false, m); err != nil {
			t.Fatal(err)
		}
		window -= int64(len(m))
		sent += len(m)
	}
	t.Logf("sent %d bytes of requests, %d given back", sent, credit)
	if credit > 1024 {
		t.Errorf("the server gave %d bytes of credit back to a client that reads nothing: its requests are not held", credit)
	}
	if cs := s.Clients(); len(cs) != 1 {
		t.Fatalf("%d clients, want 1", len(cs))
	}
}

// TestProtocolErrors: what breaks HTTP/2 ends the connection with a
// GOAWAY; what breaks a stream ends the stream; nothing else is held.
func TestProtocolErrors(t *testing.T) {
	s, addr, _ := limitedServer(t, Limits{})
	connectionErrors(t, addr)
	streamErrors(t, s, addr)
}

// connectionErrors: each error of HTTP/2 itself, sent to addr on a
// connection of its own, ends the connection with its GOAWAY.
func connectionErrors(t *testing.T, addr string) {
	goAway := func(what string, code http2.ErrCode, send func(r *rawClient)) {
		t.Run(what, func(t *testing.T) {
			r := dialRaw(t, addr)
			send(r)
			for {
				ev := r.next(false)
				if ev.closed {
					t.Fatalf("closed without a GOAWAY")
				}
				if ev.goAway != 0 || ev.rst == 0 && ev.status == "" && ev.data == nil {
					if ev.goAway != code {
						t.Errorf("GOAWAY %v, want %v", ev.goAway, code)
					}
					if ev := r.next(false); !ev.closed {
						t.Errorf("not closed after the GOAWAY: %+v", ev)
					}
					return
				}
			}
		})
	}
	goAway("a frame over 16 KiB", http2.ErrCodeFrameSize, func(r *rawClient) {
		_ = r.fr.WriteRawFrame(http2.FrameData, 0, 1, make([]byte, 20000))
	})
	goAway("HEADERS on an even stream", http2.ErrCodeProtocol, func(r *rawClient) { r.headers(2, adsPath, false) })
	goAway("DATA on a stream never opened", http2.ErrCodeProtocol, func(r *rawClient) { _ = r.fr.WriteData(5, false, []byte{0}) })
	goAway("CONTINUATION without HEADERS", http2.ErrCodeProtocol, func(r *rawClient) { _ = r.fr.WriteContinuation(1, true, []byte{0x88}) })
	goAway("a header block that does not decode", http2.ErrCodeCompression, func(r *rawClient) {
		_ = r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, EndHeaders: true})
	})
	goAway("CONTINUATION flood", http2.ErrCodeEnhanceYourCalm, func(r *rawClient) {
		_ = r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0x88}})
		for range 8 {
			_ = r.fr.WriteContinuation(1, false, make([]byte, 16000))
		}
	})
	goAway("a window over 2^31-1", http2.ErrCodeFlowControl, func(r *rawClient) {
		_ = r.fr.WriteWindowUpdate(0, 1<<31-1)
	})
	goAway("a bad SETTINGS_MAX_FRAME_SIZE", http2.ErrCodeProtocol, func(r *rawClient) {
		_ = r.fr.WriteSettings(http2.Setting{ID: http2.SettingMaxFrameSize, Val: 100})
	})
	t.Run("DATA beyond the stream's window", func(t *testing.T) {
		// The client reads nothing: its first request's response waits,
		// and the requests after it hold the window.
		r := dialRaw(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
		r.headers(1, adsPath, false)
		m := message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: []string{"chains/model-to-endpoints/beyond"}})
		var b []byte
		for len(b) < 7*16000 {
			b = append(b, m...)
		}
		for ; len(b) > 0; b = b[min(len(b), 16000):] {
			_ = r.fr.WriteData(1, false, b[:min(len(b), 16000)])
		}
		for {
			ev := r.next(false)
			if ev.closed {
				t.Fatal("closed without a GOAWAY")
			}
			if ev.goAway != 0 {
				if ev.goAway != http2.ErrCodeFlowControl {
					t.Errorf("GOAWAY %v, want FLOW_CONTROL_ERROR", ev.goAway)
				}
				return
			}
		}
	})
}

// streamErrors: what breaks a stream of s, at addr, ends the stream, not
// the connection; pings are answered, up to a bound.
func streamErrors(t *testing.T, s *Server, addr string) {
	t.Run("a fifth stream is refused", func(t *testing.T) {
		r := dialRaw(t, addr)
		for id := uint32(1); id <= 9; id += 2 {
			r.headers(id, adsPath, false)
		}
		for {
			ev := r.next(false)
			if ev.closed || ev.goAway != 0 {
				t.Fatalf("the connection ended: %+v", ev)
			}
			if ev.rst != 0 {
				if ev.id != 9 || ev.rst != http2.ErrCodeRefusedStream {
					t.Errorf("stream %d reset %v, want stream 9 REFUSED_STREAM", ev.id, ev.rst)
				}
				return
			}
		}
	})
	t.Run("not gRPC", func(t *testing.T) {
		r := dialRaw(t, addr)
		var hb bytes.Buffer
		enc := hpack.NewEncoder(&hb)
		for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":path", "/"}, {":authority", "xds"}} {
			_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		_ = r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true, EndStream: true})
		if ev := r.next(false); ev.status != "415" {
			t.Errorf("a GET: %+v, want :status 415", ev)
		}
	})
	t.Run("another method", func(t *testing.T) {
		r := dialRaw(t, addr)
		r.headers(1, "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources", false)
		if ev := r.next(false); ev.status != "12" {
			t.Errorf("another method: %+v, want grpc-status 12", ev)
		}
	})
	t.Run("a message not gRPC's", func(t *testing.T) {
		r := dialRaw(t, addr)
		r.headers(1, adsPath, false)
		_ = r.fr.WriteData(1, false, []byte{7, 0, 0, 0, 1, 0})
		if ev := r.next(false); ev.status != "3" {
			t.Errorf("a bad message: %+v, want grpc-status 3", ev)
		}
	})
	t.Run("a half-closed stream ends OK", func(t *testing.T) {
		r := dialRaw(t, addr)
		r.headers(1, adsPath, true)
		if ev := r.next(false); ev.status != "0" {
			t.Errorf("a stream the client ended: %+v, want grpc-status 0", ev)
		}
	})
	t.Run("a reset stream lets its client go", func(t *testing.T) {
		r := dialRaw(t, addr)
		r.headers(1, adsPath, false)
		_ = r.fr.WriteData(1, false, message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: []string{"chains/model-to-endpoints/rst"}}))
		if ev := r.next(true); ev.data == nil {
			t.Fatalf("no response: %+v", ev)
		}
		_ = r.fr.WriteRSTStream(1, http2.ErrCodeCancel)
		eventually(t, "the reset client gone", func() string {
			for _, c := range s.Clients() {
				if c.Types["listener"].Names != nil && c.Types["listener"].Names[0] == "chains/model-to-endpoints/rst" {
					return "still listed"
				}
			}
			return ""
		})
	})
	t.Run("pings are answered, a flood unread ends the connection", func(t *testing.T) {
		r := dialRaw(t, addr)
		_ = r.fr.WritePing(false, [8]byte{1, 2, 3})
		for {
			f, err := r.fr.ReadFrame()
			if err != nil {
				t.Fatal(err)
			}
			if p, ok := f.(*http2.PingFrame); ok {
				if !p.IsAck() || p.Data != [8]byte{1, 2, 3} {
					t.Errorf("ping answered %v", p)
				}
				break
			}
		}
		// Pings sent and never read: the answers wait, up to a bound.
		_ = r.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		var err error
		for i := 0; i < 2_000_000 && err == nil; i++ {
			err = r.fr.WritePing(false, [8]byte{})
		}
		if err == nil {
			t.Error("2,000,000 pings unread did not end the connection")
		}
	})
}

// TestOneGoroutinePerConnection: a connected client with its stream at
// rest costs the server one goroutine.
func TestOneGoroutinePerConnection(t *testing.T) {
	route(t, "rest-app", "rest-model", "10.7.0.11:80")
	_, addr, _ := limitedServer(t, Limits{})
	connect := func() {
		r := dialRaw(t, addr)
		r.headers(1, adsPath, false)
		_ = r.fr.WriteData(1, false, message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeEndpoint, ResourceNames: []string{"chains/model-to-endpoints/rest-model"}}))
		for {
			if ev := r.next(true); ev.data != nil {
				break
			} else if ev.closed || ev.rst != 0 || ev.goAway != 0 || ev.status != "" {
				t.Fatalf("no assignment: %+v", ev)
			}
		}
	}
	// The first client starts the assignment's entry, which the others
	// share.
	connect()
	settled := func(want int) int {
		var n int
		for range 50 {
			if n = runtime.NumGoroutine(); n <= want {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		return n
	}
	before := settled(0)
	const clients = 50
	for range clients {
		connect()
	}
	if n := settled(before+clients) - before; n > clients {
		t.Errorf("%d clients at rest hold %d goroutines, want %d", clients, n, clients)
	}
}
