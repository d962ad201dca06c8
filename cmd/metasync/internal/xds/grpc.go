package xds

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// The one gRPC method of the server, served over HTTP/2 by net/http: the
// daemon links no gRPC library. A gRPC message is a 5-byte prefix (a
// compressed flag, then the length) and the message; the status is in
// the trailers.

// adsPath is the HTTP/2 path of AggregatedDiscoveryService's
// StreamAggregatedResources.
const adsPath = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"

// maxMessage bounds a request: a DiscoveryRequest names at most MaxNames
// resources of MaxNameLength bytes each, about 1 MiB at most.
const maxMessage = 3 << 19

// messageTimeout bounds the read of one message once its prefix came: a
// client that announces a message and sends it only in part loses its
// stream, and what it sent, instead of holding it for good.
var messageTimeout = func() *atomic.Int64 {
	var d atomic.Int64
	d.Store(int64(10 * time.Second))
	return &d
}()

// gRPC status codes used here.
const (
	codeOK               = 0
	codeInvalid          = 3
	codePermissionDenied = 7
	codeUnimplemented    = 12
	codeInternal         = 13
	codeUnavailable      = 14
	codeUnauthenticated  = 16
)

// codeOfHTTP is the gRPC status of an HTTP status that refuses access.
func codeOfHTTP(status int) int {
	switch status {
	case http.StatusUnauthorized:
		return codeUnauthenticated
	case http.StatusForbidden:
		return codePermissionDenied
	}
	return codeUnavailable
}

// ServeHTTP serves gRPC requests: StreamAggregatedResources, and
// UNIMPLEMENTED for any other method.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ct := r.Header.Get("Content-Type")
	if r.ProtoMajor != 2 || ct != "application/grpc" && !strings.HasPrefix(ct, "application/grpc+") && !strings.HasPrefix(ct, "application/grpc;") {
		http.Error(w, "metasync's xDS port speaks gRPC (HTTP/2, application/grpc) only", http.StatusUnsupportedMediaType)
		return
	}
	w.Header().Set("Content-Type", "application/grpc")
	w.Header().Set("Trailer", "Grpc-Status, Grpc-Message")
	if r.URL.Path != adsPath {
		finish(w, codeUnimplemented, "unknown method "+r.URL.Path+": this server serves "+adsPath)
		return
	}
	if enc := r.Header.Get("Grpc-Encoding"); enc != "" && enc != "identity" {
		finish(w, codeUnimplemented, "compression "+enc+" is not supported")
		return
	}
	var user string
	if s.authorize != nil {
		// Who the client is, before anything is sent: a stream without
		// a valid token ends at once (a review that failed ends it
		// UNAVAILABLE, and the client tries again).
		u, code, msg := s.authorize(r, "")
		if code != 0 {
			s.refusedLog.Do(func() {
				s.log.Warn("xDS client refused", "remote", r.RemoteAddr, "status", code, "error", msg)
			})
			finish(w, codeOfHTTP(code), msg)
			return
		}
		user = u
	}
	caller := callerOf(r, user)
	release, reason, msg := s.gate.admit(r, caller)
	if reason != "" {
		s.refuse(reason, caller, msg)
		finish(w, codeResourceExhausted, msg)
		return
	}
	defer release()
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if err := rc.Flush(); err != nil {
		return
	}
	st := &grpcStream{w: w, rc: rc, body: r.Body}
	err := s.serve(r.Context(), st, r, user, caller)
	code, message := codeOK, ""
	var se *statusError
	switch {
	case err == nil, errors.Is(err, io.EOF), r.Context().Err() != nil:
	case errors.As(err, &se):
		code, message = se.code, se.message
	default:
		code, message = codeInternal, err.Error()
	}
	finish(w, code, message)
}

// finish writes the status trailers.
func finish(w http.ResponseWriter, code int, message string) {
	w.Header().Set("Grpc-Status", strconv.Itoa(code))
	if message != "" {
		w.Header().Set("Grpc-Message", encodeMessage(message))
	}
}

// encodeMessage percent-encodes a status message, as gRPC's HTTP/2
// mapping says.
func encodeMessage(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// statusError ends a stream with a gRPC status.
type statusError struct {
	code    int
	message string
}

func (e *statusError) Error() string { return e.message }

// grpcStream reads and writes the messages of one call.
type grpcStream struct {
	w    http.ResponseWriter
	rc   *http.ResponseController
	body io.ReadCloser
}

// close ends the reading: a recv waiting returns an error.
func (g *grpcStream) close() { _ = g.body.Close() }

// recv reads one message.
func (g *grpcStream) recv() ([]byte, error) {
	var head [5]byte
	if _, err := io.ReadFull(g.body, head[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, &statusError{codeInvalid, "a gRPC message cut short"}
		}
		return nil, err
	}
	switch head[0] {
	case 0:
	case 1:
		return nil, &statusError{codeUnimplemented, "compressed messages are not supported"}
	default:
		return nil, &statusError{codeInvalid, "not a gRPC message"}
	}
	n := binary.BigEndian.Uint32(head[1:])
	if n > maxMessage {
		return nil, &statusError{codeInvalid, fmt.Sprintf("a request of %d bytes, over %d", n, maxMessage)}
	}
	// Read as it comes, not allocated as announced: a length alone
	// reserves nothing; and within messageTimeout.
	within := time.Duration(messageTimeout.Load())
	if n > 0 {
		_ = g.rc.SetReadDeadline(time.Now().Add(within))
		defer g.rc.SetReadDeadline(time.Time{})
	}
	var buf bytes.Buffer
	if m, err := io.CopyN(&buf, g.body, int64(n)); err != nil || m != int64(n) {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, &statusError{codeInvalid, fmt.Sprintf("a message of %d bytes not received within %s", n, within)}
		}
		return nil, &statusError{codeInvalid, "a gRPC message cut short"}
	}
	return buf.Bytes(), nil
}

// sendTimeout bounds the write of one message: a client that reads
// nothing loses its stream.
var sendTimeout = 30 * time.Second

// send writes one message and flushes it: frame is the message after
// frameHeader bytes left for the gRPC prefix, written here.
func (g *grpcStream) send(frame []byte) error {
	// The deadline is a timer that resets the stream when it fires,
	// writing or not: cleared once the message is out.
	_ = g.rc.SetWriteDeadline(time.Now().Add(sendTimeout))
	defer g.rc.SetWriteDeadline(time.Time{})
	// One write of prefix and message: each write is a hand-off to the
	// connection's writer.
	frame[0] = 0
	binary.BigEndian.PutUint32(frame[1:frameHeader], uint32(len(frame)-frameHeader))
	if _, err := g.w.Write(frame); err != nil {
		return err
	}
	return g.rc.Flush()
}

// frameHeader is the length of a gRPC message's prefix.
const frameHeader = 5
