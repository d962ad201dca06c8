package xds

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Attacks on the server's HTTP/2 found in review, each kept as a test.

// block is the HPACK encoding of fields (name, value, ...).
func block(fields ...string) []byte {
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for i := 0; i < len(fields); i += 2 {
		_ = enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return hb.Bytes()
}

// frames reads the frames that come within d, each as a short string
// ("RST:1:PROTOCOL_ERROR", "GOAWAY:PROTOCOL_ERROR", "HEADERS:1", ...),
// acknowledging settings, until one that holds until ("": none).
func frames(r *rawClient, d time.Duration, until string) []string {
	var out []string
	_ = r.c.SetReadDeadline(time.Now().Add(d))
	for {
		if until != "" && len(out) > 0 && strings.Contains(out[len(out)-1], until) {
			return out
		}
		f, err := r.fr.ReadFrame()
		if err != nil {
			return out
		}
		id := f.Header().StreamID
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = r.fr.WriteSettingsAck()
			}
		case *http2.RSTStreamFrame:
			out = append(out, "RST:"+itoa(id)+":"+f.ErrCode.String())
		case *http2.GoAwayFrame:
			out = append(out, "GOAWAY:"+f.ErrCode.String())
		case *http2.HeadersFrame:
			out = append(out, "HEADERS:"+itoa(id))
		case *http2.DataFrame:
			out = append(out, "DATA:"+itoa(id))
		}
	}
}

func itoa(v uint32) string {
	if v >= 10 {
		return itoa(v/10) + string(rune('0'+v%10))
	}
	return string(rune('0' + v))
}

// TestMalformedRequests: each malformed request has its stream reset
// PROTOCOL_ERROR (RFC 9113 §8.1.1), whatever the way it is written.
func TestMalformedRequests(t *testing.T) {
	_, _, addr := transportServer(t, Limits{})
	base := []string{":method", "POST", ":scheme", "http", ":path", adsPath, ":authority", "xds", "content-type", "application/grpc"}
	with := func(more ...string) []string { return append(append([]string{}, base...), more...) }
	for name, fields := range map[string][]string{
		"uppercase name":             with("X-Foo", "a"),
		"content-length +5":          with("content-length", "+5"),
		"content-length 0x5":         with("content-length", "0x5"),
		"content-length huge":        with("content-length", "99999999999999999999999"),
		"two content-length":         with("content-length", "1", "content-length", "2"),
		"empty name":                 with("", "x"),
		"NUL in a value":             with("x-a", "a\x00b"),
		"whitespace first":           with("x-a", " a"),
		"whitespace last":            with("x-a", "a\t"),
		"te gzip":                    with("te", "gzip"),
		"connection":                 with("connection", "close"),
		"two authorization":          with("authorization", "Bearer a", "authorization", "Bearer b"),
		"two :path":                  append([]string{":path", "/x"}, base...),
		":protocol":                  append([]string{":protocol", "websocket"}, base...),
		":status":                    append([]string{":status", "200"}, base...),
		"pseudo after regular":       with(":authority", "again"),
		"empty :method":              {":method", "", ":scheme", "http", ":path", adsPath, ":authority", "x"},
		"empty :scheme":              {":method", "POST", ":scheme", "", ":path", adsPath, ":authority", "x"},
		"empty :path":                {":method", "POST", ":scheme", "http", ":path", "", ":authority", "x"},
		"no :method":                 {":scheme", "http", ":path", adsPath, ":authority", "x"},
		"content-length, no body":    with("content-length", "3"),
		"CONNECT with :path":         {":method", "CONNECT", ":authority", "x:1", ":path", "/"},
		"a value with a line feed":   with("x-a", "a\nb"),
		"a name with a space in it":  with("x a", "b"),
		"a :method with a space":     {":method", "PO ST", ":scheme", "http", ":path", adsPath, ":authority", "x"},
		"an :authority twice":        {":method", "POST", ":scheme", "http", ":path", adsPath, ":authority", "x", ":authority", "y"},
		"a second :scheme, in order": {":method", "POST", ":scheme", "http", ":scheme", "https", ":path", adsPath},
	} {
		r := dialRaw(t, addr)
		r.lenient = true
		_ = r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, EndHeaders: true, EndStream: true, BlockFragment: block(fields...)})
		if got := frames(r, 2*time.Second, "RST:1:"); !strings.Contains(strings.Join(got, " "), "RST:1:PROTOCOL_ERROR") {
			t.Errorf("%s: %v, want RST_STREAM PROTOCOL_ERROR", name, got)
		}
		r.c.Close()
	}
	// Two authorization fields, one in the HEADERS and one in its
	// CONTINUATION.
	r := dialRaw(t, addr)
	r.lenient = true
	b := block(append(append([]string{}, base...), "authorization", "Bearer a", "authorization", "Bearer b")...)
	_ = r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: b[:len(b)-5]})
	_ = r.fr.WriteContinuation(1, true, b[len(b)-5:])
	if got := frames(r, 2*time.Second, "RST:1:"); !strings.Contains(strings.Join(got, " "), "RST:1:PROTOCOL_ERROR") {
		t.Errorf("authorization twice across a CONTINUATION: %v, want RST_STREAM PROTOCOL_ERROR", got)
	}
	// Trailers: a pseudo-header in them, trailers without END_STREAM, a
	// body shorter than its content-length.
	r = dialRaw(t, addr)
	r.lenient = true
	_ = r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, EndHeaders: true, BlockFragment: block(base...)})
	_ = r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, EndHeaders: true, EndStream: true, BlockFragment: block(":status", "200")})
	_ = r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, EndHeaders: true, BlockFragment: block(base...)})
	_ = r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, EndHeaders: true, BlockFragment: block("x-t", "1")})
	_ = r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 5, EndHeaders: true, BlockFragment: block(append(append([]string{}, base...), "content-length", "3")...)})
	_ = r.fr.WriteData(5, false, []byte("ab"))
	_ = r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 5, EndHeaders: true, EndStream: true, BlockFragment: block("x-t", "1")})
	got := strings.Join(frames(r, 2*time.Second, "RST:5:"), " ")
	for _, want := range []string{"RST:1:PROTOCOL_ERROR", "RST:3:PROTOCOL_ERROR", "RST:5:PROTOCOL_ERROR"} {
		if !strings.Contains(got, want) {
			t.Errorf("bad trailers: %s, want %s", got, want)
		}
	}
}

