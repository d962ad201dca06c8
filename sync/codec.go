package sync

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unsafe"

	"github.com/tidwall/gjson"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8sschema "k8s.io/apimachinery/pkg/runtime/schema"
	jsonserializer "k8s.io/apimachinery/pkg/runtime/serializer/json"

	"github.com/iidp/metasync/indexer"
)

// object is a watched object reduced to what the indexes and fields need.
// The reflector carries it from the decoder to the watcher's store; the
// raw JSON is never kept.
type object struct {
	metav1.ObjectMeta // only Name, Namespace, UID and ResourceVersion are set
	key               string
	payload           any // projected fields as compact JSON (string), or nil
	entries           [][]indexer.Entry
}

func (o *object) GetObjectKind() k8sschema.ObjectKind { return k8sschema.EmptyObjectKind }

func (o *object) DeepCopyObject() runtime.Object {
	c := *o
	o.ObjectMeta.DeepCopyInto(&c.ObjectMeta)
	return &c
}

func (o *object) indexerObject() indexer.Object {
	return indexer.Object{Key: o.key, Payload: o.payload, Entries: o.entries}
}

// objectList is a page of a LIST, already projected.
type objectList struct {
	metav1.ListMeta
	Items []runtime.Object
}

func (l *objectList) GetObjectKind() k8sschema.ObjectKind { return k8sschema.EmptyObjectKind }

func (l *objectList) DeepCopyObject() runtime.Object {
	c := &objectList{Items: make([]runtime.Object, len(l.Items))}
	l.ListMeta.DeepCopyInto(&c.ListMeta)
	for i, it := range l.Items {
		c.Items[i] = it.DeepCopyObject()
	}
	return c
}

// unsafeString views b as a string without copying. The projection clones
// every string it keeps, so nothing outlives b.
func unsafeString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// codec decodes the apiserver's JSON straight into projected objects, with
// gjson on the raw bytes: no map[string]any, no reflection. Status objects
// (errors) decode into *metav1.Status, as the reflector expects.
type codec struct {
	project func(raw string) *object
}

var _ runtime.NegotiatedSerializer = (*codec)(nil)
var _ runtime.Serializer = (*codec)(nil)

func (c *codec) SupportedMediaTypes() []runtime.SerializerInfo {
	return []runtime.SerializerInfo{{
		MediaType:        "application/json",
		MediaTypeType:    "application",
		MediaTypeSubType: "json",
		EncodesAsText:    true,
		Serializer:       c,
		StreamSerializer: &runtime.StreamSerializerInfo{
			EncodesAsText: true,
			Serializer:    watchEventCodec{},
			Framer:        jsonserializer.Framer,
		},
	}}
}

func (c *codec) EncoderForVersion(e runtime.Encoder, _ runtime.GroupVersioner) runtime.Encoder {
	return e
}

func (c *codec) DecoderToVersion(d runtime.Decoder, _ runtime.GroupVersioner) runtime.Decoder {
	return d
}

func (c *codec) Decode(data []byte, _ *k8sschema.GroupVersionKind, _ runtime.Object) (runtime.Object, *k8sschema.GroupVersionKind, error) {
	raw := unsafeString(data)
	if !gjson.Valid(raw) {
		return nil, nil, errors.New("response is not valid JSON")
	}
	if gjson.Get(raw, "kind").Str == "Status" {
		st := &metav1.Status{}
		if err := json.Unmarshal(data, st); err != nil {
			return nil, nil, fmt.Errorf("decode status: %w", err)
		}
		return st, nil, nil
	}
	return c.project(raw), nil, nil
}

func (c *codec) Encode(runtime.Object, io.Writer) error {
	return errors.New("metasync only reads")
}

func (c *codec) Identifier() runtime.Identifier { return "metasync-projection" }

// watchEventCodec decodes the envelope of one watch event. The object's
// bytes are left in place for the object decoder, which runs before the
// next frame is read.
type watchEventCodec struct{}

func (watchEventCodec) Decode(data []byte, _ *k8sschema.GroupVersionKind, into runtime.Object) (runtime.Object, *k8sschema.GroupVersionKind, error) {
	ev, ok := into.(*metav1.WatchEvent)
	if !ok {
		return nil, nil, fmt.Errorf("cannot decode a watch event into %T", into)
	}
	raw := unsafeString(data)
	res := gjson.GetMany(raw, "type", "object")
	if !res[1].IsObject() {
		return nil, nil, fmt.Errorf("watch event without an object: %.200s", raw)
	}
	ev.Type = res[0].Str
	obj := res[1]
	if obj.Index > 0 && obj.Index+len(obj.Raw) <= len(data) {
		ev.Object = runtime.RawExtension{Raw: data[obj.Index : obj.Index+len(obj.Raw)]}
	} else {
		ev.Object = runtime.RawExtension{Raw: []byte(obj.Raw)}
	}
	return ev, nil, nil
}

func (watchEventCodec) Encode(runtime.Object, io.Writer) error {
	return errors.New("metasync only reads")
}

func (watchEventCodec) Identifier() runtime.Identifier { return "metasync-watch-event" }

// decodeList parses one LIST response page and projects its items.
func decodeList(body []byte, project func(string) *object) (*objectList, error) {
	raw := unsafeString(body)
	if !gjson.Valid(raw) {
		return nil, errors.New("list response is not valid JSON")
	}
	res := gjson.GetMany(raw, "metadata.resourceVersion", "metadata.continue", "metadata.remainingItemCount", "items")
	list := &objectList{}
	list.ResourceVersion = res[0].Str
	list.Continue = res[1].Str
	if res[2].Exists() {
		n := res[2].Int()
		list.RemainingItemCount = &n
	}
	if res[0].Str == "" {
		return nil, errors.New("list response has no metadata.resourceVersion")
	}
	res[3].ForEach(func(_, item gjson.Result) bool {
		list.Items = append(list.Items, project(item.Raw))
		return true
	})
	// Strings in list point into body; clone the ones we keep.
	list.ResourceVersion = clone(list.ResourceVersion)
	list.Continue = clone(list.Continue)
	return list, nil
}

func clone(s string) string {
	if s == "" {
		return ""
	}
	return string([]byte(s))
}
