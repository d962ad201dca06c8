// Package grpcresolver makes metasync a gRPC name resolver: a client dials
// one target and follows the addresses behind a model as pods come and go.
//
//	conn, err := grpc.NewClient("metasync:///chains/model-to-addresses/model1?port=9000",
//		grpc.WithResolvers(grpcresolver.NewBuilder(engine)),
//		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`),
//		grpc.WithTransportCredentials(creds))
//
// Targets are metasync:///chains/CHAIN/KEY or metasync:///indexes/INDEX/KEY
// (a key holding "/" is percent-encoded). Each value of the answer is an
// address: "host:port" is used as it is; a bare host takes the port of
// ?port=N (a bare host without ?port is left out, and the error reported).
//
// NewBuilder resolves in process, from the subscriptions of a sync.Reader:
// the engine, or metasynctest's Fake, with which a unit test checks its
// routing with no cluster (see ExampleNewBuilder); NewRemoteBuilder through a daemon's change streams (metasync serve, say
// a node-local DaemonSet), so that the pod itself watches nothing.
//
// The resolver publishes the whole answer each time it changes, every
// address once, in resolver.State's Endpoints and Addresses both. An empty
// answer empties the channel's addresses: RPCs then fail with UNAVAILABLE
// (or wait, with grpc.WaitForReady), never reach pods the index no longer
// holds. Every ClientConn of one builder that dials the same target shares
// one subscription (or one stream). ResolveNow costs nothing: changes are
// pushed.
//
// This package is the only one of metasync that imports grpc-go: a program
// that does not import it does not link grpc.
package grpcresolver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	gosync "sync"
	"time"

	"google.golang.org/grpc/resolver"

	msync "github.com/iidp/metasync/sync"
)

// Scheme is the scheme of metasync targets.
const Scheme = "metasync"

// Option configures a builder.
type Option func(*options)

type options struct {
	tokenFile  string
	caFile     string
	serverName string
	at         msync.Locality
	log        *slog.Logger
}

// WithLocality says where the client runs (its zone, and its node's name),
// for topology-aware answers: through an index with hints (the reference
// setup's service-to-endpoints), the channel gets the endpoints hinted for
// its node or zone when every endpoint is hinted and some are for it, as
// kube-proxy routes, and every endpoint otherwise. In process and remote
// (sent as ?zone= and ?node=). Default: no locality, every endpoint.
func WithLocality(l msync.Locality) Option { return func(o *options) { o.at = l } }

// WithTokenFile makes a remote builder send the bearer token in path to a
// daemon that runs with --auth=tokenreview; the file is read again for
// each connection, so that a rotated token (a projected service account
// token) is picked up. Give it a token for the daemon's --auth-audience
// (a projected token with that audience), not one the apiserver accepts,
// and an https:// daemon URL. Default: no token.
func WithTokenFile(path string) Option { return func(o *options) { o.tokenFile = path } }

// WithCAFile makes a remote builder verify an https:// daemon's
// certificate against the PEM CA certificates in path, read again for
// each connection, so that a rotated CA is picked up. Default: the
// system's roots.
func WithCAFile(path string) Option { return func(o *options) { o.caFile = path } }

// WithServerName makes a remote builder check an https:// daemon's
// certificate for name instead of the daemon URL's host: a node-local
// daemon reached at its node's IP presents a certificate for its
// Service's name. Default: the URL's host.
func WithServerName(name string) Option { return func(o *options) { o.serverName = name } }

// WithLogger sets the logger of the builder (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