// TestLowerStreamID: HEADERS on an id below one the client opened is an
// unexpected stream id: a connection error of PROTOCOL_ERROR (§5.1.1).
func TestLowerStreamID(t *testing.T) {
	_, _, addr := transportServer(t, Limits{})
	r := dialRaw(t, addr)
	r.lenient = true
	get := block(":method", "GET", ":scheme", "http", ":path", "/", ":authority", "x")
	_ = r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 5, EndHeaders: true, EndStream: true, BlockFragment: get})
	_ = r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, EndHeaders: true, EndStream: true, BlockFragment: get})
	if got := frames(r, 3*time.Second, "GOAWAY"); !strings.Contains(strings.Join(got, " "), "GOAWAY:PROTOCOL_ERROR") {
		t.Errorf("HEADERS on stream 3 after 5: %v, want GOAWAY PROTOCOL_ERROR", got)
	}
}

// TestDataOnClosedStream: DATA on a stream closed both ways is answered
// STREAM_CLOSED every time, however soon it follows the server's end of
// the stream.
func TestDataOnClosedStream(t *testing.T) {
	_, _, addr := transportServer(t, Limits{})
	get := block(":method", "GET", ":scheme", "http", ":path", "/", ":authority", "x")
	silent := 0
	for range 100 {
		r := dialRaw(t, addr)
		r.lenient = true
		_ = r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, EndHeaders: true, EndStream: true, BlockFragment: get})
		_ = r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		for {
			f, err := r.fr.ReadFrame()
			if err != nil {
				t.Fatal(err)
			}
			if d, ok := f.(*http2.DataFrame); ok && d.StreamEnded() {
				break
			}
		}
		_ = r.fr.WriteData(1, true, []byte("x"))
		if got := strings.Join(frames(r, 2*time.Second, "STREAM_CLOSED"), " "); !strings.Contains(got, "STREAM_CLOSED") {
			silent++
		}
		r.c.Close()
	}
	if silent > 0 {
		t.Errorf("DATA on a closed stream went unanswered %d times of 100", silent)
	}
}

