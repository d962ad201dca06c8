package sync

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/iidp/metasync/sync/internal/follow"

	"github.com/hashicorp/go-multierror"
	"github.com/tidwall/gjson"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"

	compiled "github.com/iidp/metasync/internal/plan"
	mschema "github.com/iidp/metasync/schema"
)

// NewOffline builds an engine of plan that never talks to a cluster, and
// the Feed that fills it: objects go in as the apiserver would list and
// watch them, through the same projection, rules and indexes as a watch's.
// Every resource starts empty and synced, but those named in unsynced,
// which are synced by their first Replace (a first list). It is the seam
// under package metasynctest, for tests and benchmarks that feed JSON. A
// nil log discards the engine's logs.
func NewOffline(plan *mschema.Plan, log *slog.Logger, unsynced ...string) (*Engine, *Feed, error) {
	if plan == nil {
		return nil, nil, errors.New("no plan")
	}
	cp := compiled.Of(plan)
	if cp == nil {
		return nil, nil, errEmptyPlan
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	e, err := newEngine(cp, Options{Logger: log}, nil, nil)
	if err != nil {
		return nil, nil, err
	}
	v, _ := e.view()
	for _, name := range unsynced {
		if _, err := (&Feed{e: e}).watcher(name); err != nil {
			return nil, nil, err
		}
	}
	for _, w := range v.watchers {
		w.ReportSkipped.Store(true)
		if slices.Contains(unsynced, w.Plan.Name) {
			continue
		}
		if err := w.Replace(nil, ""); err != nil {
			return nil, nil, err
		}
	}
	return e, &Feed{e: e}, nil
}

// Feed writes objects, as JSON, into an engine built by NewOffline. An
// object that its resource entry's namespace or selectors exclude is not
// seen, as the apiserver would not send it; one that stops matching is
// removed. With a plan of several clusters a Feed writes one cluster's part
// of each resource: NewOffline's the home cluster's (or the entry's first
// cluster when the home does not read it), In's the named one's, whose
// object keys are those of the cluster, without its name. A Feed is safe
// for concurrent use; an Apply that races a Reload which restarts its
// resource may be lost, as the restart begins empty.
type Feed struct {
	e       *Engine
	cluster string
}

// In feeds the named cluster's part of each resource.
func (f *Feed) In(cluster string) *Feed { return &Feed{f.e, cluster} }

func (f *Feed) watcher(resource string) (*follow.Watcher, error) {
	v, _ := f.e.view()
	res, ok := v.byName[resource]
	if !ok {
		names := make([]string, 0, len(v.watchers))
		for _, w := range v.watchers {
			if !slices.Contains(names, w.Plan.Name) {
				names = append(names, w.Plan.Name)
			}
		}
		return nil, fmt.Errorf("unknown resource %q (known: %s)", resource, strings.Join(names, ", "))
	}
	if v.plan == nil || len(v.plan.Clusters) == 0 {
		if f.cluster != "" {
			return nil, fmt.Errorf("cluster %q: the config reads one cluster (no clusters:)", f.cluster)
		}
		return res.lead(), nil
	}
	want := f.cluster
	if want == "" {
		for _, c := range v.plan.Clusters {
			if c.Home {
				want = c.Name
			}
		}
	}
	for _, w := range res.parts {
		if w.ClusterName == want {
			return w, nil
		}
	}
	if f.cluster == "" {
		return res.lead(), nil
	}
	names := make([]string, len(res.parts))
	for i, w := range res.parts {
		names[i] = w.ClusterName
	}
	if !slices.ContainsFunc(v.plan.Clusters, func(c compiled.Cluster) bool { return c.Name == f.cluster }) {
		return nil, fmt.Errorf("unknown cluster %q (resource %s is read in: %s)", f.cluster, resource, strings.Join(names, ", "))
	}
	return nil, fmt.Errorf("resource %s is not read in cluster %q (only in: %s)", resource, f.cluster, strings.Join(names, ", "))
}

// project checks one object as the apiserver would and projects it; nil
// when the resource's namespace or selectors exclude it.
func (f *Feed) project(w *follow.Watcher, raw []byte) (o *follow.Projected, key string, err error) {
	if !gjson.ValidBytes(raw) || !gjson.ParseBytes(raw).IsObject() {
		return nil, "", errors.New("not a JSON object")
	}
	meta := gjson.GetManyBytes(raw, "metadata.name", "metadata.namespace", "metadata.labels")
	if meta[0].Type != gjson.String || meta[0].Str == "" {
		return nil, "", errors.New("metadata.name: required")
	}
	key = meta[0].Str
	if meta[1].Str != "" {
		key = meta[1].Str + "/" + key
	}
	if w.Plan.Namespace != "" && meta[1].Str == "" {
		return nil, key, fmt.Errorf("metadata.namespace: required: resource %s watches namespace %s only", w.Plan.Name, w.Plan.Namespace)
	}
	if !f.matches(w.Plan, raw, meta[1].Str, meta[2]) {
		return nil, key, nil
	}
	return w.Project(f.stamp(raw)), key, nil
}

// offlineVersions numbers the objects an offline engine is fed that carry
// no metadata.resourceVersion, as the apiserver would (one counter for
// every offline engine of the process: versions only grow).
var offlineVersions atomic.Uint64

// stamp gives raw a metadata.resourceVersion when it has none, for
// Explain to tell which write an answer came from.
func (*Feed) stamp(raw []byte) string {
	if gjson.GetBytes(raw, "metadata.resourceVersion").Exists() {
		return string(raw)
	}
	md := gjson.GetBytes(raw, "metadata") // an object: it has a name
	at := md.Index + 1
	if md.Index <= 0 || at > len(raw) || raw[md.Index] != '{' {
		return string(raw)
	}
	rv := `"resourceVersion":"` + strconv.FormatUint(offlineVersions.Add(1), 10) + `",`
	return string(raw[:at]) + rv + string(raw[at:])
}

// matches reports whether the apiserver would send the object to a watch
// of r: its namespace, label selector and field selector (whose fields are
// read as paths into the object).
func (*Feed) matches(r *compiled.Resource, raw []byte, namespace string, lbls gjson.Result) bool {
	if r.Namespace != "" && namespace != r.Namespace {
		return false
	}
	if r.LabelSelector != "" {
		sel, _ := labels.Parse(r.LabelSelector) // canonical: it parses
		set := labels.Set{}
		lbls.ForEach(func(k, v gjson.Result) bool { set[k.String()] = v.String(); return true })
		if !sel.Matches(set) {
			return false
		}
	}
	if r.FieldSelector != "" {
		sel, _ := fields.ParseSelector(r.FieldSelector)
		set := fields.Set{}
		for _, req := range sel.Requirements() {
			set[req.Field] = gjson.GetBytes(raw, req.Field).String()
		}
		if !sel.Matches(set) {
			return false
		}
	}
	return true
}

// Reload switches the engine to plan, as a config reload does: the
// resources it keeps keep their objects; those it starts or restarts begin
// empty and synced (no cluster to list them from: feed them).
func (f *Feed) Reload(plan *mschema.Plan) (mschema.Changes, error) {
	ch, err := f.e.Reload(plan)
	if err != nil {
		return ch, err
	}
	v, _ := f.e.view()
	for _, name := range append(slices.Clone(ch.Start), ch.Restart...) {
		res, ok := v.byName[name]
		if !ok {
			return ch, fmt.Errorf("unknown resource %q", name)
		}
		for _, w := range res.parts {
			w.ReportSkipped.Store(true)
			if err := w.Replace(nil, ""); err != nil {
				return ch, err
			}
		}
	}
	return ch, nil
}

// projected is an object checked and projected for a resource: o is nil
// when the resource's namespace or selectors exclude it.
type projected struct {
	o   *follow.Projected
	key string
}

// projectAll checks and projects every object, or fails on the first bad
// one, naming it, before anything is written. skipped reports, one line
// each, the rules that skipped an object: it is written all the same, as a
// watch writes it, without those indexes' entries.
func (f *Feed) projectAll(w *follow.Watcher, objects [][]byte) (out []projected, skipped error, err error) {
	out = make([]projected, 0, len(objects))
	var rules *multierror.Error
	for i, raw := range objects {
		o, key, err := f.project(w, raw)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: object %d: %w", w.Plan.Name, i, err)
		}
		if o != nil {
			for _, e := range o.Skipped {
				rules = multierror.Append(rules, fmt.Errorf("%s: object %s: %w", w.Plan.Name, key, e))
			}
		}
		out = append(out, projected{o, w.KeyPrefix + key})
	}
	if rules != nil {
		rules.ErrorFormat = ruleErrorLines
		skipped = &ruleErrors{err: rules}
	}
	return out, skipped, nil
}

