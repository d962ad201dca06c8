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
// The server is hand-written, on net/http's HTTP/2 and protowire, rather
// than on go-control-plane's server and snapshot cache: resources are
// built on demand per target and client (there is no fixed snapshot to
// publish); a version a client rejects is not sent again until the
// answer changes, where go-control-plane's cache re-sends a rejected
// version in a loop; and the daemon links neither gRPC nor the generated
// xDS packages (about 10 MB of resident memory in every process that
// imports them, serving xDS or not).
package xds

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	gosync "sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	msync "github.com/iidp/metasync/sync"
)

// The type URLs of the four resources.
const (
	TypeListener = "type.googleapis.com/envoy.config.listener.v3.Listener"
	TypeRoute    = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
	TypeCluster  = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	TypeEndpoint = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
)

// MaxNames bounds the resources of one type that one client may ask for:
// each assignment it follows holds a subscription of the engine.
const MaxNames = 1000

// MaxNameLength bounds a resource name: kind, index or chain, and key.
const MaxNameLength = 1024

// typeNames are the short names of the types, for metrics and logs.
var typeNames = map[string]string{TypeListener: "listener", TypeRoute: "route", TypeCluster: "cluster", TypeEndpoint: "endpoint"}

// Engine is what the server reads of the engine.
type Engine interface {
	HasIndex(index string) bool
	HasChain(chain string) bool
	Subscribe(ctx context.Context, t msync.Target) (*msync.Subscription, error)
	// StaleChanged is closed at a reload (among other changes): targets
	// may have come or gone.
	StaleChanged() <-chan struct{}
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

// Server is the ADS server of one engine: an http.Handler of HTTP/2
// (serve it with unencrypted HTTP/2 allowed, or over TLS).
type Server struct {
	engine  Engine
	log     *slog.Logger
	nackLog rate.Sometimes
	badLog  rate.Sometimes

	authorize Authorizer // nil: every client reads every target
	// One budget of log lines each: clients refused (no valid token)
	// must not use up the lines of targets denied, nor the reverse.
	refusedLog rate.Sometimes
	deniedLog  rate.Sometimes
	unsureLog  rate.Sometimes

	clients prometheus.Gauge
	pushes  *prometheus.CounterVec
	nacks   *prometheus.CounterVec

	mu        gosync.Mutex
	connected map[*client]struct{} // for Clients
}

// New returns the server of engine; its metrics are registered with reg.
func New(engine Engine, log *slog.Logger, reg prometheus.Registerer) *Server {
	s := &Server{
		engine:     engine,
		log:        log,
		nackLog:    rate.Sometimes{First: 3, Interval: time.Minute},
		badLog:     rate.Sometimes{First: 3, Interval: time.Minute},
		refusedLog: rate.Sometimes{First: 3, Interval: time.Minute},
		deniedLog:  rate.Sometimes{First: 3, Interval: time.Minute},
		unsureLog:  rate.Sometimes{First: 3, Interval: time.Minute},
		clients:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "metasync_xds_clients", Help: "xDS clients connected (ADS streams open)."}),
		pushes:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "metasync_xds_pushes_total", Help: "xDS responses sent, by resource type."}, []string{"type"}),
		nacks:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "metasync_xds_nacks_total", Help: "xDS responses that a client rejected, by resource type."}, []string{"type"}),
	}
	if reg != nil {
		reg.MustRegister(s.clients, s.pushes, s.nacks, resourcesCollector{s})
	}
	return s
}

// resourcesDesc is metasync_xds_resources: what the connected clients
// follow, counted when scraped.
var resourcesDesc = prometheus.NewDesc("metasync_xds_resources", "xDS resources that the connected clients follow (each client's names, summed), by resource type.", []string{"type"}, nil)

type resourcesCollector struct{ s *Server }

func (c resourcesCollector) Describe(ch chan<- *prometheus.Desc) { ch <- resourcesDesc }

