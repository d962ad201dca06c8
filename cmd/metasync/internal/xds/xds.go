// Package xds serves the answers of a metasync engine over xDS v3, the
// Aggregated Discovery Service in its state-of-the-world form, so that a
// gRPC client in any language with xDS support (a bootstrap that names
// the daemon, a target xds:///chains/CHAIN/KEY or
// xds:///indexes/INDEX/KEY) resolves and balances through metasync with
// no metasync code in it.
//
// For each target a client asks for, the server answers four resources,
// as gRPC's xDS client reads them: the Listener of the name asked for (an
// API listener: an HTTP connection manager with the router filter that
// points at a RouteConfiguration of the same name), the
// RouteConfiguration (one virtual host for every domain, everything
// routed to one Cluster), the Cluster (EDS, round robin) and its
// ClusterLoadAssignment, whose endpoints are the answer's host:port
// values. A new answer pushes a new assignment; an empty one has no
// endpoints (calls fail UNAVAILABLE); an unknown index or chain has no
// Listener. The assignment of a target is not sent before the engine has
// answered it once: before its resource's first list a client waits.
//
// The package has the shape of go-control-plane's server and cache, on
// an HTTP/2 server of its own and protowire:
//
//   - the cache (cache.go) follows the engine: one entry per target and
//     zone that some client follows, with one engine subscription per
//     locality and the assignment encoded once, from one state of the
//     engine, shared by every client that follows it; a change wakes
//     that entry's followers only;
//   - the server (stream.go) runs each ADS stream and its ACK/NACK
//     state, one event at a time: a push sends what changed, and a
//     version a client rejects is not sent again until the answer
//     changes (go-control-plane's cache re-sends a rejected version in a
//     loop);
//   - the transport (h2.go, h2stream.go, h2write.go) is the part of
//     HTTP/2 that gRPC's one method needs: a connection holds one
//     goroutine at rest, its frame reader; a stream's events run in a
//     goroutine started when there is something to do, which writes
//     its messages. A client at rest costs about 12 KiB resident
//     (x/net's HTTP/2 server held four goroutines and about 50 KiB);
//   - the seam (seam.go) is all the transport and the protocol know of
//     each other: the transport opens a stream through the protocol's
//     one door (open, where the Authorizer and the limits admit it) and
//     calls its Handler; the protocol sends and asks for turns through
//     a Stream;
//   - access.go holds the Authorizer's verdicts, status.go what the
//     status route and the metrics read (copies, never a lock held
//     across a network write), limits.go what one caller may hold.
//
// The daemon links neither gRPC nor the generated xDS packages (about 10
// MB of resident memory in every process that imports them, serving xDS
// or not).
package xds

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	gosync "sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/iidp/metasync/internal/admission"
	msync "github.com/iidp/metasync/sync"
)

// The type URLs of the four resources.
const (
	TypeListener = "type.googleapis.com/envoy.config.listener.v3.Listener"
	TypeRoute    = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
	TypeCluster  = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	TypeEndpoint = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
)

// MaxNames bounds the resources of one type that one stream may ask for.
const MaxNames = 1000

// MaxNameLength bounds a resource name: kind, index or chain, and key.
const MaxNameLength = 1024

// typeNames are the short names of the types, for metrics and logs.
var typeNames = map[string]string{TypeListener: "listener", TypeRoute: "route", TypeCluster: "cluster", TypeEndpoint: "endpoint"}

// allTypes are the four types, in the order a push sends them.
var allTypes = []string{TypeListener, TypeRoute, TypeCluster, TypeEndpoint}

// Engine is what the server reads of the engine.
type Engine interface {
	HasIndex(index string) bool
	HasChain(chain string) bool
	// Indexes and Chains name what exists, for a did-you-mean.
	Indexes() []msync.IndexInfo
	Chains() []msync.ChainInfo
	Subscribe(ctx context.Context, t msync.Target) (*msync.Subscription, error)
	// Answers reads several targets from one state of the engine.
	Answers(ts ...msync.Target) []msync.Answer
	// StaleChanged is closed at a reload (among other changes): targets
	// may have come or gone.
	StaleChanged() <-chan struct{}
	// HomeCluster names the home cluster of a config that reads
	// several, whose endpoints come first; "" for none.
	HomeCluster() string
}

// Authorizer decides what a client may read, as auth.TokenAuth.Check
// does for HTTP: whether the caller of r (the bearer token of the
// stream's "authorization" metadata) is authenticated (thing "") or may
// get thing, the non-resource URL that the HTTP lookup of the same
// target asks about (/v1/indexes/INDEX/* or /v1/chains/CHAIN/*). It
// answers the user's name and 0, or the HTTP status that refuses
// (401, 403, or 503 when it cannot tell now) and why.
type Authorizer func(r *http.Request, thing string) (user string, code int, msg string)

// recheckEvery is how often the access of a client with an Authorizer
// is asked again while its answers do not change: access taken away
// ends what it reads within about this long (and the Authorizer's own
// cache time).
var recheckEvery = 10 * time.Second