// TestShutdownWithClientsThatDoNotRead: Shutdown returns about when its
// context ends, though every connection's writes wait on a client that
// does not read.
func TestShutdownWithClientsThatDoNotRead(t *testing.T) {
	_, tr, addr := transportServer(t, Limits{})
	get := block(":method", "GET", ":scheme", "http", ":path", "/", ":authority", "x")
	const n = 6
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.(*net.TCPConn).SetReadBuffer(4096)
		t.Cleanup(func() { c.Close() })
		fr := http2.NewFramer(c, c)
		_, _ = c.Write([]byte(http2.ClientPreface))
		_ = fr.WriteSettings()
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, EndHeaders: true, EndStream: true, BlockFragment: get})
		// Empty DATA on the closed stream, each answered with a
		// RST_STREAM the client never reads, until the server's writes
		// wait.
		batch := bytes.Repeat([]byte{0, 0, 0, 0, 0, 0, 0, 0, 1}, 100)
		_ = c.SetWriteDeadline(time.Now().Add(3 * time.Second))
		for range 3000 {
			if _, err := c.Write(batch); err != nil {
				break
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	_ = tr.Shutdown(ctx)
	if took := time.Since(start); took > 3*time.Second { // 500 ms, a second's GOAWAY, and load
		t.Errorf("Shutdown with a context of 500 ms and %d clients that do not read took %v", n, took)
	}
}

// TestPingBudgetNotEarnedBySmallFrames: a client that makes the server
// write DATA a byte at a time (a window of 1) earns no PINGs by it.
func TestPingBudgetNotEarnedBySmallFrames(t *testing.T) {
	_, _, addr := transportServer(t, Limits{})
	r := dialRaw(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1})
	r.lenient = true
	goAway := make(chan http2.ErrCode, 1)
	data := make(chan bool, 1000)
	go func() {
		defer close(goAway)
		_ = r.c.SetReadDeadline(time.Now().Add(20 * time.Second))
		for {
			f, err := r.fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.DataFrame:
				data <- f.StreamEnded()
			case *http2.GoAwayFrame:
				goAway <- f.ErrCode
				return
			}
		}
	}()
	get := block(":method", "GET", ":scheme", "http", ":path", "/", ":authority", "x")
	pings := 0
sending:
	for id := uint32(1); pings < 5000; id += 2 {
		if r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, EndStream: true, BlockFragment: get}) != nil {
			break
		}
		for ended := false; !ended; {
			_ = r.fr.WriteWindowUpdate(id, 1)
			select {
			case ended = <-data:
			case <-time.After(2 * time.Second):
				break sending
			}
			if r.fr.WritePing(false, [8]byte{byte(pings)}) != nil {
				break sending
			}
			pings++
		}
	}
	r.c.Close()
	if code := <-goAway; code != http2.ErrCodeEnhanceYourCalm {
		t.Errorf("%d PINGs, each after a DATA frame of a byte, ended with GOAWAY %v, want ENHANCE_YOUR_CALM", pings, code)
	}
	t.Logf("cut after %d PINGs", pings)
}

// TestHeadRequest: a HEAD request that is not gRPC's gets its 415 without
// a body (RFC 9110 §9.3.2), its headers ending the stream.
func TestHeadRequest(t *testing.T) {
	_, _, addr := transportServer(t, Limits{})
	r := dialRaw(t, addr)
	head := block(":method", "HEAD", ":scheme", "http", ":path", "/", ":authority", "x")
	_ = r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, EndHeaders: true, EndStream: true, BlockFragment: head})
	_ = r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		f, err := r.fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		switch f := f.(type) {
		case *http2.DataFrame:
			t.Fatalf("a HEAD request was answered a body")
		case *http2.HeadersFrame:
			if !f.StreamEnded() {
				t.Fatalf("the answer to a HEAD request does not end with its headers")
			}
			fields, err := r.dec.DecodeFull(f.HeaderBlockFragment())
			if err != nil || len(fields) == 0 || fields[0].Value != "415" {
				t.Fatalf("the answer to a HEAD request: %v %v", fields, err)
			}
			return
		}
	}
}
