package xds

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	mplan "github.com/iidp/metasync/internal/plan"
	"github.com/iidp/metasync/internal/wire"
)

// UnknownTarget is a resource name that a client asked for and that no
// index or chain answers (a misspelt target): it has no Listener, and
// gRPC waits out its resource timer before it fails the calls.
type UnknownTarget = wire.XDSUnknown

// markUnknown records that the client asked for name, which no index or
// chain answers (t, when ok, is what it parses as), and logs it the first
// time this client asks for that index or chain.
func (c *client) markUnknown(name string, t target, ok bool) {
	if _, seen := c.unknown[name]; seen {
		return
	}
	why := c.s.whyUnknown(name, t, ok)
	if c.unknown == nil {
		c.unknown = map[string]string{}
	}
	c.unknown[name] = why
	c.unknownChanged = true
	what := name
	if ok {
		what = t.kind + "/" + t.name
	}
	if c.logged == nil {
		c.logged = map[string]bool{}
	}
	if !c.logged[what] {
		c.logged[what] = true
		c.s.unknownLog.Do(func() {
			c.s.log.Warn("xDS client asked for an unknown index or chain: it has no Listener, and the client's calls fail once its resource timer ends",
				"client", c.node, "name", name, "error", why)
		})
	}
}

// markKnown forgets that name was unknown (a reload added its index or
// chain).
func (c *client) markKnown(name string) {
	if _, was := c.unknown[name]; was {
		delete(c.unknown, name)
		c.unknownChanged = true
	}
}

// pruneUnknown forgets the unknown names that no type asks for any more.
func (c *client) pruneUnknown() {
	if len(c.unknown) == 0 {
		return
	}
	asked := map[string]bool{}
	for _, st := range c.types {
		for _, name := range st.names {
			asked[name] = true
		}
	}
	for name := range c.unknown {
		if !asked[name] {
			delete(c.unknown, name)
			c.unknownChanged = true
		}
	}
}

// unknownStatus is the client's unknown names, sorted, for the status
// copy.
func (c *client) unknownStatus() []UnknownTarget {
	out := make([]UnknownTarget, 0, len(c.unknown))
	for _, name := range slices.Sorted(maps.Keys(c.unknown)) {
		out = append(out, UnknownTarget{Name: name, Error: c.unknown[name]})
	}
	return out
}

// whyUnknown says why name answers nothing: it is not a target, or its
// index or chain does not exist (with the closest that does, and the
// other kind when the name is one).
func (s *Server) whyUnknown(name string, t target, ok bool) string {
	if !ok {
		return fmt.Sprintf("%q is not a target: targets are xds:///chains/CHAIN/KEY and xds:///indexes/INDEX/KEY", name)
	}
	var indexes, chains []string
	for _, ix := range s.engine.Indexes() {
		indexes = append(indexes, ix.Name)
	}
	for _, ch := range s.engine.Chains() {
		chains = append(chains, ch.Name)
	}
	kind, known, other, otherKind := "chain", chains, indexes, "indexes"
	if t.kind == "indexes" {
		kind, known, other, otherKind = "index", indexes, chains, "chains"
	}
	if slices.Contains(other, t.name) {
		return fmt.Sprintf("no %s %q: it is one of the %s: xds:///%s/%s/KEY", kind, t.name, otherKind, otherKind, t.name)
	}
	msg := fmt.Sprintf("no %s %q", kind, t.name)
	if hint := mplan.Closest(t.name, known); hint != "" {
		return msg + fmt.Sprintf(" (did you mean %s? xds:///%s/%s/KEY)", hint, t.kind, hint)
	}
	if len(known) == 0 {
		return msg + " (the config has none)"
	}
	return msg + " (" + t.kind + ": " + strings.Join(known, ", ") + ")"
}
