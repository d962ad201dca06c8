package xds

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
)

// The protobuf messages of xDS that the server reads and writes, encoded
// by hand with protowire: the daemon links none of the generated xDS
// packages, which add about 10 MB of resident memory to a process that
// imports them, whether or not it serves xDS. wire_test.go decodes each
// encoding with go-control-plane's types and compares it with the same
// message built from them.
//
// Field numbers are those of the envoy v3 API (envoy/config/...,
// envoy/service/discovery/v3/discovery.proto).

// The type URLs of the messages packed into an Any.
const (
	typeHCM    = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
	typeRouter = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
)

// msg builds one message, field by field.
type msg []byte

func (m msg) str(num protowire.Number, s string) msg {
	if s == "" {
		return m
	}
	m = protowire.AppendTag(m, num, protowire.BytesType)
	return protowire.AppendString(m, s)
}

func (m msg) bytes(num protowire.Number, b []byte) msg {
	m = protowire.AppendTag(m, num, protowire.BytesType)
	return protowire.AppendBytes(m, b)
}

func (m msg) varint(num protowire.Number, v uint64) msg {
	if v == 0 {
		return m
	}
	m = protowire.AppendTag(m, num, protowire.VarintType)
	return protowire.AppendVarint(m, v)
}

// any packs an encoded message of typeURL into a google.protobuf.Any.
func anyOf(typeURL string, value []byte) []byte {
	return msg(nil).str(1, typeURL).bytes(2, value)
}

// uint32Value is a google.protobuf.UInt32Value.
func uint32Value(v uint32) []byte { return msg(nil).varint(1, uint64(v)) }

// adsSource is a ConfigSource naming the same ADS stream, API v3.
func adsSource() []byte {
	return msg(nil).bytes(3, nil).varint(6, 2) // ads {}, resource_api_version V3
}

// encodeListener is a Listener named name whose API listener is an HTTP
// connection manager with the router filter and its routes from the
// RouteConfiguration called name (RDS over ADS).
func encodeListener(name string) []byte {
	rds := msg(nil).bytes(1, adsSource()).str(2, name)
	filter := msg(nil).str(1, "envoy.filters.http.router").bytes(4, anyOf(typeRouter, nil))
	hcm := msg(nil).str(2, "metasync").bytes(3, rds).bytes(5, filter)
	api := msg(nil).bytes(1, anyOf(typeHCM, hcm))
	return msg(nil).str(1, name).bytes(19, api)
}

// encodeRoute is a RouteConfiguration named name: one virtual host for
// every domain, every call routed to cluster.
func encodeRoute(name, cluster string) []byte {
	// prefix "", written although empty: it is the oneof's choice.
	match := msg(protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), ""))
	action := msg(nil).str(1, cluster)
	route := msg(nil).bytes(1, match).bytes(2, action)
	vhost := msg(nil).str(1, name).str(2, "*").bytes(3, route)
	return msg(nil).str(1, name).bytes(2, vhost)
}

// encodeCluster is an EDS Cluster named name, balanced round robin, its
// assignment of the same name from the ADS stream.
func encodeCluster(name string) []byte {
	eds := msg(nil).bytes(1, adsSource()).str(2, name)
	return msg(nil).str(1, name).varint(2, 3).bytes(3, eds) // type EDS; lb_policy ROUND_ROBIN is 0
}

// endpoint is one address of an assignment.
type endpoint struct {
	host string
	port uint32
}

// locality is one group of an assignment: a zone ("" for none), its
// priority (from 0, without gaps) and endpoints.
type locality struct {
	// zone and subZone name the locality: the client's zone for its
	// zone's endpoints, the home cluster's name for the home's.
	zone, subZone string
	priority      uint32
	eps           []endpoint
}

// encodeAssignment is the ClusterLoadAssignment of cluster: each group
// with endpoints a locality, locality and endpoints of weight 1 (gRPC
// rejects an endpoint weight of 0 and ignores a locality of weight 0),
// each endpoint healthy. No endpoint: no locality.
func encodeAssignment(cluster string, groups []locality) []byte {
	m := msg(nil).str(1, cluster)
	for _, g := range groups {
		if len(g.eps) == 0 {
			continue
		}
		l := msg(nil).bytes(1, msg(nil).str(2, g.zone).str(3, g.subZone)) // Locality{zone, sub_zone}
		for _, e := range g.eps {
			sock := msg(nil).str(2, e.host).varint(3, uint64(e.port))
			addr := msg(nil).bytes(1, sock)
			ep := msg(nil).bytes(1, addr)
			lb := msg(nil).bytes(1, ep).varint(2, 1).bytes(4, uint32Value(1)) // HEALTHY
			l = l.bytes(2, lb)
		}
		l = l.bytes(3, uint32Value(1)).varint(5, uint64(g.priority))
		m = m.bytes(2, l)
	}
	return m
}

