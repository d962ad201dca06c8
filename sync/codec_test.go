package sync

import (
	"bytes"
	"strings"
	"testing"

	"github.com/iidp/metasync/sync/internal/follow"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	nothing := &follow.Projected{}
	for _, bc := range []struct {
		name    string
		project func(string) *follow.Projected
	}{
		{"scan", func(string) *follow.Projected { return nothing }},
		{"project", w.Project},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				list, err := follow.StreamList(bytes.NewReader(body), bc.project)
				if err != nil || len(list.Items) != 10_000 || list.ResourceVersion != "1234567" {
					b.Fatalf("%d items, rv %q, %v", len(list.Items), list.ResourceVersion, err)
				}
			}
		})
	}
}

// TestStreamListPage: a generated page decodes whole, with its metadata.
func TestStreamListPage(t *testing.T) {
	nothing := &follow.Projected{}
	list, err := follow.StreamList(strings.NewReader(string(appModelList(3))), func(string) *follow.Projected { return nothing })
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 3 || list.ResourceVersion != "1234567" || list.Continue == "" ||
		list.RemainingItemCount == nil || *list.RemainingItemCount != 42 {
		t.Fatalf("list: %d items, rv %q, continue %q, remaining %v", len(list.Items), list.ResourceVersion, list.Continue, list.RemainingItemCount)
	}
}

// TestSplitEvent: the envelope of a watch event as the apiserver frames
// it is split without reading the object; any other shape is left to
// gjson, and what splits wrongly is an invalid object, refused.
func TestSplitEvent(t *testing.T) {
	for _, tc := range []struct {
		in, typ, obj string
		ok           bool
	}{
		{in: `{"type":"ADDED","object":{"a":1}}`, typ: "ADDED", obj: `{"a":1}`, ok: true},
		{in: "{\"type\":\"BOOKMARK\",\"object\":{}}\n\r\t ", typ: "BOOKMARK", obj: `{}`, ok: true},
		{in: `{"type":"ADDED","object":{"a":{"b":"}}"}}}`, typ: "ADDED", obj: `{"a":{"b":"}}"}}`, ok: true},
		{in: `{"type":"A\"B","object":{}}`},             // an escaped type
		{in: `{"object":{},"type":"ADDED"}`},            // another order
		{in: `{"type" : "ADDED", "object" : {}}`},       // spaces
		{in: `{"type":"ADDED","object":null}`},          // no object
		{in: `{"type":"ADDED","object":{"a":1},"x":2}`}, // a field after the object
		{in: `{"type":"ADDED","object":{`},
		{in: `{"type":"ADDED`},
		{in: ``},
	} {
		typ, obj, ok := follow.SplitEvent(tc.in)
		if ok != tc.ok || typ != tc.typ || obj != tc.obj {
			t.Errorf("splitEvent(%q) = %q, %q, %v; want %q, %q, %v", tc.in, typ, obj, ok, tc.typ, tc.obj, tc.ok)
		}
	}
	// A field after the object that ends in a brace splits wrongly; the
	// object is then not valid JSON, and the codec refuses it.
	var ev metav1.WatchEvent
	if _, _, err := (follow.WatchEventCodec{}).Decode([]byte(`{"type":"ADDED","object":{"a":1},"x":{}}`), nil, &ev); err != nil {
		t.Fatal(err)
	}
	if _, _, err := (&follow.Codec{Project: func(string) *follow.Projected { t.Fatal("projected"); return nil }}).Decode(ev.Object.Raw, nil, nil); err == nil {
		t.Fatalf("the object %q was accepted", ev.Object.Raw)
	}
}