func (c resourcesCollector) Collect(ch chan<- prometheus.Metric) {
	n := map[string]int{}
	c.s.mu.Lock()
	cs := make([]*client, 0, len(c.s.connected))
	for cl := range c.s.connected {
		cs = append(cs, cl)
	}
	c.s.mu.Unlock()
	for _, cl := range cs {
		cl.statusMu.Lock()
		for typeURL, st := range cl.types {
			n[typeURL] += len(st.names)
		}
		cl.statusMu.Unlock()
	}
	for _, typeURL := range []string{TypeListener, TypeRoute, TypeCluster, TypeEndpoint} {
		ch <- prometheus.MustNewConstMetric(resourcesDesc, prometheus.GaugeValue, float64(n[typeURL]), typeNames[typeURL])
	}
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

// serve serves one client: its requests, and a push of an assignment
// each time a target's answer changes.
// r is its HTTP/2 request, user who it is (with an Authorizer).
func (s *Server) serve(ctx context.Context, stream *grpcStream, r *http.Request, user string) error {
	s.clients.Inc()
	defer s.clients.Dec()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c := &client{
		s:       s,
		since:   time.Now(),
		ctx:     ctx,
		stream:  stream,
		req:     r,
		user:    user,
		types:   map[string]*typeState{},
		follow:  map[string]*follower{},
		changed: make(chan struct{}, 1),
		again:   make(chan struct{}, 1),
	}
	defer c.stopAll()
	s.mu.Lock()
	if s.connected == nil {
		s.connected = map[*client]struct{}{}
	}
	s.connected[c] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.connected, c)
		s.mu.Unlock()
	}()
	reloaded := s.engine.StaleChanged()
	var recheck <-chan time.Time
	if s.authorize != nil {
		t := time.NewTicker(recheckEvery)
		defer t.Stop()
		recheck = t.C
	}
	reqs := make(chan request)
	errc := make(chan error, 1)
	go func() {
		for {
			b, err := stream.recv()
			if err == nil {
				var req request
				if req, err = decodeRequest(b); err == nil {
					select {
					case reqs <- req:
						continue
					case <-ctx.Done():
						return
					}
				}
				err = &statusError{codeInvalid, err.Error()}
			}
			errc <- err
			return
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case req := <-reqs:
			if err := c.request(req); err != nil {
				return err
			}
		case <-c.changed:
			// An answer changed: only assignments can differ.
			if err := c.pushChanged(TypeEndpoint); err != nil {
				return err
			}
		case <-c.again:
			if err := c.pushChanged(); err != nil {
				return err
			}
		case <-recheck:
			// The token may have gone, access may have been taken away
			// (or granted): answers are built again, and what changed
			// is sent.
			if _, code, msg := s.authorize(r, ""); code == http.StatusUnauthorized {
				return &statusError{codeUnauthenticated, msg}
			}
			if err := c.pushChanged(); err != nil {
				return err
			}
		case <-reloaded:
			// Targets a reload added or brought back: their followers
			// subscribe again, and Listeners and Clusters are answered
			// anew.
			reloaded = s.engine.StaleChanged()
			c.restartEnded()
			if err := c.pushChanged(); err != nil {
				return err
			}
		}
	}
}

// typeState is what one client holds of one type.
type typeState struct {
	names   []string // subscribed, sorted
	version int      // of the last response sent
	nonce   string   // of the last response sent
	acked   string   // the last version the client acknowledged
	nacked  string   // the last version it rejected, and why
	why     string
	// owed: a new subscription is to be answered, held back while
	// access could not be told.
	owed bool
	// sent is what the last response held, by resource name (its
	// encoded form), to send only what changed: a response the client
	// rejected is not sent again until something in it changes.
	sent map[string][]byte
}

// client is one ADS stream.
type client struct {
	s     *Server
	since time.Time
	// statusMu guards what Clients reads: node, zone and each type's
	// names, versions and last rejection.
	statusMu gosync.Mutex
	zone     string
	node     string
	ctx      context.Context
	stream   *grpcStream
	types    map[string]*typeState
	// req is the stream's request, for the Authorizer; user who the
	// client is; denied the targets it may not read, by access URL
	// (under statusMu), for the status route and to log once.
	req      *http.Request
	user     string
	denied   map[string]bool
	verdicts map[string]verdict // by access URL
	retry    *time.Timer        // a push again, after an access not told

	mu      gosync.Mutex
	follow  map[string]*follower // by cluster name
	changed chan struct{}        // a follower has a new answer
	again   chan struct{}        // access not told before: ask again
}