// encodeFrame is a DiscoveryResponse of typeURL holding resources (each
// an encoded message of that type), with version and nonce, after
// frameHeader bytes of room for the gRPC prefix: one buffer, sized once,
// written in place.
func encodeFrame(typeURL, version, nonce string, resources [][]byte) []byte {
	n := frameHeader + 2*len(version) + len(typeURL) + 32
	for _, r := range resources {
		n += len(r) + len(typeURL) + 24
	}
	m := make(msg, frameHeader, n).str(1, version)
	for _, r := range resources {
		// An Any of the resource, written in place.
		size := protowire.SizeTag(1) + protowire.SizeBytes(len(typeURL)) + protowire.SizeTag(2) + protowire.SizeBytes(len(r))
		m = protowire.AppendTag(m, 2, protowire.BytesType)
		m = protowire.AppendVarint(m, uint64(size))
		m = m.str(1, typeURL).bytes(2, r)
	}
	return m.str(4, typeURL).str(5, nonce)
}

// request is what the server reads of a DiscoveryRequest.
type request struct {
	versionInfo   string
	nodeID        string
	zone          string // node.locality.zone
	resourceNames []string
	typeURL       string
	responseNonce string
	// errorDetail is set on a NACK: the client rejected the response of
	// responseNonce, and says why.
	nack        bool
	nackMessage string
}

// What a stream keeps of a request's free text is bounded, as the stream
// keeps it for its life and the status route shows it: a node id and a
// NACK's reason are cut (with "…"), a zone longer than any zone's name
// is refused.
const (
	maxNodeID      = 256
	maxZone        = 256
	maxNackMessage = 1024
)

// clip is v as a string of at most n bytes (and "…" when cut).
func clip(v []byte, n int) string {
	if len(v) <= n {
		return string(v)
	}
	return strings.ToValidUTF8(string(v[:n]), "") + "…"
}

// decodeRequest reads a DiscoveryRequest; fields it does not know are
// skipped.
func decodeRequest(b []byte) (request, error) {
	var r request
	err := fields(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if typ != protowire.BytesType {
			return nil
		}
		switch num {
		case 1:
			r.versionInfo = string(v)
		case 2: // node
			return fields(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
				switch {
				case num == 1 && typ == protowire.BytesType:
					r.nodeID = clip(v, maxNodeID)
				case num == 4 && typ == protowire.BytesType: // locality
					return fields(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
						if num == 2 && typ == protowire.BytesType {
							if len(v) > maxZone {
								return fmt.Errorf("node.locality.zone of %d bytes, over %d", len(v), maxZone)
							}
							r.zone = string(v)
						}
						return nil
					})
				}
				return nil
			})
		case 3:
			r.resourceNames = append(r.resourceNames, string(v))
		case 4:
			r.typeURL = string(v)
		case 5:
			r.responseNonce = string(v)
		case 6: // error_detail, a google.rpc.Status
			r.nack = true
			return fields(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
				if num == 2 && typ == protowire.BytesType {
					r.nackMessage = clip(v, maxNackMessage)
				}
				return nil
			})
		}
		return nil
	})
	return r, err
}

// fields calls f with each field of the encoded message b: its number,
// its wire type, its bytes (for a length-delimited field) or its value
// (for a varint).
func fields(b []byte, f func(num protowire.Number, typ protowire.Type, bytes []byte, varint uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("xds: bad field tag: %w", protowire.ParseError(n))
		}
		b = b[n:]
		var err error
		switch typ {
		case protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return fmt.Errorf("xds: bad field %d: %w", num, protowire.ParseError(m))
			}
			err, n = f(num, typ, v, 0), m
		case protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return fmt.Errorf("xds: bad field %d: %w", num, protowire.ParseError(m))
			}
			err, n = f(num, typ, nil, v), m
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return fmt.Errorf("xds: bad field %d: %w", num, protowire.ParseError(n))
			}
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}
