package plan

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tidwall/gjson"
)

// This file adds the gjson modifier @endpoints, which reads an
// EndpointSlice (discovery.k8s.io/v1) by Kubernetes' rules, as kube-proxy
// applies them (pkg/proxy/endpointslicecache.go and topology.go of
// Kubernetes):
//
//   - an endpoint is ready when conditions.ready is true or unset (the
//     API: "nil should be interpreted as ready"), also when it has no
//     conditions at all;
//   - serving, likewise, is true or unset; terminating is true only when
//     set to true;
//   - an endpoint's address is the first of its addresses (the API: they
//     are fungible, and consumers may use only the first).
//
// On the slice, @endpoints yields the addresses of its ready endpoints;
// @endpoints:{"terminating":true} those of its endpoints that are serving
// and terminating (the fallback of a service that has no ready endpoint,
// written as an index's `fallback`, since it is a rule of the service,
// across its slices, not of one slice); and with "port":"NAME" each
// address as HOST:PORT, with the port number that this slice gives the
// port named NAME ("" for an unnamed port), nothing when the slice has no
// such port. IPv6 hosts are written in brackets. With "hints":true it
// yields the hints of every endpoint instead, tagged "HOST\tzone=NAME"
// and "HOST\tnode=NAME" (see an index's `hints`).

// EndpointsModifier is the name of the modifier, as written after "@".
const EndpointsModifier = "endpoints"

// endpointsOptions is the modifier's argument.
type endpointsOptions struct {
	// Port, when set, writes HOST:PORT with the number of the slice's port
	// of this name.
	Port *string `json:"port"`
	// Terminating selects the serving terminating endpoints instead of
	// the ready ones.
	Terminating bool `json:"terminating"`
	// Hints yields, for every endpoint with an address, whatever its
	// conditions, "HOST\tzone=NAME" for each of its hints.forZones and
	// "HOST\tnode=NAME" for each of its hints.forNodes: an index's
	// hints.
	Hints bool `json:"hints"`
}

// modifierArgs checks the argument of a modifier that metasync adds, by
// name: gjson gives a modifier no way to refuse one.
var modifierArgs = map[string]func(arg string) error{
	EndpointsModifier: func(arg string) error { _, err := parseEndpointsOptions(arg); return err },
}

// endpointsArgs caches parsed arguments: a config has a few, and each
// event of each slice evaluates one.
var endpointsArgs sync.Map // arg -> endpointsOptions

func parseEndpointsOptions(arg string) (endpointsOptions, error) {
	var o endpointsOptions
	if arg == "" {
		return o, nil
	}
	if v, ok := endpointsArgs.Load(arg); ok {
		return v.(endpointsOptions), nil
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(arg)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil {
		return o, fmt.Errorf(`argument of @endpoints %s: %v; want a JSON object such as {"port":"grpc"} or {"terminating":true}`, arg, err)
	}
	if dec.More() {
		return o, fmt.Errorf("argument of @endpoints %s: more than one JSON value", arg)
	}
	endpointsArgs.Store(arg, o)
	return o, nil
}

func init() {
	gjson.AddModifier(EndpointsModifier, endpointsOf)
}

// slice is what the modifier reads of an EndpointSlice, parsed once for
// the several rules (value, fallback, hints) that an object's indexes
// evaluate on the same document. Its strings are copies: the document may
// be a view of a buffer that the decoder reuses for the next object.
type slice struct {
	size  int    // of the document
	sum   uint64 // maphash of the document
	ports []slicePort
	eps   []sliceEndpoint
	// fqdn is set for a slice of addressType FQDN: its addresses are
	// hostnames, which kube-proxy does not route to, and neither does
	// @endpoints (grpc-java's xDS client rejects a whole assignment that
	// holds one).
	fqdn bool
}

type slicePort struct {
	name string
	port string // its number, 1 to 65535
}

type sliceEndpoint struct {
	addr                        string // the first address
	ready, serving, terminating bool
	hints                       *sliceHints // nil without hints, as most are
}

type sliceHints struct {
	zones, nodes []string // hints.forZones, hints.forNodes
}

// lastSlice is the slice parsed last, known by its document's size and
// seeded hash: a projection evaluates every rule of an object before the
// next object, so the rules of one object after its first find it here.
var (
	lastSlice atomic.Pointer[slice]
	sliceSeed = maphash.MakeSeed()
)

func parseSlice(doc string) *slice {
	sum := maphash.String(sliceSeed, doc)
	if p := lastSlice.Load(); p != nil && p.size == len(doc) && p.sum == sum {
		return p
	}
	p := readSlice(doc)
	p.size, p.sum = len(doc), sum
	lastSlice.Store(p)
	return p
}

// readSlice reads an EndpointSlice, in one pass when it can.
func readSlice(doc string) *slice {
	if p, ok := scanSlice(doc); ok {
		return p
	}
	return parseSliceGJSON(doc)
}

// parseSliceGJSON reads an EndpointSlice with gjson: the reference that
// scanSlice follows, and the reading of any document scanSlice refuses.
func parseSliceGJSON(doc string) *slice {
	p := &slice{eps: make([]sliceEndpoint, 0, 16)}
	var arena []byte
	var offs []int
	seenType := false
	// One pass over the document's keys: ports come last in the
	// apiserver's JSON, and a Get of each would scan it twice.
	gjson.Parse(doc).ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "addressType":
			// gjson's Get answers the first of keys written twice.
			if !seenType {
				seenType = true
				p.fqdn = v.Type == gjson.String && v.Str == "FQDN"
			}
		case "ports":
			v.ForEach(func(_, port gjson.Result) bool {
				if n := port.Get("port"); n.Type == gjson.Number && n.Num == float64(n.Int()) && n.Int() > 0 && n.Int() < 65536 {
					p.ports = append(p.ports, slicePort{name: strings.Clone(port.Get("name").String()), port: strconv.FormatInt(n.Int(), 10)})
				}
				return true
			})
		case "endpoints":
			v.ForEach(func(_, ep gjson.Result) bool {
				// Three short scans of the endpoint: addresses and
				// conditions come first in the apiserver's JSON; hints
				// are looked for only in an endpoint that has them.
				a := ep.Get("addresses.0")
				if a.Type != gjson.String || a.Str == "" {
					return true
				}
				// The addresses are copied into one arena, made a
				// string once at the end: one allocation, not one each.
				e := sliceEndpoint{addr: a.Str, ready: true, serving: true}
				offs = append(offs, len(arena))
				arena = append(arena, a.Str...)
				ep.Get("conditions").ForEach(func(k, v gjson.Result) bool {
					switch k.Str {
					case "ready":
						e.ready = v.Type != gjson.False
					case "serving":
						e.serving = v.Type != gjson.False
					case "terminating":
						e.terminating = v.Type == gjson.True
					}
					return true
				})
				if strings.Contains(ep.Raw, `"hints"`) {
					if hints := ep.Get("hints"); hints.IsObject() {
						h := &sliceHints{zones: hintNames(hints.Get("forZones")), nodes: hintNames(hints.Get("forNodes"))}
						if len(h.zones)+len(h.nodes) > 0 {
							e.hints = h
						}
					}
				}
				p.eps = append(p.eps, e)
				return true
			})
		}
		return true
	})
	all := string(arena)
	for i := range p.eps {
		p.eps[i].addr = all[offs[i] : offs[i]+len(p.eps[i].addr)]
	}
	return p
}