func newOptions(opts []Option) options {
	o := options{log: slog.Default()}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// target is a parsed metasync target.
type target struct {
	kind string // "chains" or "indexes"
	name string // the chain or index
	key  string
	port string // "" when absent
}

// id names the answer that a target follows; targets that differ only in
// their port share it.
func (t target) id() string { return t.kind + "\x00" + t.name + "\x00" + t.key }

func (t target) String() string {
	s := "metasync:///" + t.kind + "/" + url.PathEscape(t.name) + "/" + url.PathEscape(t.key)
	if t.port != "" {
		s += "?port=" + t.port
	}
	return s
}

// parseTarget reads metasync:///chains/CHAIN/KEY[?port=N] or
// metasync:///indexes/INDEX/KEY[?port=N].
func parseTarget(rt resolver.Target) (target, error) {
	u := rt.URL
	if u.Host != "" {
		return target{}, fmt.Errorf("metasync target %q: the authority must be empty (metasync:///chains/CHAIN/KEY)", u.String())
	}
	parts := strings.SplitN(strings.TrimPrefix(u.EscapedPath(), "/"), "/", 3)
	if len(parts) != 3 || (parts[0] != "chains" && parts[0] != "indexes") || parts[1] == "" {
		return target{}, fmt.Errorf("metasync target %q: want metasync:///chains/CHAIN/KEY or metasync:///indexes/INDEX/KEY", u.String())
	}
	name, err1 := url.PathUnescape(parts[1])
	key, err2 := url.PathUnescape(parts[2])
	if err := errors.Join(err1, err2); err != nil {
		return target{}, fmt.Errorf("metasync target %q: %w", u.String(), err)
	}
	t := target{kind: parts[0], name: name, key: key}
	q := u.Query()
	for k := range q {
		if k != "port" {
			return target{}, fmt.Errorf("metasync target %q: unknown parameter %q (known: port)", u.String(), k)
		}
	}
	if p := q.Get("port"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return target{}, fmt.Errorf("metasync target %q: port %q is not a port number", u.String(), p)
		}
		t.port = p
	}
	return t, nil
}

// addresses turns an answer into addresses: "host:port" as it is, a bare
// host with port; each once, sorted. It returns the values it left out.
func addresses(values []string, port string) (addrs []string, bad []string) {
	for _, v := range values {
		if _, _, err := net.SplitHostPort(v); err == nil {
			addrs = append(addrs, v)
			continue
		}
		host := strings.TrimSuffix(strings.TrimPrefix(v, "["), "]")
		if port == "" || host == "" {
			bad = append(bad, v)
			continue
		}
		addrs = append(addrs, net.JoinHostPort(host, port))
	}
	slices.Sort(addrs)
	return slices.Compact(addrs), bad
}

// state is what the resolver gives its ClientConn for one answer.
func state(addrs []string) resolver.State {
	st := resolver.State{
		Addresses: make([]resolver.Address, len(addrs)),
		Endpoints: make([]resolver.Endpoint, len(addrs)),
	}
	for i, a := range addrs {
		st.Addresses[i] = resolver.Address{Addr: a}
		st.Endpoints[i] = resolver.Endpoint{Addresses: []resolver.Address{{Addr: a}}}
	}
	return st
}

// follower delivers one answer's changes to the resolvers that share it.
// A source (a subscription, or a daemon's stream) runs in a goroutine and
// calls publish or fail; resolvers join and leave.
type follower struct {
	mu      gosync.Mutex
	members map[*targetResolver]struct{}
	values  []string // the last answer; nil until the first
	seq     uint64   // numbers the answers, so that none overtakes a newer one
	known   bool
	err     error // the source's last error, nil once it answers again
	cancel  context.CancelFunc
	done    chan struct{}
}

// publish sends a new answer to every member.
func (f *follower) publish(values []string) {
	f.mu.Lock()
	f.seq++
	f.values, f.known, f.err = values, true, nil
	seq := f.seq
	members := f.snapshotMembers()
	f.mu.Unlock()
	for _, r := range members {
		r.push(values, seq, nil)
	}
}

// fail reports a source error to every member; they keep their addresses.
func (f *follower) fail(err error) {
	f.mu.Lock()
	f.err = err
	members := f.snapshotMembers()
	f.mu.Unlock()
	for _, r := range members {
		r.push(nil, 0, err)
	}
}

