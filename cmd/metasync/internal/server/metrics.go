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

	conflicting, keys                                             *prometheus.Desc
	subsOpen, subsCoalesced, subsResets                           *prometheus.Desc
	snapAge, snapDuration, snapBytes, snapWrites, snapLoads       *prometheus.Desc
	clusterConnected, clusterSynced, clusterStale, clusterContact *prometheus.Desc
	clusterObjects, clusterRotations, clusterKubeconfigErrors     *prometheus.Desc
	// Of each resource: plain, and with a cluster label for a config
	// that reads several clusters (one status per resource and cluster).
	plain, clustered resourceDescs
}

// resourceDescs are the metrics of one resource's status.
type resourceDescs struct {
	objects, synced, ready, events, relists, changes, listErrors, watchErrors, watches, ruleErrors, failing *prometheus.Desc
	syncing, listDuration, watchDuration, stale                                                             *prometheus.Desc
}

// newResourceDescs builds the descriptions of a resource's metrics, with
// a label "cluster" after "resource" when clustered.
func newResourceDescs(clustered bool) resourceDescs {
	res := []string{"resource"}
	if clustered {
		res = append(res, "cluster")
	}
	with := func(extra string) []string { return append(append([]string{}, res...), extra) }
	return resourceDescs{
		objects:     prometheus.NewDesc("metasync_resource_objects", "Objects held per resource.", res, nil),
		synced:      prometheus.NewDesc("metasync_resource_synced", "1 once the resource's first list completed.", res, nil),
		ready:       prometheus.NewDesc("metasync_resource_ready", "1 while the resource is ready (synced, watch not failing too long).", res, nil),
		events:      prometheus.NewDesc("metasync_events_total", "Watch events applied, by type.", with("type"), nil),
		relists:     prometheus.NewDesc("metasync_relists_total", "Complete lists applied (initial sync, relists after faults, resyncs).", res, nil),
		changes:     prometheus.NewDesc("metasync_cluster_changes_total", "Times the cluster behind the resource's address turned out to be another (rebuilt, or its etcd restored from a backup): the resource listed from scratch.", res, nil),
		listErrors:  prometheus.NewDesc("metasync_list_errors_total", "Failed list requests.", res, nil),
		watchErrors: prometheus.NewDesc("metasync_watch_errors_total", "Failed watch requests.", res, nil),
		watches:     prometheus.NewDesc("metasync_watch_starts_total", "Watch requests started (the first and every restart).", res, nil),
		ruleErrors:  prometheus.NewDesc("metasync_rule_errors_total", "Objects whose rule could not be evaluated, per index.", with("index"), nil),
		failing:     prometheus.NewDesc("metasync_rule_failing_objects", "Objects whose rule fails now, per index: they add nothing to it.", with("index"), nil),

		syncing:       prometheus.NewDesc("metasync_resource_syncing", "1 while a resource that a config reload started has not completed its first list (and still may).", res, nil),
		listDuration:  prometheus.NewDesc("metasync_list_duration_seconds", "List requests to the apiserver that ended, and their time.", res, nil),
		watchDuration: prometheus.NewDesc("metasync_watch_duration_seconds", "Watches that ended, and how long they stayed open.", res, nil),
		stale:         prometheus.NewDesc("metasync_resource_stale", "1 while the resource answers data that may be behind its apiserver: a snapshot not caught up yet, or a watch failing longer than --stale-after.", res, nil),
	}
}

func (d resourceDescs) all() []*prometheus.Desc {
	return []*prometheus.Desc{d.objects, d.synced, d.ready, d.events, d.relists, d.changes, d.listErrors, d.watchErrors, d.watches, d.ruleErrors, d.failing, d.syncing, d.listDuration, d.watchDuration, d.stale}
}

// resource returns the descriptions of the resources' metrics: with a
// cluster label for a config that reads several clusters.
func (c *engineCollector) resource() resourceDescs {
	if len(c.e.Clusters()) > 0 {
		return c.clustered
	}
	return c.plain
}