// follower keeps the answer of one target for one client.
type follower struct {
	t      target
	cancel context.CancelFunc
	// answered: the engine has answered once; values is its last answer
	// (under client.mu).
	answered bool
	values   []string
	gone     bool // a reload removed the target
	ended    bool // its subscription ended (gone, or unknown): restartEnded starts it again
	// zone is the client's (its bootstrap's node.locality.zone); local
	// the answer narrowed to it by the index's hints, as LookupAt
	// narrows it (nil until answered, or without a zone).
	zone  string
	local []string
}

func (c *client) state(typeURL string) *typeState {
	st := c.types[typeURL]
	if st == nil {
		st = &typeState{sent: map[string][]byte{}}
		c.types[typeURL] = st
	}
	return st
}

// request handles one DiscoveryRequest: an ACK, a NACK, or new names.
func (c *client) request(req request) error {
	c.statusMu.Lock()
	defer c.statusMu.Unlock()
	if c.node == "" {
		c.node, c.zone = req.nodeID, req.zone
	}
	typeURL := req.typeURL
	short, known := typeNames[typeURL]
	if !known {
		return nil // a type this server does not serve: nothing to say
	}
	st := c.state(typeURL)
	if nonce := req.responseNonce; nonce != "" && nonce != st.nonce {
		return nil // an answer to an older response: the newer one stands
	}
	switch {
	case req.nack:
		st.nacked, st.why = req.responseNonce, req.nackMessage
	case req.responseNonce != "":
		st.acked = req.responseNonce
	}
	if req.nack {
		c.s.nacks.WithLabelValues(short).Inc()
		c.s.nackLog.Do(func() {
			c.s.log.Warn("xDS client rejected a response; it is not sent again until the answer changes",
				"client", c.node, "type", short, "nonce", req.responseNonce, "error", req.nackMessage)
		})
	}
	for _, name := range req.resourceNames {
		if len(name) > MaxNameLength {
			return &statusError{codeInvalid, "a resource name of " + strconv.Itoa(len(name)) + " bytes, over " + strconv.Itoa(MaxNameLength)}
		}
	}
	names := slices.Clone(req.resourceNames)
	slices.Sort(names)
	names = slices.Compact(names)
	if len(names) > MaxNames {
		return &statusError{codeInvalid, "a request names " + strconv.Itoa(len(names)) + " resources of one type, over " + strconv.Itoa(MaxNames)}
	}
	if slices.Equal(names, st.names) && req.responseNonce != "" {
		return nil // an ACK or a NACK of what it holds: nothing new to send
	}
	st.names = names
	if typeURL == TypeEndpoint {
		c.followOnly(names)
	}
	c.pruneAccess()
	return c.respond(typeURL, true)
}

// respond sends the resources of typeURL for the names subscribed, when
// they differ from what was sent last, or always when asked (a new
// subscription is answered even when nothing changed).
func (c *client) respond(typeURL string, always bool) error {
	st := c.state(typeURL)
	always = always || st.owed
	sent := map[string][]byte{}
	held, heldNew := false, false
	for _, name := range st.names {
		b, err := c.resource(typeURL, name)
		switch {
		case errors.Is(err, errUnsure):
			// Access not told now: the client keeps what it holds.
			held = true
			if old, ok := st.sent[name]; ok {
				sent[name] = old
			} else {
				heldNew = true
			}
		case err != nil:
			return err
		case b != nil:
			sent[name] = b
		}
	}
	if held {
		c.retryLater()
		// A Listener or Cluster left out of a response does not exist:
		// not said of one whose access is not told.
		if heldNew && (typeURL == TypeListener || typeURL == TypeCluster) {
			st.owed = always
			return nil
		}
	}
	st.owed = false
	same := len(sent) == len(st.sent)
	for name, b := range sent {
		if old, ok := st.sent[name]; !ok || string(old) != string(b) {
			same = false
		}
	}
	if same && !always {
		return nil
	}
	// Listeners and Clusters are answered whole (state of the world): a
	// response without one says it does not exist. Assignments and route
	// configurations are answered one by one: one not known yet is left
	// out, and the client waits for it.
	if (typeURL == TypeEndpoint || typeURL == TypeRoute) && len(sent) == 0 {
		st.sent = sent
		return nil
	}
	st.version++
	st.nonce = strconv.Itoa(st.version)
	var resources [][]byte
	for _, name := range slices.Sorted(maps.Keys(sent)) {
		// Assignments and route configurations go one by one: a push
		// holds those that changed, so that one the client rejected
		// is not sent again with another's change.
		if old, ok := st.sent[name]; !always && ok && string(old) == string(sent[name]) && (typeURL == TypeEndpoint || typeURL == TypeRoute) {
			continue
		}
		resources = append(resources, sent[name])
	}
	if len(resources) == 0 && (typeURL == TypeEndpoint || typeURL == TypeRoute) {
		st.version-- // nothing to send: a removal only
		st.nonce = strconv.Itoa(st.version)
		st.sent = sent
		return nil
	}
	st.sent = sent
	if err := c.stream.send(encodeResponse(typeURL, st.nonce, st.nonce, resources)); err != nil {
		return err
	}
	c.s.pushes.WithLabelValues(typeNames[typeURL]).Inc()
	return nil
}

