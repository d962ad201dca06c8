package sync

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/iidp/metasync/sync/internal/follow"

	"github.com/iidp/metasync/indexer"
	compiled "github.com/iidp/metasync/internal/plan"
	"github.com/iidp/metasync/schema"
)

// trickyList is a LIST response whose items exercise the projection:
// escaped dotted label keys, unicode, numbers as written, nested arrays,
// empty arrays, nulls, braces and quotes inside strings, objects where
// scalars are wanted.
const trickyList = `{"kind":"AppModelList","apiVersion":"iidp.com/v1","metadata":{"resourceVersion":"4242","continue":""},"items":[
 {"metadata":{"name":"plain","namespace":"ns","labels":{"kubernetes.io/service-name":"svc-a","tier":"x"}},"spec":{"models":["m1","m2"],"version":"1.7","n":7}},
 {"metadata":{"name":"unicode","namespace":"ns","labels":{"kubernetes.io/service-name":"サービス"}},"spec":{"models":["モデル","m\u00e9","emoji 🚀"],"n":-1.5e3}},
 {"metadata":{"name":"braces","namespace":"ns2","annotations":{"x":"{[\"}]"}},"spec":{"models":["a \"quoted\" }{ model","back\\slash"],"n":0}},
 {"metadata":{"name":"nested","namespace":"ns"},"spec":{"models":[["x","y"],[],["z",["w"]]],"routes":[{"hosts":["h1","h2"]},{"hosts":[]},{"hosts":null},{}]}},
 {"metadata":{"name":"empty","namespace":"ns"},"spec":{"models":[],"n":null}},
 {"metadata":{"name":"nulls","namespace":"ns"},"spec":{"models":[null,"kept",null],"version":null}},
 {"metadata":{"name":"object","namespace":"ns"},"spec":{"models":{"not":"a list"},"n":true}},
 {"metadata":{"name":"mixed","namespace":"ns"},"spec":{"models":["ok",{"bad":1}],"n":false}},
 {"metadata":{"name":"cluster-scoped"},"spec":{"models":["c1"],"n":12345678901234567890}},
 {"metadata":{"name":"noSpec","namespace":"ns"}}
]}`

// trickyConfig is one resource whose indexes meet every odd shape of
// trickyList.
func trickyConfig() *schema.Config {
	return &schema.Config{Resources: []schema.Resource{{
		Name: "tricky", Group: "iidp.com", Version: "v1", Resource: "appmodels",
		Indexes: []schema.Index{
			{Name: "models", Key: "spec.models"},
			{Name: "by-service", Key: `metadata.labels.kubernetes\.io/service-name`, Value: "metadata.name"},
			{Name: "by-number", Key: "spec.n", Value: "metadata.name"},
			{Name: "hosts", Key: "spec.routes.#.hosts"},
			{Name: "ns-model", Key: "${metadata.namespace}/${spec.models}", Value: "spec.version"},
		},
	}}}
}

func trickyPlan(tb testing.TB) *compiled.Resource {
	tb.Helper()
	return watchersOf(testEngine(tb, trickyConfig()))[0].Plan
}

// reference evaluates a plain dotted path (with \. escapes and # for every
// element) on an object decoded by encoding/json, with the same rules,
// without gjson.
func reference(obj any, path string) (values []string, bad bool) {
	var segs []string
	var cur strings.Builder
	for i := 0; i < len(path); i++ {
		switch {
		case path[i] == '\\' && i+1 < len(path):
			i++
			cur.WriteByte(path[i])
		case path[i] == '.':
			segs = append(segs, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(path[i])
		}
	}
	segs = append(segs, cur.String())
	var walk func(v any, segs []string) []any
	walk = func(v any, segs []string) []any {
		if len(segs) == 0 {
			return []any{v}
		}
		switch x := v.(type) {
		case map[string]any:
			child, ok := x[segs[0]]
			if !ok {
				return nil
			}
			return walk(child, segs[1:])
		case []any:
			if segs[0] != "#" {
				return nil
			}
			var out []any
			for _, el := range x {
				if r := walk(el, segs[1:]); len(r) > 0 {
					out = append(out, r...)
				}
			}
			return []any{out}
		}
		return nil
	}
	var emit func(v any) bool
	emit = func(v any) bool {
		switch x := v.(type) {
		case nil:
		case string:
			values = append(values, x)
		case json.Number:
			values = append(values, x.String())
		case bool:
			values = append(values, fmt.Sprint(x))
		case []any:
			for _, el := range x {
				if _, isObj := el.(map[string]any); isObj {
					return false
				}
			}
			for _, el := range x {
				if !emit(el) {
					return false
				}
			}
		default:
			return false
		}
		return true
	}
	for _, v := range walk(obj, segs) {
		if !emit(v) {
			return nil, true
		}
	}
	return values, false
}

// plainIndex builds the indexes of the tricky list the slow, obvious way.
func plainIndex(t *testing.T, plan *compiled.Resource) map[string]map[string][]string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(trickyList))
	dec.UseNumber()
	var list struct{ Items []map[string]any }
	if err := dec.Decode(&list); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string][]string{}
	for _, ix := range plan.Indexes {
		out[ix.Name] = map[string][]string{}
	}
	for _, item := range list.Items {
		meta := item["metadata"].(map[string]any)
		key := meta["name"].(string)
		if ns, ok := meta["namespace"].(string); ok {
			key = ns + "/" + key
		}
		for _, ix := range plan.Indexes {
			evalRule := func(r *compiled.Rule) ([]string, bool) {
				if path, ok := r.SinglePath(); ok {
					return reference(item, path)
				}
				// Templates: "${a}/${b}" only, in this test.
				paths := r.Paths()
				a, badA := reference(item, paths[0])
				b, badB := reference(item, paths[1])
				var out []string
				for _, x := range a {
					for _, y := range b {
						out = append(out, x+"/"+y)
					}
				}
				return out, badA || badB
			}
			keys, bad := evalRule(ix.Key)
			if bad || len(keys) == 0 {
				continue
			}
			values := []string{key}
			if ix.Value != nil {
				if values, bad = evalRule(ix.Value); bad {
					continue
				}
			}
			for _, k := range keys {
				for _, v := range values {
					if !slices.Contains(out[ix.Name][k], v) {
						out[ix.Name][k] = append(out[ix.Name][k], v)
					}
				}
			}
		}
	}
	for _, m := range out {
		for k := range m {
			sort.Strings(m[k])
		}
	}
	return out
}