func hintNames(list gjson.Result) []string {
	var out []string
	list.ForEach(func(_, h gjson.Result) bool {
		// A name with a tab would not read back from the hint (no zone
		// or node name holds one).
		if name := h.Get("name"); name.Type == gjson.String && name.Str != "" && !strings.ContainsRune(name.Str, '\t') {
			out = append(out, strings.Clone(name.Str))
		}
		return true
	})
	return out
}

// endpointsOf is the modifier: json is an EndpointSlice; it returns a JSON
// array of strings (empty when the slice has none, or when the argument
// is invalid, which validation refuses before any evaluation).
func endpointsOf(json, arg string) string {
	o, err := parseEndpointsOptions(arg)
	if err != nil {
		return "[]"
	}
	out := make([]byte, 0, 64)
	out = append(out, '[')
	o.each(parseSlice(json), func(v []byte) {
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = appendJSONString(out, string(v))
	})
	return string(append(out, ']'))
}

// each calls emit with each value that the options select of a slice, in
// the slice's order; v is valid only during the call.
func (o endpointsOptions) each(sl *slice, emit func(v []byte)) {
	if sl.fqdn {
		return
	}
	port := ""
	if o.Port != nil {
		for _, p := range sl.ports {
			if p.name == *o.Port {
				port = p.port
				break
			}
		}
		if port == "" {
			return
		}
	}
	var v []byte
	// host writes an address into v, as HOST:PORT with a port (IPv6 in
	// brackets, as net.JoinHostPort).
	host := func(addr string) []byte {
		switch {
		case port == "":
			v = append(v[:0], addr...)
		case strings.IndexByte(addr, ':') >= 0:
			v = append(append(append(v[:0], '['), addr...), ']', ':')
			v = append(v, port...)
		default:
			v = append(append(append(v[:0], addr...), ':'), port...)
		}
		return v
	}
	for _, e := range sl.eps {
		switch {
		case o.Hints:
			if e.hints == nil {
				continue
			}
			n := len(host(e.addr))
			for _, z := range e.hints.zones {
				emit(append(append(v[:n], "\tzone="...), z...))
			}
			for _, nd := range e.hints.nodes {
				emit(append(append(v[:n], "\tnode="...), nd...))
			}
		case o.Terminating && e.serving && e.terminating, !o.Terminating && e.ready:
			emit(host(e.addr))
		}
	}
}

// directEndpoints returns the options of a path that is @endpoints alone,
// with or without an argument, and nothing after it: Rule evaluates such
// a path on the slice itself, with no JSON in between.
func directEndpoints(path string) (endpointsOptions, bool) {
	rest, ok := strings.CutPrefix(path, "@"+EndpointsModifier)
	if !ok {
		return endpointsOptions{}, false
	}
	if rest == "" {
		return endpointsOptions{}, true
	}
	arg, ok := strings.CutPrefix(rest, ":")
	// gjson takes as the argument the JSON value after the colon; when it
	// is the whole rest, nothing follows the modifier.
	if !ok || !strings.HasPrefix(arg, "{") || !gjson.Valid(arg) {
		return endpointsOptions{}, false
	}
	o, err := parseEndpointsOptions(arg)
	return o, err == nil
}

// appendJSONString appends s as a JSON string.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
