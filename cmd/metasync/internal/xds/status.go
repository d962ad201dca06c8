package xds

import (
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/iidp/metasync/internal/wire"
)

// ClientStatus is what one connected xDS client holds, for the status
// route (see wire.XDSClient).
type ClientStatus = wire.XDSClient

// TypeStatus is one resource type of a ClientStatus.
type TypeStatus = wire.XDSType

// publishStatus copies the stream's state for Clients and the metrics
// (from the stream's goroutine). The names are shared, not copied: a
// type's names are replaced, never changed in place.
func (c *client) publishStatus() {
	var denied []string
	if c.deniedChanged {
		denied = slices.Sorted(maps.Keys(c.denied))
	}
	var unknown []UnknownTarget
	if c.unknownChanged {
		unknown = c.unknownStatus()
	}
	c.statusMu.Lock()
	defer c.statusMu.Unlock()
	c.status.Node, c.status.Zone = c.node, c.zone
	if c.deniedChanged {
		c.status.Denied = denied
		c.deniedChanged = false
	}
	if c.unknownChanged {
		c.status.Unknown = unknown
		c.unknownChanged = false
	}
	if c.status.Types == nil {
		c.status.Types = make(map[string]TypeStatus, len(c.types))
	}
	for typeURL, st := range c.types {
		c.status.Types[typeNames[typeURL]] = TypeStatus{Names: st.names, Sent: st.nonce, Acked: st.acked, Rejected: st.nacked, Why: st.why}
	}
}

// copyStatus is the client's status, copied.
func (c *client) copyStatus() ClientStatus {
	c.statusMu.Lock()
	defer c.statusMu.Unlock()
	st := c.status
	st.Types = maps.Clone(st.Types)
	if st.Types == nil {
		st.Types = map[string]TypeStatus{}
	}
	return st
}

// connectedClients is every client connected now.
func (s *Server) connectedClients() []*client {
	s.mu.Lock()
	defer s.mu.Unlock()
	cs := make([]*client, 0, len(s.connected))
	for c := range s.connected {
		cs = append(cs, c)
	}
	return cs
}

// Clients describes every connected client, ordered by node and time of
// connection. It reads copies: a client that does not read what it is
// sent never holds it up.
func (s *Server) Clients() []ClientStatus {
	cs := s.connectedClients()
	out := make([]ClientStatus, 0, len(cs))
	for _, c := range cs {
		out = append(out, c.copyStatus())
	}
	slices.SortFunc(out, func(a, b ClientStatus) int {
		if a.Node != b.Node {
			return strings.Compare(a.Node, b.Node)
		}
		return a.Connected.Compare(b.Connected)
	})
	return out
}

// StatusHandler answers GET with {"clients":[...]} (see Clients), in the
// spirit of istioctl proxy-status.
func (s *Server) StatusHandler() http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"clients": s.Clients()})
	}
}

// The metrics counted when scraped, from the status copies and the
// cache.
var (
	resourcesDesc     = prometheus.NewDesc("metasync_xds_resources", "xDS resources that the connected clients follow (each client's names, summed), by resource type.", []string{"type"}, nil)
	connectionsDesc   = prometheus.NewDesc("metasync_xds_connections", "xDS connections open.", nil, nil)
	subscriptionsDesc = prometheus.NewDesc("metasync_xds_cache_subscriptions", "Engine subscriptions that the xDS server holds: one per assignment and locality that some client follows, shared by all its followers.", nil, nil)
	limitDesc         = prometheus.NewDesc("metasync_xds_limit", "The xDS limits in force, by limit (connections, connections_per_caller, streams_per_caller, names_per_caller); 0 for none.", []string{"limit"}, nil)
)

type statusCollector struct{ s *Server }

func (c statusCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- resourcesDesc
	ch <- connectionsDesc
	ch <- subscriptionsDesc
	ch <- limitDesc
}

func (c statusCollector) Collect(ch chan<- prometheus.Metric) {
	n := map[string]int{}
	for _, cl := range c.s.connectedClients() {
		cl.statusMu.Lock()
		for short, st := range cl.status.Types {
			n[short] += len(st.Names)
		}
		cl.statusMu.Unlock()
	}
	for _, typeURL := range allTypes {
		ch <- prometheus.MustNewConstMetric(resourcesDesc, prometheus.GaugeValue, float64(n[typeNames[typeURL]]), typeNames[typeURL])
	}
	ch <- prometheus.MustNewConstMetric(connectionsDesc, prometheus.GaugeValue, float64(c.s.gate.openConnections()))
	_, subs := c.s.cache.size()
	ch <- prometheus.MustNewConstMetric(subscriptionsDesc, prometheus.GaugeValue, float64(subs))
	l := c.s.limits
	for name, v := range map[string]int{refusedConnections: l.Connections, refusedConnsOfCaller: l.ConnectionsPerCaller, refusedStreams: l.StreamsPerCaller, refusedNames: l.NamesPerCaller} {
		ch <- prometheus.MustNewConstMetric(limitDesc, prometheus.GaugeValue, float64(v), name)
	}
}
