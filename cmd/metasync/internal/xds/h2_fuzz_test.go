package xds

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// FuzzConnection: any bytes after a client's preface and SETTINGS, read
// by a connection of the server's HTTP/2, end it without a panic, a
// hang or a goroutine left behind once the client closes.
func FuzzConnection(f *testing.F) {
	for _, seed := range connectionSeeds() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		tr := xdsSrv.Transport(nil)
		cs, ss := net.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			tr.serveH2(ss, nil, ss)
		}()
		read := make(chan struct{})
		go func() { defer close(read); _, _ = io.Copy(io.Discard, cs) }()
		var start bytes.Buffer
		start.WriteString(http2.ClientPreface)
		_ = http2.NewFramer(&start, nil).WriteSettings()
		_ = cs.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if _, err := cs.Write(start.Bytes()); err == nil {
			_, _ = cs.Write(b)
		}
		cs.Close()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatal("the connection did not end once its client closed")
		}
		<-read
	})
}

// connectionSeeds are frames a client sends: an ADS stream with a
// request, a header block in parts, pings, resets, window updates,
// settings, priorities and bad frames.
func connectionSeeds() [][]byte {
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", adsPath}, {":authority", "xds"},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	block := hb.Bytes()
	req := message(&discoveryv3.DiscoveryRequest{TypeUrl: TypeListener, ResourceNames: []string{"chains/model-to-endpoints/fuzz"}})
	seed := func(write func(fr *http2.Framer)) []byte {
		var b bytes.Buffer
		write(http2.NewFramer(&b, nil))
		return b.Bytes()
	}
	return [][]byte{
		seed(func(fr *http2.Framer) {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block, EndHeaders: true})
			_ = fr.WriteData(1, false, req)
			_ = fr.WriteWindowUpdate(0, 1<<20)
			_ = fr.WriteData(1, true, nil)
		}),
		seed(func(fr *http2.Framer) {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:3]})
			_ = fr.WriteContinuation(1, false, block[3:5])
			_ = fr.WriteContinuation(1, true, block[5:])
			_ = fr.WriteRSTStream(1, http2.ErrCodeCancel)
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: block, EndHeaders: true, EndStream: true})
		}),
		seed(func(fr *http2.Framer) {
			_ = fr.WritePing(false, [8]byte{1})
			_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1})
			_ = fr.WritePriority(1, http2.PriorityParam{StreamDep: 1})
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block, EndHeaders: true, Priority: http2.PriorityParam{StreamDep: 3, Weight: 7}})
			_ = fr.WriteData(1, false, req[:4])
			_ = fr.WriteGoAway(0, http2.ErrCodeNo, nil)
		}),
		{0, 0, 4, frameRSTStream, 0, 0, 0, 0, 9, 0, 0, 0, 8},
		{0, 0, 0, frameData, flagPadded, 0, 0, 0, 1},
		{0xff, 0xff, 0xff, frameHeaders, 0, 0, 0, 0, 1},
	}
}
