package plan

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/tidwall/gjson"
)

// zones and nodes are an endpoint's hints.
func (e *sliceEndpoint) zones() []string {
	if e.hints == nil {
		return nil
	}
	return e.hints.zones
}

func (e *sliceEndpoint) nodes() []string {
	if e.hints == nil {
		return nil
	}
	return e.hints.nodes
}

// sameSlice reports whether two readings of a slice agree.
func sameSlice(a, b *slice) bool {
	if a.fqdn != b.fqdn || !slices.Equal(a.ports, b.ports) || len(a.eps) != len(b.eps) {
		return false
	}
	for i := range a.eps {
		x, y := a.eps[i], b.eps[i]
		if x.addr != y.addr || x.ready != y.ready || x.serving != y.serving || x.terminating != y.terminating ||
			!slices.Equal(x.zones(), y.zones()) || !slices.Equal(x.nodes(), y.nodes()) {
			return false
		}
	}
	return true
}

// checkScan: whatever scanSlice accepts of a valid document, it reads as
// gjson does.
func checkScan(t *testing.T, doc string) bool {
	t.Helper()
	got, ok := scanSlice(doc)
	if !gjson.Valid(doc) || !ok {
		return ok
	}
	if want := parseSliceGJSON(doc); !sameSlice(got, want) {
		t.Fatalf("scanSlice(%s)\n = %+v\nwant %+v", doc, *got, *want)
	}
	return true
}

// randomSlice writes an EndpointSlice with, at random, what the apiserver
// writes and what it never does: unset and odd conditions, nulls, keys
// twice, white space, escapes, numbers of every form, lists that are
// objects or strings.
func randomSlice(r *rand.Rand) string {
	pick := func(s ...string) string { return s[r.IntN(len(s))] }
	ws := func() string { return pick("", "", "", " ", "\n ") }
	var b strings.Builder
	b.WriteString("{" + ws() + `"metadata":{"name":"a\"b","managedFields":[{"f:endpoints":{}}]}`)
	switch r.IntN(12) {
	case 0:
		b.WriteString(`,"addressType":` + pick(`"FQ\u0044N"`, `null`, `5`, `""`))
	case 1:
		b.WriteString(`,"addressType":"FQDN","addressType":"IPv4"`)
	default:
		b.WriteString(`,"addressType":` + pick(`"IPv4"`, `"IPv6"`, `"FQDN"`))
	}
	for range r.IntN(3) {
		b.WriteString(`,"ports":`)
		switch r.IntN(8) {
		case 0:
			b.WriteString(pick(`null`, `{}`, `{"a":{"name":"x","port":1}}`, `"ports"`, `7`))
		default:
			b.WriteString("[")
			for j := range r.IntN(4) {
				if j > 0 {
					b.WriteString("," + ws())
				}
				if r.IntN(12) == 0 {
					b.WriteString(pick(`null`, `"x"`, `[]`, `5`))
					continue
				}
				var ms []string
				if r.IntN(5) > 0 {
					ms = append(ms, `"name":`+pick(`"http"`, `"grpc"`, `""`, `null`, `5`, `"h\u0074tp"`, `{"a":1}`))
				}
				if r.IntN(6) > 0 {
					ms = append(ms, `"port":`+pick(`8080`, `9090`, `1`, `65535`, `65536`, `0`, `-1`, `8080.0`, `8e3`, `"8080"`, `null`, `123456`, `true`))
				}
				if r.IntN(4) == 0 {
					ms = append(ms, `"protocol":"TCP"`)
				}
				if r.IntN(10) == 0 {
					ms = append(ms, `"port":9191`, `"name":"dup"`)
				}
				r.Shuffle(len(ms), func(i, j int) { ms[i], ms[j] = ms[j], ms[i] })
				b.WriteString("{" + strings.Join(ms, ","+ws()) + "}")
			}
			b.WriteString(ws() + "]")
		}
	}
	for range 1 + r.IntN(2) {
		b.WriteString(`,` + ws() + `"endpoints"` + ws() + `:`)
		if r.IntN(12) == 0 {
			b.WriteString(pick(`null`, `{}`, `{"x":{"addresses":["10.9.9.9"]}}`, `"e"`, `[1]`, `["{}"]`))
			continue
		}
		b.WriteString("[")
		for j := range r.IntN(6) {
			if j > 0 {
				b.WriteString(",")
			}
			var ms []string
			if r.IntN(8) > 0 {
				ms = append(ms, `"addresses":`+pick(`["10.0.0.1"]`, `["10.0.0.2","10.0.0.3"]`, `[]`, `[""]`, `["fd00::1"]`, `[null,"10.0.0.4"]`, `[5]`, `null`, `"10.0.0.5"`, `{"0":"10.0.0.6"}`, `["10.0.\u0030.7"]`, `[["10.0.0.8"]]`))
			}
			if r.IntN(5) > 0 {
				var cs []string
				for _, c := range []string{"ready", "serving", "terminating"} {
					if r.IntN(3) > 0 {
						cs = append(cs, `"`+c+`":`+pick(`true`, `false`, `null`, `"false"`, `0`, `{}`))
					}
				}
				if r.IntN(8) == 0 {
					cs = append(cs, `"ready":false`, `"re\u0061dy":true`)
				}
				ms = append(ms, `"conditions":`+pick("{"+strings.Join(cs, ","+ws())+"}", "{"+strings.Join(cs, ",")+"}", `[]`, `null`, `"ready"`))
			}
			if r.IntN(3) == 0 {
				hint := func() string {
					return pick(`[{"name":"zone-a"}]`, `[{"name":"zone-a"},{"name":"zone-b"}]`, `[]`, `[{"name":""}]`, `[{"name":"a\tb"}]`, `[{"name":5}]`, `[{}]`, `null`, `{"x":{"name":"z"}}`, `"z"`, `[{"name":"n","name":"m"}]`, `[{"name":"z\u0031"}]`, `[7]`)
				}
				ms = append(ms, `"hints":`+pick(`{"forZones":`+hint()+`}`, `{"forNodes":`+hint()+`,"forZones":`+hint()+`}`, `null`, `[]`, `{}`))
			}
			if r.IntN(2) == 0 {
				ms = append(ms, `"nodeName":"node-1","zone":"zone-a","targetRef":{"kind":"Pod","name":"p\\\"}[{","hints":"no"}`)
			}
			if r.IntN(10) == 0 {
				ms = append(ms, `"addresses":["10.1.1.1"]`, `"conditions":{"ready":false}`)
			}
			r.Shuffle(len(ms), func(i, j int) { ms[i], ms[j] = ms[j], ms[i] })
			b.WriteString(ws() + "{" + strings.Join(ms, ",") + "}")
		}
		b.WriteString("]")
	}
	b.WriteString(ws() + "}" + ws())
	return b.String()
}

