package plan

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"strconv"
)

// Diff is what applying one plan after another does to the resource
// entries, by name: each is started, stopped, restarted (its definition
// changed) or kept (the same watch, resourceVersion and indexes); and to
// the chains: added, removed, or changed (other indexes).
type Diff struct {
	Start, Stop, Restart, Keep []string // new config order; Stop in the old one
	// Chains, in the new config's order; ChainsRemoved in the old one.
	ChainsAdded, ChainsRemoved, ChainsChanged []string
	// Unique names the indexes of kept entries that become unique or stop
	// being so: their answers change, from the objects held.
	Unique []string
}

// Compare returns the Diff from old to next.
func Compare(old, next *Plan) Diff {
	var d Diff
	was := map[string]*Resource{}
	for _, r := range old.Resources {
		was[r.Name] = r
	}
	now := map[string]bool{}
	for _, r := range next.Resources {
		now[r.Name] = true
		switch o, ok := was[r.Name]; {
		case !ok:
			d.Start = append(d.Start, r.Name)
		case SameResource(o, r):
			d.Keep = append(d.Keep, r.Name)
			for i, ix := range r.Indexes {
				if ix.Unique != o.Indexes[i].Unique {
					d.Unique = append(d.Unique, ix.Name)
				}
			}
		default:
			d.Restart = append(d.Restart, r.Name)
		}
	}
	for _, r := range old.Resources {
		if !now[r.Name] {
			d.Stop = append(d.Stop, r.Name)
		}
	}
	chainWas := map[string][]string{}
	for _, ch := range old.Chains {
		chainWas[ch.Name] = ch.Indexes
	}
	chains := map[string]bool{}
	for _, ch := range next.Chains {
		chains[ch.Name] = true
		switch idx, ok := chainWas[ch.Name]; {
		case !ok:
			d.ChainsAdded = append(d.ChainsAdded, ch.Name)
		case !slices.Equal(idx, ch.Indexes):
			d.ChainsChanged = append(d.ChainsChanged, ch.Name)
		}
	}
	for _, ch := range old.Chains {
		if !chains[ch.Name] {
			d.ChainsRemoved = append(d.ChainsRemoved, ch.Name)
		}
	}
	return d
}

// SameResource reports whether two entries define the same watch and the
// same indexes: GVR, namespace, selectors, resync, fields and index rules
// and bounds.
func SameResource(a, b *Resource) bool {
	return a.Resync == b.Resync && SameData(a, b)
}

// SameData reports whether two entries yield the same objects and indexes
// from the same cluster: SameResource without the resync period, which
// changes when a list happens, not what it yields (see DataHash).
func SameData(a, b *Resource) bool {
	if a.Name != b.Name || a.GVR != b.GVR || a.Namespace != b.Namespace ||
		a.LabelSelector != b.LabelSelector || a.FieldSelector != b.FieldSelector ||
		!slices.Equal(a.Clusters, b.Clusters) {
		return false
	}
	if !slices.EqualFunc(a.Fields, b.Fields, func(x, y Field) bool {
		return x.Name == y.Name && sameRule(x.Rule, y.Rule)
	}) {
		return false
	}
	return slices.EqualFunc(a.Indexes, b.Indexes, func(x, y Index) bool {
		return x.Name == y.Name && sameRule(x.Key, y.Key) && sameRule(x.Value, y.Value) &&
			x.MaxEntries == y.MaxEntries && x.MaxBytes == y.MaxBytes
	})
}

func sameRule(a, b *Rule) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.src == b.src
}

// DataHash hashes what defines the objects the resource entries of p
// hold: for each resource entry in order, its name, GVR, namespace, selectors,
// fields and index rules and bounds (SameResource without the resync
// period, which changes when a list happens, not what it yields). A
// snapshot of the indexes is valid for a plan of the same DataHash only.
func (p *Plan) DataHash() [32]byte {
	h := sha256.New()
	str := func(s string) {
		var n [binary.MaxVarintLen64]byte
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		h.Write([]byte(s))
	}
	rule := func(r *Rule) {
		if r == nil {
			str("\x00nil")
			return
		}
		str(r.src)
	}
	str("metasync resources v1")
	for _, r := range p.Resources {
		for _, s := range []string{r.Name, r.GVR.Group, r.GVR.Version, r.GVR.Resource, r.Namespace, r.LabelSelector, r.FieldSelector} {
			str(s)
		}
		str(strconv.Itoa(len(r.Fields)))
		for _, f := range r.Fields {
			str(f.Name)
			rule(f.Rule)
		}
		str(strconv.Itoa(len(r.Indexes)))
		for _, ix := range r.Indexes {
			str(ix.Name)
			rule(ix.Key)
			rule(ix.Value)
			str(strconv.Itoa(ix.MaxEntries))
			str(strconv.Itoa(ix.MaxBytes))
		}
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}
