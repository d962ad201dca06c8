package follow

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8sschema "k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/iidp/metasync/indexer"
)

// object is a watched object reduced to what the indexes and fields need.
// The reflector carries it from the decoder to the watcher's store; the
// raw JSON is never kept.
type Projected struct {
	RV string // metadata.resourceVersion
	// initialEnd marks the bookmark that ends a watch's initial events
	// (see listByWatch).
	initialEnd bool
	// Ix is the object as the indexer takes it: key, entries and payload
	// (the projected fields as compact JSON, a string), already prepared.
	Ix indexer.Object
	// Skipped holds what the rules that skipped the object said, for the
	// Feed (NewOffline), which reports them (a watch logs and counts them, and
	// records nothing here).
	Skipped []error
	// Failed holds the rules that fail for the object, for the set of
	// objects failing now (failingSet), nil when none does.
	Failed []Failure
}

func (o *Projected) GetObjectKind() k8sschema.ObjectKind { return k8sschema.EmptyObjectKind }

func (o *Projected) DeepCopyObject() runtime.Object {
	c := *o
	return &c
}

// GetObjectMeta gives the reflector what it reads of a watched object, its
// resource version (and name), built on demand: the objects of a LIST stay
// small while they wait to be applied.
func (o *Projected) GetObjectMeta() metav1.Object {
	m := &metav1.ObjectMeta{ResourceVersion: o.RV, Name: o.Ix.Key}
	if o.initialEnd {
		m.Annotations = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
	}
	if ns, name, ok := strings.Cut(o.Ix.Key, "/"); ok {
		m.Namespace, m.Name = ns, name
	}
	return m
}

// initialEventsEndPath is where the bookmark that ends a watch's initial
// events says so (metav1.InitialEventsAnnotationKey), for gjson.
const initialEventsEndPath = `metadata.annotations.k8s\.io/initial-events-end`

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

// Codec decodes the apiserver's JSON straight into projected objects, with
// gjson on the raw bytes: no map[string]any, no reflection. Status objects
// (errors) decode into *metav1.Status, as the reflector expects.
type Codec struct {
	Project func(raw string) *Projected
}

var _ runtime.NegotiatedSerializer = (*Codec)(nil)
var _ runtime.Serializer = (*Codec)(nil)

func (c *Codec) SupportedMediaTypes() []runtime.SerializerInfo {
	return []runtime.SerializerInfo{{
		MediaType:        "application/json",
		MediaTypeType:    "application",
		MediaTypeSubType: "json",
		EncodesAsText:    true,
		Serializer:       c,
		StreamSerializer: &runtime.StreamSerializerInfo{
			EncodesAsText: true,
			Serializer:    WatchEventCodec{},
			Framer:        JSONFramer{},
		},
	}}
}

func (c *Codec) EncoderForVersion(e runtime.Encoder, _ runtime.GroupVersioner) runtime.Encoder {
	return e
}

func (c *Codec) DecoderToVersion(d runtime.Decoder, _ runtime.GroupVersioner) runtime.Decoder {
	return d
}

func (c *Codec) Decode(data []byte, _ *k8sschema.GroupVersionKind, _ runtime.Object) (runtime.Object, *k8sschema.GroupVersionKind, error) {
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
	return c.Project(raw), nil, nil
}

func (c *Codec) Encode(runtime.Object, io.Writer) error {
	return errors.New("metasync only reads")
}

func (c *Codec) Identifier() runtime.Identifier { return "metasync-projection" }

// WatchEventCodec decodes the envelope of one watch event.
type WatchEventCodec struct{}

func (WatchEventCodec) Decode(data []byte, _ *k8sschema.GroupVersionKind, into runtime.Object) (runtime.Object, *k8sschema.GroupVersionKind, error) {
	ev, ok := into.(*metav1.WatchEvent)
	if !ok {
		return nil, nil, fmt.Errorf("cannot decode a watch event into %T", into)
	}
	raw := unsafeString(data)
	typ, obj, ok := SplitEvent(raw)
	if !ok {
		res := gjson.GetMany(raw, "type", "object")
		if !res[1].IsObject() {
			return nil, nil, fmt.Errorf("watch event without an object: %.200s", raw)
		}
		typ, obj = res[0].Str, res[1].Raw
	}
	ev.Type = strings.Clone(typ) // data is reused for the next event
	// Not a copy: client-go's watch decoder decodes the object (codec's
	// Decode, which keeps nothing of it uncopied) before it reads the next
	// event into data.
	ev.Object = runtime.RawExtension{Raw: unsafe.Slice(unsafe.StringData(obj), len(obj))}
	return ev, nil, nil
}

// SplitEvent returns the type and the object of a watch event framed as
// the apiserver writes one, {"type":"...","object":{...}} (and any
// whitespace after), without reading the object: codec's Decode checks it
// with gjson.Valid. ok is false for any other shape, which gjson reads.
func SplitEvent(raw string) (typ, obj string, ok bool) {
	const head, mid = `{"type":"`, `","object":{`
	rest, found := strings.CutPrefix(raw, head)
	if !found {
		return "", "", false
	}
	end := strings.IndexByte(rest, '"')
	if end < 0 || strings.IndexByte(rest[:end], '\\') >= 0 || !strings.HasPrefix(rest[end:], mid) {
		return "", "", false
	}
	typ, obj = rest[:end], strings.TrimRight(rest[end+len(mid)-1:], " \t\r\n")
	// The event's closing brace, after the object's.
	if !strings.HasSuffix(obj, "}}") {
		return "", "", false
	}
	return typ, obj[:len(obj)-1], true
}

func (WatchEventCodec) Encode(runtime.Object, io.Writer) error {
	return errors.New("metasync only reads")
}

