package schema

import (
	"slices"

	"github.com/iidp/metasync/internal/plan"
)

// Changes is what a reload from one plan to another does: which resource
// entries start, stop, restart (their definition changed: GVR, namespace,
// selectors, resync, fields or index rules) or stay as they are, and what
// else differs. Names are in config order (Stop in the old config's).
type Changes struct {
	Start, Stop, Restart, Keep []string
	// Chains added, removed, or whose indexes changed.
	ChainsAdded, ChainsRemoved, ChainsChanged []string
	// Unique names the indexes that become unique or stop being so (of
	// resource entries kept: their answers change from the objects held).
	Unique []string
	// NotLive names the settings that changed and take effect only when
	// the daemon starts again: "server.listen".
	NotLive []string
	// CRDs is true when the list of CRD files changed.
	CRDs bool
}

// None reports whether the two plans run the same resources and chains.
func (c Changes) None() bool {
	return len(c.Start)+len(c.Stop)+len(c.Restart)+len(c.ChainsAdded)+len(c.ChainsRemoved)+len(c.ChainsChanged)+len(c.Unique) == 0
}

// Compare returns what a reload from old to next changes.
func Compare(old, next *Plan) Changes {
	d := plan.Compare(old.c, next.c)
	c := Changes{Start: d.Start, Stop: d.Stop, Restart: d.Restart, Keep: d.Keep,
		ChainsAdded: d.ChainsAdded, ChainsRemoved: d.ChainsRemoved, ChainsChanged: d.ChainsChanged, Unique: d.Unique}
	if old.server.Listen != next.server.Listen {
		c.NotLive = append(c.NotLive, "server.listen")
	}
	c.CRDs = !slices.Equal(old.crds, next.crds)
	return c
}
