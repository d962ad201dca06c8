package server

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// engineCollector reads the engine's status at scrape time. No label ever
// carries an index key or value: only resource, index and event names from
// the config.
type engineCollector struct {
	e Engine

	conflicting                                                                                          *prometheus.Desc
	objects, synced, ready, keys, events, relists, listErrors, watchErrors, watches, ruleErrors, failing *prometheus.Desc
	subsOpen, subsCoalesced, subsResets                                                                  *prometheus.Desc
	syncing, listDuration, watchDuration                                                                 *prometheus.Desc
	stale, snapAge, snapDuration, snapBytes, snapWrites, snapLoads                                       *prometheus.Desc
}

func newEngineCollector(e Engine) *engineCollector {
	res := []string{"resource"}
	return &engineCollector{
		e:           e,
		objects:     prometheus.NewDesc("metasync_resource_objects", "Objects held per resource.", res, nil),
		synced:      prometheus.NewDesc("metasync_resource_synced", "1 once the resource's first list completed.", res, nil),
		ready:       prometheus.NewDesc("metasync_resource_ready", "1 while the resource is ready (synced, watch not failing too long).", res, nil),
		keys:        prometheus.NewDesc("metasync_index_keys", "Keys per index.", []string{"index", "resource"}, nil),
		conflicting: prometheus.NewDesc("metasync_index_conflicting_keys", "Keys of a unique index claimed with different values by several objects (each answers the oldest claimant's values).", []string{"index", "resource"}, nil),
		events:      prometheus.NewDesc("metasync_events_total", "Watch events applied, by type.", []string{"resource", "type"}, nil),
		relists:     prometheus.NewDesc("metasync_relists_total", "Complete lists applied (initial sync, relists after faults, resyncs).", res, nil),
		listErrors:  prometheus.NewDesc("metasync_list_errors_total", "Failed list requests.", res, nil),
		watchErrors: prometheus.NewDesc("metasync_watch_errors_total", "Failed watch requests.", res, nil),
		watches:     prometheus.NewDesc("metasync_watch_starts_total", "Watch requests started (the first and every restart).", res, nil),
		ruleErrors:  prometheus.NewDesc("metasync_rule_errors_total", "Objects whose rule could not be evaluated, per index.", []string{"resource", "index"}, nil),
		failing:     prometheus.NewDesc("metasync_rule_failing_objects", "Objects whose rule fails now, per index: they add nothing to it.", []string{"resource", "index"}, nil),

		syncing:       prometheus.NewDesc("metasync_resource_syncing", "1 while a resource that a config reload started has not completed its first list (and still may).", res, nil),
		listDuration:  prometheus.NewDesc("metasync_list_duration_seconds", "List requests to the apiserver that ended, and their time.", res, nil),
		watchDuration: prometheus.NewDesc("metasync_watch_duration_seconds", "Watches that ended, and how long they stayed open.", res, nil),
		stale:         prometheus.NewDesc("metasync_resource_stale", "1 while the resource answers from a snapshot and its watch has not caught up with the apiserver.", res, nil),
		snapAge:       prometheus.NewDesc("metasync_snapshot_age_seconds", "Age of the newest snapshot written (or, before the first write, loaded).", nil, nil),
		snapDuration:  prometheus.NewDesc("metasync_snapshot_write_duration_seconds", "How long the last snapshot write took.", nil, nil),
		snapBytes:     prometheus.NewDesc("metasync_snapshot_size_bytes", "Size of the last snapshot written.", nil, nil),
		snapWrites:    prometheus.NewDesc("metasync_snapshot_writes_total", "Snapshot writes, by result (ok, error).", []string{"result"}, nil),
		snapLoads:     prometheus.NewDesc("metasync_snapshot_loads_total", "Snapshot loads at start, by outcome (warm, cold) and the reason of a cold one.", []string{"outcome", "reason"}, nil),
		subsOpen:      prometheus.NewDesc("metasync_subscriptions_open", "Subscriptions open (each HTTP stream holds one).", nil, nil),
		subsCoalesced: prometheus.NewDesc("metasync_subscription_coalesced_total", "Changes folded into a newer one before a subscriber took them.", nil, nil),
		subsResets:    prometheus.NewDesc("metasync_subscription_resets_total", "Resumes that could not resume and started over with a reset.", nil, nil),
	}
}

func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.objects, c.synced, c.ready, c.keys, c.events, c.relists, c.listErrors, c.watchErrors, c.watches, c.ruleErrors, c.failing, c.subsOpen, c.subsCoalesced, c.subsResets, c.syncing, c.listDuration, c.watchDuration, c.stale, c.snapAge, c.snapDuration, c.snapBytes, c.snapWrites, c.snapLoads, c.conflicting} {
		ch <- d
	}
}

func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	for _, st := range c.e.Status() {
		gauge(c.objects, float64(st.Objects), st.Name)
		gauge(c.synced, b(st.Synced), st.Name)
		gauge(c.ready, b(st.Ready), st.Name)
		gauge(c.syncing, b(st.Syncing), st.Name)
		gauge(c.stale, b(st.Stale), st.Name)
		ch <- prometheus.MustNewConstSummary(c.listDuration, uint64(st.Lists), st.ListSeconds, nil, st.Name)
		ch <- prometheus.MustNewConstSummary(c.watchDuration, uint64(st.WatchesEnded), st.WatchSeconds, nil, st.Name)
		counter(c.events, st.Added, st.Name, "added")
		counter(c.events, st.Updated, st.Name, "updated")
		counter(c.events, st.Deleted, st.Name, "deleted")
		counter(c.relists, st.Relists, st.Name)
		counter(c.listErrors, st.ListErrors, st.Name)
		counter(c.watchErrors, st.WatchErrors, st.Name)
		counter(c.watches, st.Watches, st.Name)
		for index, n := range st.RuleErrors {
			counter(c.ruleErrors, n, st.Name, index)
			gauge(c.failing, float64(st.Failing[index]), st.Name, index)
		}
	}
	if snap := c.e.SnapshotStatus(); snap.Load != "" {
		ch <- prometheus.MustNewConstMetric(c.snapLoads, prometheus.CounterValue, 1, snap.Load, snap.LoadReason)
		counter(c.snapWrites, snap.Writes, "ok")
		counter(c.snapWrites, snap.WriteErrors, "error")
		if !snap.WrittenAt.IsZero() {
			gauge(c.snapAge, time.Since(snap.WrittenAt).Seconds())
		}
		if snap.Writes > 0 {
			gauge(c.snapDuration, snap.WriteDuration.Seconds())
			gauge(c.snapBytes, float64(snap.Bytes))
		}
	}
	subs := c.e.Subscriptions()
	gauge(c.subsOpen, float64(subs.Open))
	counter(c.subsCoalesced, subs.Coalesced)
	counter(c.subsResets, subs.Resets)
	for _, ix := range c.e.Indexes() {
		gauge(c.keys, float64(ix.Keys), ix.Name, ix.Resource)
		if ix.Unique {
			gauge(c.conflicting, float64(ix.Conflicts), ix.Name, ix.Resource)
		}
	}
}