// TestScanSliceAgreesWithGJSON: on slices of every shape, the one-pass
// scanner reads what gjson reads, and takes every slice as the apiserver
// writes it.
func TestScanSliceAgreesWithGJSON(t *testing.T) {
	for _, doc := range []string{sliceDoc, apiserverSlice(20)} {
		if !checkScan(t, doc) {
			t.Fatalf("scanSlice refused %s", doc)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	taken := 0
	const n = 20000
	for range n {
		if checkScan(t, randomSlice(r)) {
			taken++
		}
	}
	t.Logf("scanSlice took %d of %d documents; gjson read the rest", taken, n)
	if taken < n/10 {
		t.Errorf("scanSlice took only %d of %d documents", taken, n)
	}
}

func apiserverSlice(n int) string {
	var eps []string
	for i := range n {
		eps = append(eps, fmt.Sprintf(`{"addresses":["10.0.0.%d"],"conditions":{"ready":%t,"serving":true,"terminating":false},"hints":{"forZones":[{"name":"zone-%d"}]},"nodeName":"node-%d","targetRef":{"kind":"Pod","name":"p-%d","namespace":"ns","uid":"u-%d"},"zone":"zone-%d"}`, i, i%5 != 0, i%3, i%7, i, i, i%3))
	}
	return `{"kind":"EndpointSlice","apiVersion":"discovery.k8s.io/v1","metadata":{"name":"s","namespace":"ns","labels":{"kubernetes.io/service-name":"svc"},"managedFields":[{"manager":"kube-controller-manager","operation":"Update","fieldsType":"FieldsV1","fieldsV1":{"f:endpoints":{},"f:ports":{}}}]},"addressType":"IPv4","endpoints":[` +
		strings.Join(eps, ",") + `],"ports":[{"name":"http","protocol":"TCP","port":8080},{"name":"","port":9090}]}`
}

// FuzzScanSlice: the scanner never panics, and on a valid document that
// it accepts reads what gjson reads.
func FuzzScanSlice(f *testing.F) {
	f.Add(sliceDoc)
	f.Add(apiserverSlice(3))
	r := rand.New(rand.NewPCG(3, 4))
	for range 20 {
		f.Add(randomSlice(r))
	}
	f.Fuzz(func(t *testing.T, doc string) { checkScan(t, doc) })
}

// BenchmarkParseSlice: reading a slice of 20 endpoints as the apiserver
// writes it, in one pass and with gjson.
func BenchmarkParseSlice(b *testing.B) {
	doc := apiserverSlice(20)
	b.Run("reader=scan", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			scanSlice(doc)
		}
	})
	b.Run("reader=gjson", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			parseSliceGJSON(doc)
		}
	})
}