func newEngineCollector(e Engine) *engineCollector {
	cl := []string{"cluster"}
	return &engineCollector{
		e:           e,
		plain:       newResourceDescs(false),
		clustered:   newResourceDescs(true),
		keys:        prometheus.NewDesc("metasync_index_keys", "Keys per index.", []string{"index", "resource"}, nil),
		conflicting: prometheus.NewDesc("metasync_index_conflicting_keys", "Keys of a unique index claimed with different values by several objects (each answers the oldest claimant's values).", []string{"index", "resource"}, nil),

		clusterConnected:        prometheus.NewDesc("metasync_cluster_connected", "1 while every resource's watch of the cluster works (a config that reads several clusters).", cl, nil),
		clusterSynced:           prometheus.NewDesc("metasync_cluster_synced", "1 once every resource of the cluster has completed a list.", cl, nil),
		clusterStale:            prometheus.NewDesc("metasync_cluster_stale", "1 while some resource of the cluster is cut off from it, answering what it last knew.", cl, nil),
		clusterContact:          prometheus.NewDesc("metasync_cluster_last_contact_timestamp_seconds", "When the cluster's apiserver was last heard from (a list, an event, a bookmark, an established watch).", cl, nil),
		clusterObjects:          prometheus.NewDesc("metasync_cluster_objects", "Objects held from the cluster.", cl, nil),
		clusterRotations:        prometheus.NewDesc("metasync_cluster_kubeconfig_rotations_total", "Kubeconfig files of the cluster taken after the first (a rotated credential, a new address).", cl, nil),
		clusterKubeconfigErrors: prometheus.NewDesc("metasync_cluster_kubeconfig_errors_total", "Kubeconfig files of the cluster refused (unreadable, invalid, or refused by their apiserver): the last good connection stays.", cl, nil),
		snapAge:                 prometheus.NewDesc("metasync_snapshot_age_seconds", "Age of the newest snapshot written (or, before the first write, loaded).", nil, nil),
		snapDuration:            prometheus.NewDesc("metasync_snapshot_write_duration_seconds", "How long the last snapshot write took.", nil, nil),
		snapBytes:               prometheus.NewDesc("metasync_snapshot_size_bytes", "Size of the last snapshot written.", nil, nil),
		snapWrites:              prometheus.NewDesc("metasync_snapshot_writes_total", "Snapshot writes, by result (ok, error).", []string{"result"}, nil),
		snapLoads:               prometheus.NewDesc("metasync_snapshot_loads_total", "Snapshot loads at start, by outcome (warm, cold) and the reason of a cold one.", []string{"outcome", "reason"}, nil),
		subsOpen:                prometheus.NewDesc("metasync_subscriptions_open", "Subscriptions open (each HTTP stream holds one).", nil, nil),
		subsCoalesced:           prometheus.NewDesc("metasync_subscription_coalesced_total", "Changes folded into a newer one before a subscriber took them.", nil, nil),
		subsResets:              prometheus.NewDesc("metasync_subscription_resets_total", "Resumes that could not resume and started over with a reset.", nil, nil),
	}
}

func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	// A config's clusters never change while it runs (a reload keeps
	// them): its resources' metrics have a cluster label or none.
	for _, d := range append(c.resource().all(), c.keys, c.subsOpen, c.subsCoalesced, c.subsResets, c.snapAge, c.snapDuration, c.snapBytes, c.snapWrites, c.snapLoads, c.conflicting,
		c.clusterConnected, c.clusterSynced, c.clusterStale, c.clusterContact, c.clusterObjects, c.clusterRotations, c.clusterKubeconfigErrors) {
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
		d, res := c.resource(), []string{st.Name}
		if st.Cluster != "" {
			res = append(res, st.Cluster)
		}
		with := func(extra string) []string { return append(append([]string{}, res...), extra) }
		gauge(d.objects, float64(st.Objects), res...)
		gauge(d.synced, b(st.Synced), res...)
		gauge(d.ready, b(st.Ready), res...)
		gauge(d.syncing, b(st.Syncing), res...)
		gauge(d.stale, b(st.Stale), res...)
		ch <- prometheus.MustNewConstSummary(d.listDuration, uint64(st.Lists), st.ListSeconds, nil, res...)
		ch <- prometheus.MustNewConstSummary(d.watchDuration, uint64(st.WatchesEnded), st.WatchSeconds, nil, res...)
		counter(d.events, st.Added, with("added")...)
		counter(d.events, st.Updated, with("updated")...)
		counter(d.events, st.Deleted, with("deleted")...)
		counter(d.relists, st.Relists, res...)
		counter(d.changes, st.ClusterChanges, res...)
		counter(d.listErrors, st.ListErrors, res...)
		counter(d.watchErrors, st.WatchErrors, res...)
		counter(d.watches, st.Watches, res...)
		for index, n := range st.RuleErrors {
			counter(d.ruleErrors, n, with(index)...)
			gauge(d.failing, float64(st.Failing[index]), with(index)...)
		}
	}
	for _, cs := range c.e.Clusters() {
		gauge(c.clusterConnected, b(cs.Connected), cs.Name)
		gauge(c.clusterSynced, b(cs.Synced), cs.Name)
		gauge(c.clusterStale, b(cs.Stale), cs.Name)
		gauge(c.clusterObjects, float64(cs.Objects), cs.Name)
		counter(c.clusterRotations, cs.KubeconfigRotations, cs.Name)
		counter(c.clusterKubeconfigErrors, cs.KubeconfigErrors, cs.Name)
		if !cs.LastContact.IsZero() {
			gauge(c.clusterContact, float64(cs.LastContact.UnixNano())/1e9, cs.Name)
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