// verdict is what the Authorizer said of one target, kept for
// verdictTTL: a push to many clients asks it once a second per client
// and target, not once per resource type and push.
type verdict struct {
	code  int
	msg   string
	until time.Time
}

const verdictTTL = time.Second

// pruneAccess keeps the verdicts and denials of the targets that some
// type's names still ask for, and forgets the others (under statusMu).
func (c *client) pruneAccess() {
	if len(c.verdicts) == 0 && len(c.denied) == 0 {
		return
	}
	asked := map[string]bool{}
	for _, st := range c.types {
		for _, name := range st.names {
			if t, ok := parseTarget(name); ok {
				asked[t.access()] = true
			}
		}
	}
	for thing := range c.verdicts {
		if !asked[thing] {
			delete(c.verdicts, thing)
		}
	}
	for thing := range c.denied {
		if !asked[thing] {
			delete(c.denied, thing)
		}
	}
}

// errUnsure says that a target's access could not be told now (a review
// failed, or too many were in flight): its resources wait.
var errUnsure = errors.New("access not told now")

// retryLater pushes what changed again in a second: access that could
// not be told is asked again (under statusMu).
func (c *client) retryLater() {
	if c.retry != nil {
		c.retry.Reset(time.Second)
		return
	}
	c.retry = time.AfterFunc(time.Second, func() {
		select {
		case c.again <- struct{}{}:
		default:
		}
	})
}

// may tells whether the client may read t: always without an
// Authorizer; errUnsure when it cannot be told now; a statusError that
// ends the stream when the client's token is no longer valid. A denial
// is logged (at most three times a minute) and shown by the status
// route (under statusMu).
func (c *client) may(t target) (bool, error) {
	if c.s.authorize == nil {
		return true, nil
	}
	thing := t.access()
	now := time.Now()
	v, ok := c.verdicts[thing]
	if !ok || now.After(v.until) {
		_, code, msg := c.s.authorize(c.req, thing)
		v = verdict{code: code, msg: msg, until: now.Add(verdictTTL)}
		if code == 0 || code == http.StatusForbidden {
			if c.verdicts == nil {
				c.verdicts = map[string]verdict{}
			}
			c.verdicts[thing] = v
		}
	}
	code, msg := v.code, v.msg
	switch code {
	case 0:
		delete(c.denied, thing)
		return true, nil
	case http.StatusForbidden:
		if !c.denied[thing] {
			if c.denied == nil {
				c.denied = map[string]bool{}
			}
			c.denied[thing] = true
			c.s.deniedLog.Do(func() {
				c.s.log.Warn("xDS client may not read a target: its Listener does not exist for it",
					"client", c.node, "user", c.user, "access", thing, "error", msg)
			})
		}
		return false, nil
	case http.StatusUnauthorized:
		return false, &statusError{codeUnauthenticated, msg}
	}
	c.s.unsureLog.Do(func() {
		c.s.log.Warn("xDS: a client's access could not be told: it keeps the resources it holds, not updated, until a review answers",
			"client", c.node, "user", c.user, "access", thing, "status", code, "error", msg)
	})
	return false, errUnsure
}

