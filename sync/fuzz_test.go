package sync

import (
	"reflect"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/iidp/metasync/sync/internal/follow"

	"github.com/tidwall/gjson"
)

// FuzzStreamList: any LIST body, in any chunking, decodes to the same
// result as read whole, or fails; the projection never panics.
func FuzzStreamList(f *testing.F) {
	f.Add([]byte(trickyList))
	f.Add([]byte(`{"metadata":{"resourceVersion":"1"},"items":[{"metadata":{"name":"a"},"spec":{"models":"x"}}]}`))
	f.Add([]byte(`{"items":[{"a":"}"}],"metadata":{"resourceVersion":"2","continue":"c"}}`))
	f.Add([]byte(`{"metadata":{"resourceVersion":"1"},"items":[[],{},"s",1]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		e := testEngine(t, trickyConfig())
		w := watchersOf(e)[0]
		whole, errWhole := follow.StreamList(strings.NewReader(string(body)), w.Project)
		bytewise, errBytes := follow.StreamList(iotest.OneByteReader(strings.NewReader(string(body))), w.Project)
		if (errWhole == nil) != (errBytes == nil) {
			t.Fatalf("whole: %v, byte by byte: %v", errWhole, errBytes)
		}
		if errWhole != nil {
			return
		}
		if whole.ResourceVersion != bytewise.ResourceVersion || len(whole.Items) != len(bytewise.Items) {
			t.Fatalf("whole and byte by byte differ: %d vs %d items", len(whole.Items), len(bytewise.Items))
		}
		for i := range whole.Items {
			a, b := whole.Items[i].(*follow.Projected), bytewise.Items[i].(*follow.Projected)
			if !reflect.DeepEqual(a.Ix, b.Ix) { // the prepared encoding included
				t.Fatalf("item %d differs: %+v vs %+v", i, a.Ix, b.Ix)
			}
		}
	})
}

// FuzzSplitEvent: where the envelope of a watch event is split without
// gjson and its object is valid JSON, gjson reads the same type and
// object.
func FuzzSplitEvent(f *testing.F) {
	f.Add(`{"type":"ADDED","object":{"a":1}}`)
	f.Add(`{"type":"ADDED","object":{"a":"}}"}}` + "\n")
	f.Add(`{"type":"ADDED","object":{"a":1},"x":{}}`)
	f.Fuzz(func(t *testing.T, raw string) {
		typ, obj, ok := follow.SplitEvent(raw)
		if !ok || !gjson.Valid(obj) {
			return
		}
		res := gjson.GetMany(raw, "type", "object")
		if res[0].Str != typ || res[1].Raw != obj {
			t.Fatalf("split %q into %q and %q; gjson reads %q and %q", raw, typ, obj, res[0].Str, res[1].Raw)
		}
	})
}
