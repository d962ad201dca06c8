package xds

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
)

// The one gRPC method of the server, served over the server's own
// HTTP/2 (h2.go): the daemon links no gRPC library. A gRPC message is a 5-byte prefix (a
// compressed flag, then the length) and the message; the status is in
// the trailers.

// adsPath is the HTTP/2 path of AggregatedDiscoveryService's
// StreamAggregatedResources.
const adsPath = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"

// maxMessage bounds a request: a DiscoveryRequest names at most MaxNames
// resources of MaxNameLength bytes each, about 1 MiB at most.
const maxMessage = 3 << 19

// messageTimeout bounds the read of one message from its first bytes,
// counted while the server gives it credit (not while a whole message
// before it waits): a client that begins a message and sends it only in
// part loses its stream, and what it sent, instead of holding it for
// good.
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

// sendTimeout bounds the write of one message: a client that reads
// nothing loses its stream (and a connection whose writes wait that
// long, its connection). Atomic: tests shorten it while streams of
// earlier tests may still be writing.
var sendTimeout = func() *atomic.Int64 {
	var d atomic.Int64
	d.Store(int64(30 * time.Second))
	return &d
}()

// frameHeader is the length of a gRPC message's prefix.
const frameHeader = 5