func fastIndex(t *testing.T, r io.Reader) map[string]map[string][]string {
	t.Helper()
	e := testEngine(t, trickyConfig())
	w, store := watchersOf(e)[0], e.store
	var names []string
	for _, ix := range w.Plan.Indexes {
		names = append(names, ix.Name)
	}
	list, err := follow.StreamList(r, w.Project)
	if err != nil {
		t.Fatal(err)
	}
	if list.ResourceVersion != "4242" || len(list.Items) != 10 {
		t.Fatalf("list: rv %q, %d items", list.ResourceVersion, len(list.Items))
	}
	objs := make([]any, len(list.Items))
	for i, it := range list.Items {
		objs[i] = it
	}
	if err := w.Replace(objs, list.ResourceVersion); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string][]string{}
	snap := store.Snapshot()
	for _, name := range names {
		ix, _ := store.Index(name)
		out[name] = map[string][]string{}
		for _, k := range snap.Keys(ix) {
			out[name][k] = slices.Clone(snap.Lookup(ix, k))
		}
	}
	return out
}

// TestFastPathEqualsPlainDecode: gjson on the raw bytes of a streamed list
// builds the same indexes as encoding/json and a plain evaluator, whatever
// the chunking of the stream.
func TestFastPathEqualsPlainDecode(t *testing.T) {
	plan := trickyPlan(t)
	want := plainIndex(t, plan)
	if len(want["models"]) < 10 || len(want["by-number"]) < 5 {
		t.Fatalf("the reference found too little: %v", want)
	}
	readers := map[string]func() io.Reader{
		"whole":    func() io.Reader { return strings.NewReader(trickyList) },
		"one byte": func() io.Reader { return iotest.OneByteReader(strings.NewReader(trickyList)) },
		"random":   func() io.Reader { return &randomChunks{data: []byte(trickyList), rng: rand.New(rand.NewPCG(3, 4))} },
	}
	for name, r := range readers {
		got := fastIndex(t, r())
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: fast path\n%v\nplain decode\n%v", name, got, want)
		}
	}
}

type randomChunks struct {
	data []byte
	rng  *rand.Rand
}

func (r *randomChunks) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), len(r.data), 1+r.rng.IntN(40))
	copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}

func TestStreamListRejectsBrokenBodies(t *testing.T) {
	plan := trickyPlan(t)
	store, _ := indexer.New(indexer.SourceSpec{Name: plan.Name, Indexes: []string{"models", "by-service", "by-number", "hosts", "ns-model"}})
	w := follow.NewWatcher(plan, "", testLog())
	w.Src = store.Source(plan.Name)
	for _, body := range []string{
		trickyList[:len(trickyList)/2],
		`{"items":[]}`,
		`{"metadata":{},"items":[]}`,
		``,
	} {
		if _, err := follow.StreamList(bytes.NewReader([]byte(body)), w.Project); err == nil {
			t.Errorf("accepted %.60q", body)
		}
	}
	list, err := follow.StreamList(strings.NewReader(`{"metadata":{"resourceVersion":"1"},"items":null}`), w.Project)
	if err != nil || len(list.Items) != 0 {
		t.Errorf("items null: %v %v", list, err)
	}
}
