// Package metasynctest is a test double of metasync for unit tests of code
// that reads it: a Fake satisfies sync.Reader, as the engine does, and holds
// the objects a test gives it, as YAML or JSON, without a cluster.
//
// A Fake runs the same compiled config as the engine: each object goes
// through the same projection, the same gjson rules and the same indexes as
// an object that a watch delivers, and the resource entry's namespace,
// label selector and field selector decide whether it is seen, as the
// apiserver would. So a config mistake shows up in a unit test too.
//
//	plan, _ := schema.LoadPlan("config.yaml", schema.LoadOptions{})
//	fake, _ := metasynctest.New(plan)
//	_ = fake.Apply("appmodels", `
//	apiVersion: iidp.com/v1
//	kind: AppModel
//	metadata: {name: base, namespace: meta-test, labels: {iidp: iidp}}
//	spec: {models: [model1]}
//	`)
//	fake.Lookup("model-to-app", "model1") // [base]
//
// Every resource is synced from the start, with no objects, but those
// that New's Unsynced names, synced by their first Replace. Objects may be
// applied, changed and deleted while the code under test reads: a Fake is
// safe for concurrent use, and readers see each Apply, Delete or Replace
// as a whole.
//
// A config that reads several clusters (clusters:) keeps each cluster's
// part apart, as the engine does: Apply, Delete and Replace write the home
// cluster's part (the entry's first cluster when the home does not read
// it), and In(name) gives the same three for another cluster. Answers are
// the union, with each cluster's state in Answer.Clusters, and Explain
// names each object's cluster. No kubeconfig file is read.
package metasynctest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/tidwall/gjson"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

// Fake is a sync.Reader over objects given by a test.
type Fake struct {
	msync.Reader
	engine *msync.Engine
	feed   *msync.Feed
}

// Answer is the engine's Answer: a target's values with whether they are
// synced and stale, as the daemon's HTTP API answers.
func (f *Fake) Answer(t msync.Target) msync.Answer { return f.engine.Inspect().Answer(t) }

// Reload switches the Fake to another compiled config, as the daemon's
// live reload does, and returns what changed: the resource entries it
// keeps keep their objects (a unique index turned on or off applies to
// them); those it starts or restarts (another selector, rule or field)
// begin empty and synced, with no cluster to list them from: Apply their
// objects again. A subscription of an index or chain that the reload
// removes ends, as in the engine.
func (f *Fake) Reload(plan *schema.Plan) (schema.Changes, error) {
	if plan == nil {
		return schema.Changes{}, errors.New("metasynctest: Reload needs a plan")
	}
	return f.feed.Reload(plan)
}

// Conflicts is the engine's Conflicts: the keys of unique indexes that
// several objects claim with different values (each answers the oldest
// claimant's; give objects a metadata.creationTimestamp to order them,
// else they are ordered by object key). Explain names the claimants.
func (f *Fake) Conflicts() []msync.Conflict { return f.engine.Inspect().Conflicts() }

// Engine is the engine under the Fake, for code that takes a
// *sync.Engine (or an interface of its methods) rather than a Reader: the
// daemon's HTTP API and xDS server are tested on it. What the test applies
// to the Fake, the engine answers.
func (f *Fake) Engine() *msync.Engine { return f.engine }

// Feed writes into the Fake as the apiserver would, objects given as JSON
// rather than YAML manifests (see sync.Feed), for tests that build many.
func (f *Fake) Feed() *msync.Feed { return f.feed }

// HomeCluster is the engine's HomeCluster: of a config that reads several
// clusters, the home cluster's name ("" otherwise).
func (f *Fake) HomeCluster() string { return f.engine.Inspect().HomeCluster() }

var _ msync.Reader = (*Fake)(nil)

// Option changes how New builds a Fake.
type Option func(*options)

type options struct{ unsynced []string }

// Unsynced starts the named resource entries not synced, as an engine's
// resources are until their first list: their indexes are not Synced (in
// Indexes, and in Answer, of each index and chain they feed) until the
// first Replace of each, which is that list. Apply before it writes, as
// a watch's events would.
func Unsynced(resources ...string) Option {
	return func(o *options) { o.unsynced = append(o.unsynced, resources...) }
}