func (f *follower) snapshotMembers() []*targetResolver {
	out := make([]*targetResolver, 0, len(f.members))
	for r := range f.members {
		out = append(out, r)
	}
	return out
}

// hub shares followers among the resolvers of one builder.
type hub struct {
	mu        gosync.Mutex
	followers map[string]*follower
	check     func(t target) error                             // refuses a target at Build, or nil
	start     func(ctx context.Context, t target, f *follower) // runs the source until ctx ends
}

// join adds r to the follower of its target, starting the source for the
// first member, and gives r the current answer if there is one.
func (h *hub) join(r *targetResolver) {
	h.mu.Lock()
	f := h.followers[r.t.id()]
	if f == nil {
		ctx, cancel := context.WithCancel(context.Background())
		f = &follower{members: map[*targetResolver]struct{}{}, cancel: cancel, done: make(chan struct{})}
		h.followers[r.t.id()] = f
		go func() {
			defer close(f.done)
			h.start(ctx, r.t, f)
		}()
	}
	f.mu.Lock()
	r.f = f
	f.members[r] = struct{}{}
	values, seq, known, err := f.values, f.seq, f.known, f.err
	f.mu.Unlock()
	h.mu.Unlock()
	if known {
		r.push(values, seq, nil)
	}
	if err != nil {
		r.push(nil, 0, err)
	}
}

// leave removes r; the last member stops the source.
func (h *hub) leave(r *targetResolver) {
	h.mu.Lock()
	f := r.f
	f.mu.Lock()
	delete(f.members, r)
	last := len(f.members) == 0
	f.mu.Unlock()
	if last {
		delete(h.followers, r.t.id())
	}
	h.mu.Unlock()
	if last {
		f.cancel()
		<-f.done
	}
}

// followers returns how many answers a builder follows (one subscription
// or stream each); the tests read it (export_test.go).
func followers(b resolver.Builder) int {
	bb, ok := b.(*builder)
	if !ok {
		return 0
	}
	bb.hub.mu.Lock()
	defer bb.hub.mu.Unlock()
	return len(bb.hub.followers)
}

// builder is both builders: they differ in their source.
type builder struct {
	hub  *hub
	opts options
}

func (b *builder) Scheme() string { return Scheme }

func (b *builder) Build(rt resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	t, err := parseTarget(rt)
	if err != nil {
		return nil, err
	}
	if b.hub.check != nil {
		if err := b.hub.check(t); err != nil {
			return nil, err
		}
	}
	r := &targetResolver{t: t, cc: cc, hub: b.hub, log: b.opts.log.With("target", t.String())}
	b.hub.join(r)
	return r, nil
}

// targetResolver is the resolver of one ClientConn.
type targetResolver struct {
	t   target
	cc  resolver.ClientConn
	hub *hub
	f   *follower
	log *slog.Logger

	mu     gosync.Mutex // serializes calls into cc, in answer order
	seq    uint64       // of the last answer given to cc
	closed bool
}

// push gives cc answer number seq (values), unless it has a newer one, or
// reports a source error.
func (r *targetResolver) push(values []string, seq uint64, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	if err != nil {
		r.cc.ReportError(err)
		return
	}
	if seq <= r.seq {
		return
	}
	r.seq = seq
	addrs, bad := addresses(values, r.t.port)
	if len(bad) > 0 {
		r.log.Warn("values left out: not host:port, and the target has no ?port", "values", bad)
	}
	_ = r.cc.UpdateState(state(addrs)) // an empty answer is refused by most balancers: RPCs fail fast, as intended
}

// ResolveNow does nothing: the answer's changes are pushed.
func (r *targetResolver) ResolveNow(resolver.ResolveNowOptions) {}

// Close leaves the shared answer.
func (r *targetResolver) Close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.hub.leave(r)
}