// resource encodes the resource name of typeURL, or is nil when there is
// none (an unknown target, one the client may not read, an assignment
// not answered yet); the error is may's.
func (c *client) resource(typeURL, name string) ([]byte, error) {
	t, ok := parseTarget(name)
	if !ok {
		return nil, nil
	}
	if !c.exists(t) || (typeURL == TypeCluster || typeURL == TypeEndpoint) && t.clusterName() != name {
		return nil, nil
	}
	if ok, err := c.may(t); !ok {
		if typeURL == TypeEndpoint {
			c.unfollow(name) // what it may not read, it does not follow
		}
		return nil, err
	}
	if typeURL == TypeEndpoint {
		c.followOne(name, t)
	}
	switch typeURL {
	case TypeListener:
		return encodeListener(name), nil
	case TypeRoute:
		return encodeRoute(name, t.clusterName()), nil
	case TypeCluster:
		return encodeCluster(name), nil
	case TypeEndpoint:
		c.mu.Lock()
		f := c.follow[name]
		var values, local []string
		var zone string
		answered := f != nil && f.answered && !f.gone
		if answered {
			values, local, zone = f.values, f.local, f.zone
		}
		c.mu.Unlock()
		if !answered {
			return nil, nil
		}
		return c.assignment(name, values, local, zone), nil
	}
	return nil, nil
}

func (c *client) exists(t target) bool {
	if t.kind == "chains" {
		return c.s.engine.HasChain(t.name)
	}
	return c.s.engine.HasIndex(t.name)
}

// followOnly stops following the assignments not in names (those in
// names are followed once resource finds them readable: see followOne).
func (c *client) followOnly(names []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	want := make(map[string]bool, len(names))
	for _, name := range names {
		want[name] = true
	}
	for name, f := range c.follow {
		if !want[name] {
			f.cancel()
			delete(c.follow, name)
		}
	}
}

// followOne follows the target t of the assignment name, unless it does.
func (c *client) followOne(name string, t target) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.follow[name]; ok {
		return
	}
	ctx, cancel := context.WithCancel(c.ctx)
	f := &follower{t: t, cancel: cancel, zone: c.zone}
	c.follow[name] = f
	go c.run(ctx, f)
}

// unfollow stops following the assignment name.
func (c *client) unfollow(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f, ok := c.follow[name]; ok {
		f.cancel()
		delete(c.follow, name)
	}
}

// restartEnded subscribes again the followers whose subscription ended.
func (c *client) restartEnded() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range c.follow {
		if f.ended {
			f.cancel()
			var ctx context.Context
			ctx, f.cancel = context.WithCancel(c.ctx)
			f.ended = false
			go c.run(ctx, f)
		}
	}
}

// run follows one target's answers until ctx ends, or the target is gone
// or unknown.
func (c *client) run(ctx context.Context, f *follower) {
	defer func() {
		c.mu.Lock()
		f.ended = ctx.Err() == nil
		c.mu.Unlock()
	}()
	sub, err := c.s.engine.Subscribe(ctx, f.t.msync())
	if err != nil {
		return // an unknown target: it has no Listener either
	}
	defer sub.Close()
	if f.zone != "" {
		go c.runLocal(ctx, f)
	}
	for {
		ev, err := sub.Next(ctx)
		if err != nil {
			return
		}
		c.mu.Lock()
		switch ev.Type {
		case msync.EventSnapshot, msync.EventUpdate:
			f.answered, f.values, f.gone = true, ev.Values, false
		case msync.EventGone:
			f.gone = true
		default:
			c.mu.Unlock()
			continue
		}
		c.mu.Unlock()
		select {
		case c.changed <- struct{}{}:
		default:
		}
		if ev.Type == msync.EventGone {
			return
		}
	}
}

// runLocal follows the target's answer for a caller in the client's
// zone (the endpoints hinted for it, or all when none is), until ctx
// ends.
func (c *client) runLocal(ctx context.Context, f *follower) {
	t := f.t.msync()
	t.At = msync.Locality{Zone: f.zone}
	sub, err := c.s.engine.Subscribe(ctx, t)
	if err != nil {
		return
	}
	defer sub.Close()
	for {
		ev, err := sub.Next(ctx)
		if err != nil {
			return
		}
		if ev.Type != msync.EventSnapshot && ev.Type != msync.EventUpdate {
			continue
		}
		c.mu.Lock()
		f.local = ev.Values
		c.mu.Unlock()
		select {
		case c.changed <- struct{}{}:
		default:
		}
	}
}

// pushChanged sends what changed of the types given (all four when
// none): assignments, and the Listeners and Clusters of targets that a
// reload removed or whose access changed.
func (c *client) pushChanged(types ...string) error {
	c.statusMu.Lock()
	defer c.statusMu.Unlock()
	if len(types) == 0 {
		types = []string{TypeListener, TypeRoute, TypeCluster, TypeEndpoint}
	}
	for _, typeURL := range types {
		if st := c.types[typeURL]; st != nil && len(st.names) > 0 {
			if err := c.respond(typeURL, false); err != nil {
				return err
			}
		}
	}
	return nil
}