// ruleErrors is what a Feed returns when a rule skipped an
// object it wrote: one error per object and index (metasynctest's Fake
// turns it into its RuleErrors).
type ruleErrors struct{ err *multierror.Error }

func (e *ruleErrors) Error() string { return e.err.Error() }

// Skipped returns one error per object and index.
func (e *ruleErrors) Skipped() []error { return e.err.Errors }

func ruleErrorLines(errs []error) string {
	lines := make([]string, len(errs))
	for i, err := range errs {
		lines[i] = err.Error()
	}
	return fmt.Sprintf("%d rule error(s), the object(s) written without those entries:\n\t%s", len(errs), strings.Join(lines, "\n\t"))
}

// Apply adds or replaces objects of the named resource entry. It projects
// every object first, so that a bad one changes nothing, then applies them
// in one transaction: readers see all or none. An object that a rule
// skips is written without that index's entries, as a watch writes it, and
// the error returned names each skip.
func (f *Feed) Apply(resource string, objects ...[]byte) error {
	w, err := f.watcher(resource)
	if err != nil {
		return err
	}
	ps, skipped, err := f.projectAll(w, objects)
	if err != nil {
		return err
	}
	tx := w.Src.Begin()
	for _, p := range ps {
		if p.o == nil {
			tx.Delete(p.key)
			w.Deleted.Add(1)
		} else {
			tx.Put(p.o.Ix)
			w.Added.Add(1)
		}
	}
	w.Count.Add(int64(tx.Added()))
	tx.Commit()
	for _, p := range ps {
		if p.o == nil {
			w.Failing.Note(p.key, nil)
		} else {
			w.Failing.Note(p.o.Ix.Key, p.o.Failed)
		}
	}
	return skipped
}

// Delete removes objects by object key (namespace/name, or name), in one
// transaction.
func (f *Feed) Delete(resource string, objectKeys ...string) error {
	w, err := f.watcher(resource)
	if err != nil {
		return err
	}
	tx := w.Src.Begin()
	for _, key := range objectKeys {
		tx.Delete(w.KeyPrefix + key)
		w.Deleted.Add(1)
	}
	w.Count.Add(int64(tx.Added()))
	tx.Commit()
	for _, key := range objectKeys {
		w.Failing.Note(w.KeyPrefix+key, nil)
	}
	return nil
}

// Replace makes the objects the resource's whole content, as a relist
// does: what they lack is removed. The first Replace of a resource that
// NewOffline left unsynced syncs it.
func (f *Feed) Replace(resource string, objects ...[]byte) error {
	w, err := f.watcher(resource)
	if err != nil {
		return err
	}
	ps, skipped, err := f.projectAll(w, objects)
	if err != nil {
		return err
	}
	list := make([]any, 0, len(ps))
	for _, p := range ps {
		if p.o != nil {
			list = append(list, p.o)
		}
	}
	if err := w.Replace(list, ""); err != nil {
		return err
	}
	return skipped
}
