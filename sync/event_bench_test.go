package sync

import (
	"bytes"
	"fmt"
	"io"
	"testing"

	"github.com/iidp/metasync/sync/internal/follow"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"

	"github.com/iidp/metasync/indexer"
	"github.com/iidp/metasync/schema"
)

// appModelEvent is a watch event as the apiserver sends it for an AppModel
// written by server-side apply, managed fields and all.
func appModelEvent(i, rv int) string {
	return fmt.Sprintf(`{"type":"MODIFIED","object":{"apiVersion":"iidp.com/v1","kind":"AppModel","metadata":{"creationTimestamp":"2026-11-29T22:44:50Z","generation":2,"labels":{"iidp":"iidp"},"managedFields":[{"apiVersion":"iidp.com/v1","fieldsType":"FieldsV1","fieldsV1":{"f:metadata":{"f:labels":{"f:iidp":{}}},"f:spec":{"f:models":{},"f:type":{},"f:version":{}}},"manager":"bench","operation":"Apply","time":"2026-11-29T22:44:50Z"}],"name":"app-%06d","namespace":"bench","resourceVersion":"%d","uid":"4f1c2a8e-0d7b-4a51-9d3e-%012d"},"spec":{"models":["model-%06d-0","model-%06d-1","model-%06d-2","write-%d"],"type":"model","version":"1.0.0"}}}`+"\n", i, rv, i, i, i, i, rv)
}

// BenchmarkWatchEvent is an engine's work for one watch event, from the
// bytes of the stream to the commit, on a source of 10,000 AppModels: the
// cost that 50 engines in one process pay 50 times per write.
func BenchmarkWatchEvent(b *testing.B) {
	w := watchersOf(testEngine(b, &schema.Config{Resources: []schema.Resource{{
		Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels",
		Indexes: []schema.Index{{Name: "model-to-app", Key: "spec.models", Value: "metadata.name"}},
	}}}))[0]
	const n = 10_000
	objs := make([]indexer.Object, n)
	for i := range n {
		ev := appModelEvent(i, 1_000_000+i)
		objs[i] = w.Project(ev[len(`{"type":"MODIFIED","object":`) : len(ev)-2]).Ix
	}
	w.Src.Replace(objs)
	var stream bytes.Buffer
	for i := range 4096 {
		stream.WriteString(appModelEvent(i*7%n, 100+i))
	}
	c := &follow.Codec{Project: w.Project}
	info := c.SupportedMediaTypes()[0].StreamSerializer
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; {
		frames := info.Framer.NewFrameReader(io.NopCloser(bytes.NewReader(stream.Bytes())))
		dec := streaming.NewDecoder(frames, info.Serializer)
		for ; i < b.N; i++ {
			var ev metav1.WatchEvent
			if _, _, err := dec.Decode(nil, &ev); err == io.EOF {
				break
			} else if err != nil {
				b.Fatal(err)
			}
			obj, _, err := c.Decode(ev.Object.Raw, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			if err := w.Update(obj); err != nil {
				b.Fatal(err)
			}
		}
	}
}