func (c *client) stopAll() {
	c.statusMu.Lock()
	if c.retry != nil {
		c.retry.Stop()
	}
	c.statusMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range c.follow {
		f.cancel()
	}
}

// assignment is the ClusterLoadAssignment of values: each host:port once
// (gRPC rejects a whole assignment with a duplicate address). A value
// that is not host:port is left out, and logged. With a zone whose
// narrowed answer (local) is a part of values, not all of it, the local
// endpoints are a locality of that zone at priority 0 and the others one
// at priority 1, so that gRPC fails over by itself; else one locality.
func (c *client) assignment(name string, values, local []string, zone string) []byte {
	eps := c.endpoints(name, values)
	near := c.endpoints(name, local)
	if zone == "" || len(near) == 0 || len(near) >= len(eps) {
		return encodeAssignment(name, []locality{{eps: eps}})
	}
	isNear := map[endpoint]bool{}
	for _, e := range near {
		isNear[e] = true
	}
	var far []endpoint
	for _, e := range eps {
		if !isNear[e] {
			far = append(far, e)
		}
	}
	groups := []locality{{zone: zone, eps: near}}
	if len(far) > 0 {
		groups = append(groups, locality{priority: 1, eps: far})
	}
	return encodeAssignment(name, groups)
}

// endpoints reads values as host:port, each once, in one spelling.
func (c *client) endpoints(name string, values []string) []endpoint {
	var eps []endpoint
	seen := map[string]bool{}
	for _, v := range values {
		host, port, err := net.SplitHostPort(v)
		p, perr := strconv.ParseUint(port, 10, 16)
		if err != nil || perr != nil || host == "" || p == 0 {
			c.s.badLog.Do(func() {
				c.s.log.Warn("xDS: a value that is not host:port is left out of the assignment", "target", name, "value", v)
			})
			continue
		}
		if ip := net.ParseIP(host); ip != nil {
			host = ip.String() // one spelling of each address
		}
		addr := net.JoinHostPort(host, strconv.FormatUint(p, 10))
		if seen[addr] {
			continue
		}
		seen[addr] = true
		eps = append(eps, endpoint{host, uint32(p)})
	}
	return eps
}

// ClientStatus is what one connected xDS client holds, for the status
// route: its node, and per resource type the names it asked for, the
// version last sent, the last it acknowledged, and the last it rejected
// with why.
type ClientStatus struct {
	Node string `json:"node"`
	// User is who the client authenticated as; Denied the access URLs
	// of the targets it asked for and may not read (with an Authorizer).
	User      string                `json:"user,omitempty"`
	Denied    []string              `json:"denied,omitempty"`
	Zone      string                `json:"zone,omitempty"`
	Connected time.Time             `json:"connected"`
	Types     map[string]TypeStatus `json:"types"`
}

// TypeStatus is one resource type of a ClientStatus.
type TypeStatus struct {
	Names    []string `json:"names"`
	Sent     string   `json:"sent,omitempty"`
	Acked    string   `json:"acked,omitempty"`
	Rejected string   `json:"rejected,omitempty"`
	Why      string   `json:"why,omitempty"`
}

// Clients describes every connected client, ordered by node and time of
// connection.
func (s *Server) Clients() []ClientStatus {
	s.mu.Lock()
	cs := make([]*client, 0, len(s.connected))
	for c := range s.connected {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	out := make([]ClientStatus, 0, len(cs))
	for _, c := range cs {
		c.statusMu.Lock()
		st := ClientStatus{Node: c.node, User: c.user, Zone: c.zone, Connected: c.since, Types: map[string]TypeStatus{}}
		if len(c.denied) > 0 {
			st.Denied = slices.Sorted(maps.Keys(c.denied))
		}
		for typeURL, ts := range c.types {
			st.Types[typeNames[typeURL]] = TypeStatus{Names: slices.Clone(ts.names), Sent: ts.nonce, Acked: ts.acked, Rejected: ts.nacked, Why: ts.why}
		}
		c.statusMu.Unlock()
		out = append(out, st)
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
