package xds

import (
	"strconv"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2/hpack"
)

// A request's header block, read as RFC 9113 §8.2 and §8.3 say: a
// malformed one is a stream error of PROTOCOL_ERROR (§8.1.1), and a
// field that may come once (a pseudo-header, authorization,
// content-length) coming twice makes it malformed, never last-one-wins.

// Pseudo-headers of a request, as bits of headerFields.seen.
const (
	pseudoMethod = 1 << iota
	pseudoScheme
	pseudoPath
	pseudoAuthority
)

// headerFields is what a request's header block says.
type headerFields struct {
	method, scheme, path, contentType, encoding, auth string
	// contentLength is the request's content-length, -1 when it has
	// none.
	contentLength int64
	size          int // decoded, as RFC 9113 counts it
	// bad: over h2MaxHeaderList (the stream is refused);
	// malformed: why the block is malformed, "" when it is not.
	bad       bool
	malformed string
	// trailer: the block is a request's trailers (no pseudo-header).
	trailer bool
	regular bool  // a regular field came: no pseudo-header may follow
	seen    uint8 // pseudo-headers come, by bit
	authSet bool
}

// emit takes one decoded header field.
func (c *h2conn) emit(f hpack.HeaderField) {
	h := &c.fields
	h.size += len(f.Name) + len(f.Value) + 32
	if h.size > h2MaxHeaderList {
		h.bad = true
		c.dec.SetEmitEnabled(false)
		return
	}
	if h.malformed != "" {
		return // the first reason is the one told
	}
	if why := h.field(f.Name, f.Value); why != "" {
		h.malformed = why
	}
}

// field takes a field of the block and says why it makes the block
// malformed ("" when it does not).
func (h *headerFields) field(name, value string) string {
	if len(name) > 0 && name[0] == ':' {
		return h.pseudo(name, value)
	}
	h.regular = true
	if !httpguts.ValidHeaderFieldName(name) {
		return "the field name " + strconv.Quote(name) + " is not a token"
	}
	for i := 0; i < len(name); i++ {
		if 'A' <= name[i] && name[i] <= 'Z' {
			return "the field name " + strconv.Quote(name) + " has uppercase letters"
		}
	}
	if why := checkValue(name, value); why != "" {
		return why
	}
	switch name {
	case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade":
		return "the connection-specific field " + name
	case "te":
		if value != "trailers" {
			return "te other than \"trailers\""
		}
	case "content-length":
		n, err := strconv.ParseUint(value, 10, 63)
		if err != nil {
			return "a content-length that is not a number"
		}
		if h.contentLength >= 0 && h.contentLength != int64(n) {
			return "two content-length values"
		}
		h.contentLength = int64(n)
	case "authorization":
		if h.authSet {
			return "more than one authorization field"
		}
		h.authSet, h.auth = true, value
	case "content-type":
		h.contentType = value
	case "grpc-encoding":
		h.encoding = value
	}
	return ""
}

// pseudo takes a pseudo-header.
func (h *headerFields) pseudo(name, value string) string {
	if h.trailer {
		return "the pseudo-header " + name + " in trailers"
	}
	if h.regular {
		return "the pseudo-header " + name + " after a regular field"
	}
	if why := checkValue(name, value); why != "" {
		return why
	}
	var bit uint8
	switch name {
	case ":method":
		bit, h.method = pseudoMethod, value
	case ":scheme":
		bit, h.scheme = pseudoScheme, value
	case ":path":
		bit, h.path = pseudoPath, value
	case ":authority":
		bit = pseudoAuthority
	default:
		return "the pseudo-header " + strconv.Quote(name) + " is not a request's"
	}
	if h.seen&bit != 0 {
		return "the pseudo-header " + name + " twice"
	}
	h.seen |= bit
	return ""
}

// checkValue says why a field's value makes a request malformed (§8.2.1:
// no NUL, CR or LF, no whitespace first or last), "" when it does not.
func checkValue(name, value string) string {
	if !httpguts.ValidHeaderFieldValue(value) {
		return "the value of " + name + " has a character a field may not hold"
	}
	if n := len(value); n > 0 && (value[0] == ' ' || value[0] == '\t' || value[n-1] == ' ' || value[n-1] == '\t') {
		return "the value of " + name + " begins or ends with whitespace"
	}
	return ""
}

// check says why a whole request block is malformed ("" when it is
// not): the pseudo-headers a request must have (§8.3.1).
func (h *headerFields) check() string {
	if h.malformed != "" || h.trailer {
		return h.malformed
	}
	if h.seen&pseudoMethod == 0 {
		return "no :method"
	}
	if !httpguts.ValidHeaderFieldName(h.method) {
		return "a :method that is not a token"
	}
	if h.method == "CONNECT" {
		if h.seen&(pseudoScheme|pseudoPath) != 0 || h.seen&pseudoAuthority == 0 {
			return "a CONNECT request with :scheme or :path, or without :authority"
		}
		return ""
	}
	if h.seen&pseudoScheme == 0 || h.scheme == "" {
		return "no :scheme, or an empty one"
	}
	if h.seen&pseudoPath == 0 {
		return "no :path"
	}
	if h.path == "" {
		return "an empty :path"
	}
	return ""
}
