package sync

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
type object struct {
	rv string // metadata.resourceVersion
	// initialEnd marks the bookmark that ends a watch's initial events
	// (see listByWatch).
	initialEnd bool
	// ix is the object as the indexer takes it: key, entries and payload
	// (the projected fields as compact JSON, a string), already prepared.
	ix indexer.Object
	// skipped holds what the rules that skipped the object said, for the
	// offline feed, which reports them (a watch logs and counts them, and
	// records nothing here).
	skipped []error
	// failed holds the rules that fail for the object, for the set of
	// objects failing now (failingSet), nil when none does.
	failed []ruleFailure
}

func (o *object) GetObjectKind() k8sschema.ObjectKind { return k8sschema.EmptyObjectKind }

func (o *object) DeepCopyObject() runtime.Object {
	c := *o
	return &c
}

// GetObjectMeta gives the reflector what it reads of a watched object, its
// resource version (and name), built on demand: the objects of a LIST stay
// small while they wait to be applied.
func (o *object) GetObjectMeta() metav1.Object {
	m := &metav1.ObjectMeta{ResourceVersion: o.rv, Name: o.ix.Key}
	if o.initialEnd {
		m.Annotations = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
	}
	if ns, name, ok := strings.Cut(o.ix.Key, "/"); ok {
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
			Framer:        jsonFramer{},
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

// watchEventCodec decodes the envelope of one watch event.
type watchEventCodec struct{}

func (watchEventCodec) Decode(data []byte, _ *k8sschema.GroupVersionKind, into runtime.Object) (runtime.Object, *k8sschema.GroupVersionKind, error) {
	ev, ok := into.(*metav1.WatchEvent)
	if !ok {
		return nil, nil, fmt.Errorf("cannot decode a watch event into %T", into)
	}
	raw := unsafeString(data)
	typ, obj, ok := splitEvent(raw)
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

// splitEvent returns the type and the object of a watch event framed as
// the apiserver writes one, {"type":"...","object":{...}} (and any
// whitespace after), without reading the object: codec's Decode checks it
// with gjson.Valid. ok is false for any other shape, which gjson reads.
func splitEvent(raw string) (typ, obj string, ok bool) {
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

func (watchEventCodec) Encode(runtime.Object, io.Writer) error {
	return errors.New("metasync only reads")
}

func (watchEventCodec) Identifier() runtime.Identifier { return "metasync-watch-event" }

// listKey is the top-level key of a LIST response whose value is being
// read, of those streamList looks at.
type listKey uint8

const (
	keyNone     listKey = iota // no key, or the empty one
	keyItems                   // "items"
	keyMetadata                // "metadata"
	keyOther                   // any other
)

// streamList reads one LIST response page from r and projects each item
// as soon as its bytes have arrived, so that decoding overlaps the
// transfer, and the page is never held whole in memory. project must copy
// whatever it keeps: the buffer is reused.
func streamList(r io.Reader, project func(string) *object) (*objectList, error) {
	list := &objectList{}
	var (
		buf      = make([]byte, 0, 256<<10)
		chunk    = make([]byte, 128<<10)
		sc       bracketScanner // depth and strings, up to pos
		keyStart int            // start of the last string at depth 1
		lastKey  listKey
		valStart = -1 // start of the current value at depth 1 (metadata)
		inItems  bool // inside the top-level "items" array
		itemFrom = -1 // start of the current item
		sawItems bool
		sawMeta  bool
		pos      int
	)
	for {
		n, rerr := r.Read(chunk)
		buf = append(buf, chunk[:n]...)
		for {
			// The keys and values of the response are at depth 1, its
			// items at depth 2: deeper bytes are skipped by the scanner.
			limit := 1
			if inItems {
				limit = 2
			}
			if pos = sc.scan(buf, pos, limit); pos == len(buf) {
				break
			}
			switch c := buf[pos]; c {
			case '"':
				switch {
				case sc.inString: // opens
					if sc.depth == 1 {
						keyStart = pos
					}
				case sc.depth == 1 && valStart < 0:
					switch unsafeString(buf[keyStart+1 : pos]) {
					case "":
						lastKey = keyNone
					case "items":
						lastKey = keyItems
					case "metadata":
						lastKey = keyMetadata
					default:
						lastKey = keyOther
					}
				}
			case '{', '[':
				// sc.depth is already inside the bracket.
				if sc.depth == 2 && lastKey != keyNone && valStart < 0 && !inItems {
					if lastKey == keyItems && c == '[' {
						inItems, sawItems = true, true
					} else {
						valStart = pos
					}
				}
				if sc.depth == 3 && inItems && c == '{' {
					itemFrom = pos
				}
			case '}', ']':
				switch {
				case sc.depth == 2 && inItems && itemFrom >= 0:
					list.Items = append(list.Items, project(unsafeString(buf[itemFrom:pos+1])))
					itemFrom = -1
				case sc.depth == 1 && inItems:
					inItems, lastKey = false, keyNone
				case sc.depth == 1 && valStart >= 0:
					if lastKey == keyMetadata {
						meta := gjson.GetManyBytes(buf[valStart:pos+1], "resourceVersion", "continue", "remainingItemCount")
						list.ResourceVersion = meta[0].Str
						list.Continue = meta[1].Str
						if meta[2].Exists() {
							rc := meta[2].Int()
							list.RemainingItemCount = &rc
						}
						sawMeta = true
					}
					valStart, lastKey = -1, keyNone
				}
			case ',':
				if sc.depth == 1 {
					valStart, lastKey = -1, keyNone
				}
			}
			pos++
		}
		// Keep only what a pending item, key or value still needs.
		keep := pos
		switch {
		case itemFrom >= 0:
			keep = itemFrom
		case valStart >= 0:
			keep = valStart
		case sc.inString && sc.depth == 1:
			keep = keyStart
		}
		// Compact only when that frees at least half the buffer, so that
		// small reads cost no more than large ones.
		if keep > 0 && keep >= len(buf)/2 {
			rest := copy(buf, buf[keep:])
			buf = buf[:rest]
			pos -= keep
			if itemFrom >= 0 {
				itemFrom -= keep
			}
			if valStart >= 0 {
				valStart -= keep
			}
			if keyStart >= keep {
				keyStart -= keep
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return nil, rerr
		}
	}
	if sc.depth != 0 || sc.inString {
		return nil, errors.New("list response ends before its JSON does")
	}
	if !sawMeta || list.ResourceVersion == "" {
		return nil, errors.New("list response has no metadata.resourceVersion")
	}
	if !sawItems && list.Items == nil {
		list.Items = []runtime.Object{}
	}
	return list, nil
}