func (WatchEventCodec) Identifier() runtime.Identifier { return "metasync-watch-event" }

// listKey is the top-level key of a LIST response whose value is being
// read, of those streamList looks at.
type listKey uint8

const (
	keyNone     listKey = iota // no key, or the empty one
	keyItems                   // "items"
	keyMetadata                // "metadata"
	keyOther                   // any other
)

// StreamList reads one LIST response page from r and projects each item
// as soon as its bytes have arrived, so that decoding overlaps the
// transfer, and the page is never held whole in memory. project must copy
// whatever it keeps: the buffer is reused.
func StreamList(r io.Reader, project func(string) *Projected) (*objectList, error) {
	ls := listScan{list: &objectList{}, project: project, buf: make([]byte, 0, 256<<10), valStart: -1, itemFrom: -1}
	chunk := make([]byte, 128<<10)
	for {
		n, rerr := r.Read(chunk)
		ls.buf = append(ls.buf, chunk[:n]...)
		ls.scan()
		ls.compact()
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return nil, rerr
		}
	}
	list := ls.list
	if ls.sc.Depth != 0 || ls.sc.InString {
		return nil, errors.New("list response ends before its JSON does")
	}
	if !ls.sawMeta || list.ResourceVersion == "" {
		return nil, errors.New("list response has no metadata.resourceVersion")
	}
	if !ls.sawItems && list.Items == nil {
		list.Items = []runtime.Object{}
	}
	return list, nil
}

// listScan is streamList's state between reads: the bytes not yet
// consumed and where the scanner stands in them.
type listScan struct {
	list     *objectList
	project  func(string) *Projected
	buf      []byte
	sc       BracketScanner // depth and strings, up to pos
	keyStart int            // start of the last string at depth 1
	lastKey  listKey
	valStart int  // start of the current value at depth 1 (metadata), or -1
	inItems  bool // inside the top-level "items" array
	itemFrom int  // start of the current item, or -1
	sawItems bool
	sawMeta  bool
	pos      int
}

// scan reads buf from pos to its end: the keys and values of the response
// are at depth 1, its items at depth 2; deeper bytes are skipped by the
// scanner.
func (ls *listScan) scan() {
	buf := ls.buf
	for {
		limit := 1
		if ls.inItems {
			limit = 2
		}
		if ls.pos = ls.sc.Scan(buf, ls.pos, limit); ls.pos == len(buf) {
			return
		}
		pos := ls.pos
		switch c := buf[pos]; c {
		case '"':
			switch {
			case ls.sc.InString: // opens
				if ls.sc.Depth == 1 {
					ls.keyStart = pos
				}
			case ls.sc.Depth == 1 && ls.valStart < 0:
				switch unsafeString(buf[ls.keyStart+1 : pos]) {
				case "":
					ls.lastKey = keyNone
				case "items":
					ls.lastKey = keyItems
				case "metadata":
					ls.lastKey = keyMetadata
				default:
					ls.lastKey = keyOther
				}
			}
		case '{', '[':
			// sc.depth is already inside the bracket.
			if ls.sc.Depth == 2 && ls.lastKey != keyNone && ls.valStart < 0 && !ls.inItems {
				if ls.lastKey == keyItems && c == '[' {
					ls.inItems, ls.sawItems = true, true
				} else {
					ls.valStart = pos
				}
			}
			if ls.sc.Depth == 3 && ls.inItems && c == '{' {
				ls.itemFrom = pos
			}
		case '}', ']':
			ls.closed(pos)
		case ',':
			if ls.sc.Depth == 1 {
				ls.valStart, ls.lastKey = -1, keyNone
			}
		}
		ls.pos++
	}
}

// closed handles a bracket that closes at pos: an item ends, the items
// end, or the metadata ends.
func (ls *listScan) closed(pos int) {
	switch {
	case ls.sc.Depth == 2 && ls.inItems && ls.itemFrom >= 0:
		ls.list.Items = append(ls.list.Items, ls.project(unsafeString(ls.buf[ls.itemFrom:pos+1])))
		ls.itemFrom = -1
	case ls.sc.Depth == 1 && ls.inItems:
		ls.inItems, ls.lastKey = false, keyNone
	case ls.sc.Depth == 1 && ls.valStart >= 0:
		if ls.lastKey == keyMetadata {
			meta := gjson.GetManyBytes(ls.buf[ls.valStart:pos+1], "resourceVersion", "continue", "remainingItemCount")
			ls.list.ResourceVersion = meta[0].Str
			ls.list.Continue = meta[1].Str
			if meta[2].Exists() {
				rc := meta[2].Int()
				ls.list.RemainingItemCount = &rc
			}
			ls.sawMeta = true
		}
		ls.valStart, ls.lastKey = -1, keyNone
	}
}

// compact keeps only what a pending item, key or value still needs, and
// only when that frees at least half the buffer, so that small reads cost
// no more than large ones.
func (ls *listScan) compact() {
	keep := ls.pos
	switch {
	case ls.itemFrom >= 0:
		keep = ls.itemFrom
	case ls.valStart >= 0:
		keep = ls.valStart
	case ls.sc.InString && ls.sc.Depth == 1:
		keep = ls.keyStart
	}
	if keep == 0 || keep < len(ls.buf)/2 {
		return
	}
	rest := copy(ls.buf, ls.buf[keep:])
	ls.buf = ls.buf[:rest]
	ls.pos -= keep
	if ls.itemFrom >= 0 {
		ls.itemFrom -= keep
	}
	if ls.valStart >= 0 {
		ls.valStart -= keep
	}
	if ls.keyStart >= keep {
		ls.keyStart -= keep
	}
}