// TestDirectEndpointsAgreesWithModifier: a rule that is @endpoints alone
// is evaluated on the slice, with no JSON in between; it yields what the
// modifier yields through gjson, on slices of every shape.
func TestDirectEndpointsAgreesWithModifier(t *testing.T) {
	args := []string{"", `:{"terminating":true}`, `:{"port":"http"}`, `:{"port":"grpc","terminating":true}`, `:{"port":""}`, `:{"hints":true}`, `:{"port":"http","hints":true}`}
	r := rand.New(rand.NewPCG(5, 6))
	docs := []string{sliceDoc, apiserverSlice(20)}
	for range 3000 {
		docs = append(docs, randomSlice(r))
	}
	for _, arg := range args {
		direct, err := CompileRule("@endpoints" + arg)
		if err != nil || direct.endpoints == nil {
			t.Fatalf("@endpoints%s: not evaluated directly (%v)", arg, err)
		}
		via, err := CompileRule("@endpoints" + arg + "|@this")
		if err != nil || via.endpoints != nil {
			t.Fatalf("@endpoints%s|@this: %v, direct %v", arg, err, via.endpoints != nil)
		}
		for _, doc := range docs {
			var got, want []string
			errGot := direct.Eval(doc, func(s string) { got = append(got, s) })
			errWant := via.Eval(doc, func(s string) { want = append(want, s) })
			if !slices.Equal(got, want) || (errGot == nil) != (errWant == nil) {
				t.Fatalf("@endpoints%s on %s\n = %q (%v)\nwant %q (%v)", arg, doc, got, errGot, want, errWant)
			}
		}
	}
	for _, path := range []string{`@endpoints: {"port":"http"}`, `@endpoints:{"port":"http"}|0`, `@endpointsx`, `x.@endpoints`} {
		if o, ok := directEndpoints(path); ok {
			t.Errorf("%s: taken as @endpoints alone (%+v)", path, o)
		}
	}
}

// TestScanSliceKeepsNoViewOfTheDocument: the table of a slice outlives the
// buffer its document was read from (the decoder reuses it), so a later
// reading of the same bytes, found in the cache, answers the same.
func TestScanSliceKeepsNoViewOfTheDocument(t *testing.T) {
	const src = `{"ports":[{"name":"http","port":8080}],"endpoints":[{"addresses":["10.0.0.1"],"hints":{"forZones":[{"name":"zone-a"}]}}]}`
	for _, rule := range []string{`@endpoints:{"port":"http"}`, `@endpoints:{"port":"http","hints":true}`, `@endpoints:{"port":"http"}|@this`} {
		r, err := CompileRule(rule)
		if err != nil {
			t.Fatal(err)
		}
		buf := []byte(src)
		var first, second []string
		if err := r.Eval(unsafe.String(&buf[0], len(buf)), func(s string) { first = append(first, strings.Clone(s)) }); err != nil {
			t.Fatal(err)
		}
		copy(buf, strings.Repeat("9", len(buf)))
		if err := r.Eval(strings.Clone(src), func(s string) { second = append(second, s) }); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(first, second) || len(first) != 1 {
			t.Errorf("%s: %q, then from a reused buffer %q", rule, first, second)
		}
	}
}

// TestScanSliceRefusesBrokenWords: a word that is not JSON is left to gjson,
// which reads it in its own way.
func TestScanSliceRefusesBrokenWords(t *testing.T) {
	for _, doc := range []string{
		`{"endpoints":[{"addresses":["x"],"conditions":{"ready":fals}}]}`,
		`{"endpoints":[{"addresses":["x"],"conditions":{"ready":falsey}}]}`,
		`{"a":tru,"endpoints":[]}`,
		`{"endpoints":[{"addresses":["x"],"conditions":{"terminating":nul}}]}`,
	} {
		if _, ok := scanSlice(doc); ok {
			t.Errorf("scanSlice took %s", doc)
		}
	}
}
