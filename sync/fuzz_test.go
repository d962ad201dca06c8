package sync

import (
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
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
		whole, errWhole := streamList(strings.NewReader(string(body)), w.project)
		bytewise, errBytes := streamList(iotest.OneByteReader(strings.NewReader(string(body))), w.project)
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
			a, b := whole.Items[i].(*object), bytewise.Items[i].(*object)
			if !reflect.DeepEqual(a.ix, b.ix) { // the prepared encoding included
				t.Fatalf("item %d differs: %+v vs %+v", i, a.ix, b.ix)
			}
		}
	})
}
