package follow

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/iidp/metasync/indexer"
	compiled "github.com/iidp/metasync/internal/plan"
)

// The projection: an object's JSON in, its key, index entries and
// fields out (the raw object is never kept).

// Project reduces one object's JSON to its object key, entries and payload.
// It never fails: a rule that cannot be evaluated on this object is counted
// and the object contributes nothing to that index.
func (w *Watcher) Project(raw string) *Projected {
	meta := gjson.GetMany(raw, "metadata.name", "metadata.namespace", "metadata.resourceVersion", "metadata.creationTimestamp")
	// raw may be reused once project returns: everything kept is copied,
	// the entries by Prepare into the indexer's encoding.
	o := &Projected{RV: strings.Clone(meta[2].Str)}
	// Only a bookmark has no name: its annotation is read for it alone,
	// not on every object's way.
	o.initialEnd = meta[0].Str == "" && gjson.Get(raw, initialEventsEndPath).Str == "true"
	// The provenance that explain tells and unique indexes order
	// claimants by; Prepare encodes it beside the entries.
	o.Ix.Meta = indexer.Meta{Version: meta[2].Str, Created: createdAt(meta[3].Str)}
	key := meta[0].Str // Prepare copies it
	if meta[1].Str != "" {
		key = meta[1].Str + "/" + meta[0].Str
	}
	o.Ix.Key = w.KeyPrefix + key
	o.Ix.Entries = make([][]indexer.Entry, len(w.Plan.Indexes))
	// The rules of an object read one Doc: an EndpointSlice is read once
	// for all its indexes.
	doc := compiled.Doc{JSON: raw}
	var keys, values []string
	// A fallback and hints share their index's key rule and limit: its
	// keys are evaluated once for the three.
	var keysOf *compiled.Rule
	var keysLim compiled.Limit
	var keysErr error
	keyBytes := 0
	for i, ix := range w.Plan.Indexes {
		values = values[:0]
		lim := ix.Limit()
		if ix.Key != keysOf || lim != keysLim {
			keys, keyBytes = keys[:0], 0
			keysErr = ix.Key.EvalDoc(&doc, lim, func(s string) { keys = append(keys, s); keyBytes += len(s) })
			keysOf, keysLim = ix.Key, lim
		}
		valueBytes := 0
		err := keysErr
		if err == nil && len(keys) > 0 {
			if ix.Value == nil {
				values = append(values, key)
				valueBytes = len(key)
			} else {
				err = ix.Value.EvalDoc(&doc, lim, func(s string) { values = append(values, s); valueBytes += len(s) })
			}
		}
		if err == nil {
			// keys × values entries, each key written with each value.
			n, size := len(keys)*len(values), len(values)*keyBytes+len(keys)*valueBytes
			if n > ix.MaxEntries || size > ix.MaxBytes {
				err = fmt.Errorf("%d keys × %d values: %d entries of %d bytes", len(keys), len(values), n, size)
			}
		}
		if err != nil {
			var limit *compiled.LimitError
			if errors.As(err, &limit) || !errors.As(err, new(*compiled.ShapeError)) {
				err = fmt.Errorf("over maxEntriesPerObject (%d entries, %d bytes): %w; the object adds nothing to this index", ix.MaxEntries, ix.MaxBytes, err)
			}
			w.ruleError(i, key, err)
			o.fail(ix.Public(), err)
			if w.ReportSkipped.Load() {
				o.skip(&ix, err, keysErr != nil)
			}
			continue
		}
		if len(keys) == 0 || len(values) == 0 {
			continue
		}
		es := make([]indexer.Entry, 0, len(keys)*len(values))
		for _, k := range keys {
			for _, v := range values {
				es = append(es, indexer.Entry{Key: k, Value: v})
			}
		}
		o.Ix.Entries[i] = es
	}
	if len(w.Plan.Fields) > 0 {
		var over error
		o.Ix.Payload, over = projectFields(&doc, w.Plan.Fields)
		if over != nil {
			w.ruleLog.Do(func() {
				w.Log.Warn("field left out of an object's projection", "object", key, "error", over.Error())
			})
		}
	}
	w.Src.Prepare(&o.Ix)
	return o
}

// createdAt reads a creationTimestamp (RFC 3339, in seconds) as seconds
// since 1970; 0 when missing or unreadable.
func createdAt(s string) int64 {
	if s == "" {
		return 0
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil || t.Unix() <= 0 {
		return 0
	}
	return t.Unix()
}

// projectFields builds the compact JSON object of the configured fields.
// A field whose rule yields more than compiled.FieldLimit is left out, and
// the last such error returned.
func projectFields(doc *compiled.Doc, fields []compiled.Field) (string, error) {
	raw := doc.JSON
	var over error
	var b strings.Builder
	b.WriteByte('{')
	n := 0
	for _, f := range fields {
		var value string
		if path, ok := f.Rule.SinglePath(); ok {
			res := gjson.Get(raw, path)
			if !res.Exists() {
				continue
			}
			value = res.Raw
		} else {
			var vals []string
			// Bounded as an index is: a template of arrays yields every
			// combination. A field over the bound is left out.
			err := f.Rule.EvalDoc(doc, compiled.FieldLimit, func(s string) { vals = append(vals, s) })
			if errors.As(err, new(*compiled.LimitError)) {
				over = fmt.Errorf("field %s: %w", f.Name, err)
			}
			if err != nil || len(vals) == 0 {
				continue
			}
			if len(vals) == 1 {
				value = strconv.Quote(vals[0])
			} else {
				quoted := make([]string, len(vals))
				for i, v := range vals {
					quoted[i] = strconv.Quote(v)
				}
				value = "[" + strings.Join(quoted, ",") + "]"
			}
		}
		if n > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Quote(f.Name))
		b.WriteByte(':')
		b.WriteString(value)
		n++
	}
	b.WriteByte('}')
	return b.String(), over
}

func (w *Watcher) ruleError(i int, key string, err error) {
	w.ruleErrors[i].Add(1)
	w.ruleLog.Do(func() {
		w.Log.Warn("rule skipped for an object", "index", w.Plan.Indexes[i].Public(), "object", key, "error", err.Error())
	})
}

// fail records that a rule of index (a public name) fails for the
// object; the first error of an index stands for it.
func (o *Projected) fail(index string, err error) {
	for _, rf := range o.Failed {
		if rf.Index == index {
			return
		}
	}
	o.Failed = append(o.Failed, Failure{Index: index, Err: err.Error()})
}

// skip records, for the Feed (NewOffline), that a rule of ix skipped the
// object: once per index, its fallback's and hints' rules named as such;
// a key rule that failed for the index and its companions (they share
// it) once for the three.
func (o *Projected) skip(ix *compiled.Index, err error, keyRule bool) {
	name := ix.Public()
	switch {
	case keyRule:
	case ix.FallbackOf != "":
		name += " (its fallback)"
	case ix.HintsOf != "":
		name += " (its hints)"
	}
	e := fmt.Errorf("index %s: %w", name, err)
	for _, seen := range o.Skipped {
		if seen.Error() == e.Error() {
			return
		}
	}
	o.Skipped = append(o.Skipped, e)
}
