package plan

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"

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

// endpointsOf is the modifier: json is an EndpointSlice; it returns a JSON
// array of strings (empty when the slice has none, or when the argument
// is invalid, which validation refuses before any evaluation).
func endpointsOf(json, arg string) string {
	o, err := parseEndpointsOptions(arg)
	if err != nil {
		return "[]"
	}
	port := ""
	if o.Port != nil {
		found := false
		gjson.Get(json, "ports").ForEach(func(_, p gjson.Result) bool {
			if p.Get("name").String() != *o.Port {
				return true
			}
			if n := p.Get("port"); n.Type == gjson.Number && n.Int() > 0 && n.Int() < 65536 {
				port, found = strconv.FormatInt(n.Int(), 10), true
			}
			return false
		})
		if !found {
			return "[]"
		}
	}
	out := make([]byte, 0, 64)
	out = append(out, '[')
	n := 0
	gjson.Get(json, "endpoints").ForEach(func(_, ep gjson.Result) bool {
		conds := ep.Get("conditions")
		ready := conds.Get("ready").Type != gjson.False
		serving := conds.Get("serving").Type != gjson.False
		terminating := conds.Get("terminating").Type == gjson.True
		if !o.Hints && (o.Terminating && !(serving && terminating) || !o.Terminating && !ready) {
			return true
		}
		addr := ep.Get("addresses.0")
		if addr.Type != gjson.String || addr.Str == "" {
			return true
		}
		host := addr.Str
		if port != "" {
			host = net.JoinHostPort(host, port)
		}
		if o.Hints {
			for _, kind := range [...]string{"zone", "node"} {
				ep.Get("hints.for" + strings.ToUpper(kind[:1]) + kind[1:] + "s").ForEach(func(_, h gjson.Result) bool {
					if name := h.Get("name"); name.Type == gjson.String && name.Str != "" {
						if n > 0 {
							out = append(out, ',')
						}
						out = appendJSONString(out, host+"\t"+kind+"="+name.Str)
						n++
					}
					return true
				})
			}
			return true
		}
		if n > 0 {
			out = append(out, ',')
		}
		out = appendJSONString(out, host)
		n++
		return true
	})
	out = append(out, ']')
	return string(out)
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
