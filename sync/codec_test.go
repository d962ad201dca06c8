package sync

import (
	"bytes"
	"strings"
	"testing"

	"github.com/iidp/metasync/schema"
)

// appModelList is a LIST page of n AppModels as the apiserver sends it.
func appModelList(n int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"kind":"AppModelList","apiVersion":"iidp.com/v1","metadata":{"resourceVersion":"1234567","continue":"eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ","remainingItemCount":42},"items":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		ev := appModelEvent(i, 1_000_000+i)
		b.WriteString(ev[len(`{"type":"MODIFIED","object":`) : len(ev)-2])
	}
	b.WriteString("]}\n")
	return b.Bytes()
}

// BenchmarkStreamList decodes a LIST page of 10,000 AppModels: "scan" with
// a projection that does nothing, the cost of finding the items and the
// list's metadata; "project" with the watcher's projection.
func BenchmarkStreamList(b *testing.B) {
	w := watchersOf(testEngine(b, &schema.Config{Resources: []schema.Resource{{
		Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels",
		Indexes: []schema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"}},
	}}}))[0]
	body := appModelList(10_000)
	nothing := &object{}
	for _, bc := range []struct {
		name    string
		project func(string) *object
	}{
		{"scan", func(string) *object { return nothing }},
		{"project", w.project},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				list, err := streamList(bytes.NewReader(body), bc.project)
				if err != nil || len(list.Items) != 10_000 || list.ResourceVersion != "1234567" {
					b.Fatalf("%d items, rv %q, %v", len(list.Items), list.ResourceVersion, err)
				}
			}
		})
	}
}

// TestStreamListPage: a generated page decodes whole, with its metadata.
func TestStreamListPage(t *testing.T) {
	nothing := &object{}
	list, err := streamList(strings.NewReader(string(appModelList(3))), func(string) *object { return nothing })
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 3 || list.ResourceVersion != "1234567" || list.Continue == "" ||
		list.RemainingItemCount == nil || *list.RemainingItemCount != 42 {
		t.Fatalf("list: %d items, rv %q, continue %q, remaining %v", len(list.Items), list.ResourceVersion, list.Continue, list.RemainingItemCount)
	}
}