// Server is the ADS server of one engine: serve it with its Transport,
// on its Listener (which adds the connection limits).
type Server struct {
	engine Engine
	log    *slog.Logger
	cache  *cache

	nackLog rate.Sometimes
	badLog  rate.Sometimes
	connLog rate.Sometimes // the HTTP/2 server's lines (see connLog)
	// One budget of log lines each: clients refused (no valid token)
	// must not use up the lines of targets denied, nor the reverse; nor
	// refusals at a limit those of either.
	refusedLog rate.Sometimes
	deniedLog  rate.Sometimes
	unsureLog  rate.Sometimes
	refusals   *admission.Refusals // at a limit: logged a few times every 10 s
	// unknownLog: each client logs an unknown index or chain once; a
	// fleet that asks for one still writes a few lines every 10 s.
	unknownLog rate.Sometimes

	authorize Authorizer // nil: every client reads every target

	limits Limits
	gate   gate

	clients prometheus.Gauge
	pushes  *prometheus.CounterVec
	pushed  map[string]func() // counts a response of a type URL written
	nacks   *prometheus.CounterVec
	refused *prometheus.CounterVec

	mu        gosync.Mutex
	connected map[*client]struct{} // for Clients
}

// New returns the server of engine, with DefaultLimits; its metrics are
// registered with reg.
func New(engine Engine, log *slog.Logger, reg prometheus.Registerer) *Server {
	s := &Server{
		engine:     engine,
		log:        log,
		nackLog:    rate.Sometimes{First: 3, Interval: time.Minute},
		badLog:     rate.Sometimes{First: 3, Interval: time.Minute},
		connLog:    rate.Sometimes{First: 3, Interval: time.Minute},
		refusedLog: rate.Sometimes{First: 3, Interval: time.Minute},
		deniedLog:  rate.Sometimes{First: 3, Interval: time.Minute},
		unsureLog:  rate.Sometimes{First: 3, Interval: time.Minute},
		unknownLog: rate.Sometimes{First: 10, Interval: 10 * time.Second},
		limits:     DefaultLimits(),
		clients:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "metasync_xds_clients", Help: "xDS clients connected (ADS streams open)."}),
		pushes:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "metasync_xds_pushes_total", Help: "xDS responses sent, by resource type."}, []string{"type"}),
		nacks:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "metasync_xds_nacks_total", Help: "xDS responses that a client rejected, by resource type."}, []string{"type"}),
		refusals: admission.NewRefusals(prometheus.CounterOpts{Name: "metasync_xds_refused_total",
			Help: "xDS connections and streams refused or ended at a limit, by reason: connections, connections_per_caller, streams_per_caller, names_per_caller, headroom, first_request."},
			refusalReasons, 3, 10*time.Second),
	}
	s.refused = s.refusals.Metric
	// Every series from the start: an alert on a rate sees the first NACK.
	for _, t := range typeNames {
		s.nacks.WithLabelValues(t)
		s.pushes.WithLabelValues(t)
	}
	s.pushed = make(map[string]func(), len(typeNames))
	for typeURL, t := range typeNames {
		s.pushed[typeURL] = s.pushes.WithLabelValues(t).Inc
	}
	s.cache = newCache(engine, s.encodeAnswer)
	s.gate.s = s
	if reg != nil {
		reg.MustRegister(s.clients, s.pushes, s.nacks, s.refused, statusCollector{s})
	}
	return s
}

// SetAuthorizer makes every client authenticate, and read only the
// targets that a says it may; call it before the server serves.
func (s *Server) SetAuthorizer(a Authorizer) { s.authorize = a }

// target is what a resource name asks for: a key of an index or a chain.
type target struct {
	kind, name, key string // kind: "indexes" or "chains"
}

// parseTarget reads a Listener name: the first two segments are kind and
// name, the rest, percent-decoded, the key (grpc-go decodes the target's
// path, grpc-js keeps it: both read the same).
func parseTarget(s string) (target, bool) {
	s = strings.TrimPrefix(s, "/")
	kind, rest, ok := strings.Cut(s, "/")
	if !ok || kind != "indexes" && kind != "chains" {
		return target{}, false
	}
	name, key, ok := strings.Cut(rest, "/")
	if !ok || name == "" || key == "" {
		return target{}, false
	}
	if k, err := url.PathUnescape(key); err == nil {
		key = k
	}
	return target{kind, name, key}, true
}

// clusterName is the Cluster (and assignment) of a target, one name per
// target whatever the form its Listener was asked in.
func (t target) clusterName() string {
	return t.kind + "/" + t.name + "/" + url.PathEscape(t.key)
}

// access is the non-resource URL whose "get" reading t needs: that of
// its HTTP lookup.
func (t target) access() string {
	return "/v1/" + t.kind + "/" + url.PathEscape(t.name) + "/*"
}

func (t target) msync() msync.Target {
	if t.kind == "chains" {
		return msync.ChainOf(t.name, t.key)
	}
	return msync.KeyOf(t.name, t.key)
}

// exists reports whether the engine has t's index or chain.
func (s *Server) exists(t target) bool {
	if t.kind == "chains" {
		return s.engine.HasChain(t.name)
	}
	return s.engine.HasIndex(t.name)
}