// NewBuilder returns a resolver.Builder of the metasync scheme that
// resolves in process, from r's subscriptions: an *sync.Engine, or a
// metasynctest.Fake in a test.
func NewBuilder(r msync.Reader, opts ...Option) resolver.Builder {
	o := newOptions(opts)
	check := func(t target) error {
		if t.kind == "chains" && !hasChain(r, t.name) {
			return fmt.Errorf("metasync target %s: unknown chain %q", t, t.name)
		}
		if t.kind == "indexes" && !hasIndex(r, t.name) {
			return fmt.Errorf("metasync target %s: unknown index %q", t, t.name)
		}
		return nil
	}
	return &builder{opts: o, hub: &hub{followers: map[string]*follower{}, check: check, start: func(ctx context.Context, t target, f *follower) {
		follow := func(ctx context.Context, cluster string, s sink) { followEngine(ctx, r, t, s, cluster, o.at, o.log) }
		if home := homeOf(r); home != "" {
			runHomeFirst(ctx, f, follow, home)
			return
		}
		follow(ctx, "", f)
	}}}
}

// homeOf returns the home cluster of a Reader that reads several
// clusters and has one (an *sync.Engine, a metasynctest.Fake), else "".
func homeOf(r msync.Reader) string {
	if e, ok := inspected[interface{ HomeCluster() string }](r); ok {
		return e.HomeCluster()
	}
	return ""
}

// inspected returns r as a T: r itself when it is one (a wrapper's own
// methods come first), else the Inspector of the *sync.Engine that r is
// or embeds, when that is one.
func inspected[T any](r msync.Reader) (T, bool) {
	if e, ok := r.(T); ok {
		return e, true
	}
	if e, ok := r.(interface{ Inspect() *msync.Inspector }); ok {
		v, ok := any(e.Inspect()).(T)
		return v, ok
	}
	var none T
	return none, false
}

// hasIndex and hasChain ask the engine when the Reader is one (or tells
// it, as the test double does), and look through the lists otherwise.
func hasIndex(r msync.Reader, name string) bool {
	if e, ok := inspected[interface{ HasIndex(string) bool }](r); ok {
		return e.HasIndex(name)
	}
	return slices.ContainsFunc(r.Indexes(), func(ix msync.IndexInfo) bool { return ix.Name == name })
}

func hasChain(r msync.Reader, name string) bool {
	if e, ok := inspected[interface{ HasChain(string) bool }](r); ok {
		return e.HasChain(name)
	}
	return slices.ContainsFunc(r.Chains(), func(c msync.ChainInfo) bool { return c.Name == name })
}

// followEngine publishes a target's answers from an engine subscription
// (of cluster's part of it, when cluster is not "").
// When a config reload removes the target, the last addresses stay and
// the target is looked for again every goneRetry, so that a reload that
// brings it back resumes the updates.
func followEngine(ctx context.Context, engine msync.Reader, t target, f sink, cluster string, at msync.Locality, log *slog.Logger) {
	mt := msync.KeyOf(t.name, t.key)
	if t.kind == "chains" {
		mt = msync.ChainOf(t.name, t.key)
	}
	mt.At, mt.Cluster = at, cluster
	sub, err := engine.Subscribe(ctx, mt)
	if err != nil {
		f.fail(fmt.Errorf("metasync: %w", err))
		return
	}
	for {
		ev, err := sub.Next(ctx)
		if err != nil {
			sub.Close()
			if ctx.Err() == nil {
				log.Warn("subscription ended", "error", err.Error())
			}
			return
		}
		switch ev.Type {
		case msync.EventSnapshot, msync.EventUpdate:
			f.publish(ev.Values)
		case msync.EventGone:
			sub.Close()
			log.Warn("target removed by a config reload: keeping its last addresses, looking for it again", "target", t.kind+"/"+t.name)
			for sub = nil; sub == nil; {
				select {
				case <-ctx.Done():
					return
				case <-time.After(goneRetry):
				}
				sub, _ = engine.Subscribe(ctx, mt)
			}
		}
	}
}

// goneRetry is how often a target that a reload removed is looked for.
var goneRetry = 5 * time.Second