// New builds a Fake of a compiled config, with no objects, every resource
// synced (but those given to Unsynced).
func New(plan *schema.Plan, opts ...Option) (*Fake, error) {
	if plan == nil {
		return nil, errors.New("metasynctest.New: nil plan")
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	e, f, err := msync.NewOffline(plan, slog.New(slog.NewTextHandler(io.Discard, nil)), o.unsynced...)
	if err != nil {
		return nil, err
	}
	return &Fake{Reader: e, engine: e, feed: f}, nil
}

// Load builds a Fake of the config file at path (see schema.LoadPlan).
func Load(path string, opts ...Option) (*Fake, error) {
	plan, err := schema.LoadPlan(path, schema.LoadOptions{})
	if err != nil {
		return nil, err
	}
	return New(plan, opts...)
}

// Apply adds or replaces objects of the named resource entry, given as YAML
// or JSON: one or more documents separated by "---", and a document of
// kind *List stands for its items. An object is identified by its
// metadata.namespace and metadata.name; one that the resource entry's namespace or
// selectors exclude is not seen (and removed if it was).
//
// When an index's rule skips an object (a value of the wrong shape, over
// the index's limit), the object is applied all the same, as the engine
// applies it (a watch logs and counts the error), without that index's
// entries, and Apply returns a *RuleErrors that names each.
func (f *Fake) Apply(resource, manifests string) error {
	objs, err := documents(manifests)
	if err != nil {
		return fmt.Errorf("%s: %w", resource, err)
	}
	return ruleErrors(f.feed.Apply(resource, objs...))
}

// RuleErrors reports objects that Apply or Replace applied although a rule
// of an index skipped them: Errors has one error per object and index,
// "RESOURCE: object KEY: index NAME: what the rule met".
type RuleErrors struct {
	Errors []error
	msg    string
}

func (e *RuleErrors) Error() string { return e.msg }

// ruleErrors turns the feed's report of skipped rules into a *RuleErrors.
func ruleErrors(err error) error {
	var skipped interface{ Skipped() []error }
	if errors.As(err, &skipped) {
		return &RuleErrors{Errors: skipped.Skipped(), msg: err.Error()}
	}
	return err
}

// Delete removes objects of the named resource entry by object key:
// namespace/name, or name for a cluster-scoped object. A key that is not
// there is no error.
func (f *Fake) Delete(resource string, objectKeys ...string) error {
	return f.feed.Delete(resource, objectKeys...)
}

// Replace makes the given objects the whole content of the named resource
// entry, as a relist after a broken watch does: every object they lack is
// removed, in the same step. Rules that skip an object are reported as
// Apply reports them.
func (f *Fake) Replace(resource, manifests string) error {
	objs, err := documents(manifests)
	if err != nil {
		return fmt.Errorf("%s: %w", resource, err)
	}
	return ruleErrors(f.feed.Replace(resource, objs...))
}

// Cluster feeds one cluster's part of each resource of a Fake whose
// config reads several clusters (see Fake.In).
type Cluster struct {
	name string
	feed *msync.Feed
}

// In returns the named cluster's part of the Fake: its Apply, Delete and
// Replace write only that cluster's objects (an object key there is the
// cluster's own, namespace/name, without the cluster's name). An unknown
// cluster, or a resource entry not read in it, is an error of each call.
func (f *Fake) In(cluster string) *Cluster { return &Cluster{name: cluster, feed: f.feed.In(cluster)} }

// Apply is Fake.Apply in the cluster.
func (c *Cluster) Apply(resource, manifests string) error {
	objs, err := documents(manifests)
	if err != nil {
		return fmt.Errorf("%s: %w", resource, err)
	}
	return ruleErrors(c.feed.Apply(resource, objs...))
}

// Delete is Fake.Delete in the cluster.
func (c *Cluster) Delete(resource string, objectKeys ...string) error {
	return c.feed.Delete(resource, objectKeys...)
}

// Replace is Fake.Replace in the cluster: what the cluster's part lacks is
// removed; the other clusters' parts stay.
func (c *Cluster) Replace(resource, manifests string) error {
	objs, err := documents(manifests)
	if err != nil {
		return fmt.Errorf("%s: %w", resource, err)
	}
	return ruleErrors(c.feed.Replace(resource, objs...))
}

// documents splits YAML or JSON manifests into JSON objects.
func documents(manifests string) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(manifests)))
	var out [][]byte
	for n := 1; ; n++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		if string(js) == "null" {
			continue // only comments
		}
		if !gjson.ParseBytes(js).IsObject() {
			return nil, fmt.Errorf("document %d: not an object", n)
		}
		if strings.HasSuffix(gjson.GetBytes(js, "kind").Str, "List") && gjson.GetBytes(js, "items").IsArray() {
			for _, it := range gjson.GetBytes(js, "items").Array() {
				out = append(out, []byte(it.Raw))
			}
			continue
		}
		out = append(out, js)
	}
}
