package plan

import (
	"slices"
	"strings"
	"testing"
	"unsafe"
)

const sliceDoc = `{"metadata":{"name":"base-a","labels":{"kubernetes.io/service-name":"base"}},
 "addressType":"IPv4",
 "ports":[{"name":"http","port":8080,"protocol":"TCP"},{"name":"grpc","port":9090}],
 "endpoints":[
  {"addresses":["10.0.0.1"],"conditions":{"ready":true,"serving":true,"terminating":false}},
  {"addresses":["10.0.0.2"],"conditions":{}},
  {"addresses":["10.0.0.3"]},
  {"addresses":["10.0.0.4","10.0.0.40"],"conditions":{"ready":false,"serving":true,"terminating":true}},
  {"addresses":["10.0.0.5"],"conditions":{"ready":false,"serving":false,"terminating":true}},
  {"addresses":["10.0.0.6"],"conditions":{"ready":false}},
  {"addresses":["10.0.0.7"],"conditions":{"ready":false,"terminating":true}},
  {"addresses":[]},
  {"conditions":{"ready":true}}
 ]}`

func evalEP(t *testing.T, rule, doc string) []string {
	t.Helper()
	r, err := CompileRule(rule)
	if err != nil {
		t.Fatalf("%s: %v", rule, err)
	}
	var out []string
	if err := r.Eval(doc, func(s string) { out = append(out, s) }); err != nil {
		t.Fatalf("%s: %v", rule, err)
	}
	return out
}

// TestEndpointsModifier: kube-proxy's reading of an EndpointSlice.
func TestEndpointsModifier(t *testing.T) {
	for rule, want := range map[string][]string{
		// ready: true, unset, no conditions at all; the first address only.
		`@endpoints`: {"10.0.0.1", "10.0.0.2", "10.0.0.3"},
		// serving (true or unset) and terminating.
		`@endpoints:{"terminating":true}`:                {"10.0.0.4", "10.0.0.7"},
		`@endpoints:{"port":"grpc"}`:                     {"10.0.0.1:9090", "10.0.0.2:9090", "10.0.0.3:9090"},
		`@endpoints:{"port":"http","terminating":true}`:  {"10.0.0.4:8080", "10.0.0.7:8080"},
		`@endpoints:{"port":"metrics"}`:                  nil, // no such port on this slice
		`@endpoints:{"port":""}`:                         nil, // no unnamed port
		`metadata.labels.kubernetes\.io/service-name`:    {"base"},
		`${metadata.name}=${@endpoints:{"port":"grpc"}}`: {"base-a=10.0.0.1:9090", "base-a=10.0.0.2:9090", "base-a=10.0.0.3:9090"},
		`@endpoints|#`: {"3"},
		`@endpoints:{"terminating":true}|@reverse|0`:       {"10.0.0.7"},
		`endpoints.#(conditions.ready==true)#.addresses.0`: {"10.0.0.1"}, // the bare rule misses unset
	} {
		if got := evalEP(t, rule, sliceDoc); !slices.Equal(got, want) {
			t.Errorf("%s = %q, want %q", rule, got, want)
		}
	}
}

func TestEndpointsModifierOddSlices(t *testing.T) {
	for doc, want := range map[string][]string{
		`{}`:                                nil,
		`{"endpoints":null}`:                nil,
		`{"endpoints":"x"}`:                 nil,
		`{"endpoints":[1,"a",null,{}]}`:     nil,
		`{"endpoints":[{"addresses":[7]}]}`: nil,
		`{"endpoints":[{"addresses":["a\"b\\c\u0001"]}]}`:                              {"a\"b\\c\x01"},
		`{"endpoints":[{"addresses":["pod.example"],"conditions":{"ready":"false"}}]}`: {"pod.example"},
	} {
		if got := evalEP(t, `@endpoints`, doc); !slices.Equal(got, want) {
			t.Errorf("%s: %q, want %q", doc, got, want)
		}
	}
	// A slice of addressType FQDN holds hostnames, which kube-proxy does
	// not route to: it gives no value.
	fqdn := `{"addressType":"FQDN","ports":[{"name":"grpc","port":9090}],"endpoints":[{"addresses":["backend.example"]}]}`
	for _, rule := range []string{`@endpoints`, `@endpoints:{"port":"grpc"}`, `@endpoints:{"terminating":true}`} {
		if got := evalEP(t, rule, fqdn); got != nil {
			t.Errorf("FQDN slice, %s: %q", rule, got)
		}
	}
	// IPv6 in brackets; a port without a number, or out of range, is no port.
	v6 := `{"ports":[{"name":"grpc","port":9090}],"endpoints":[{"addresses":["fd00::5"]}]}`
	if got := evalEP(t, `@endpoints:{"port":"grpc"}`, v6); !slices.Equal(got, []string{"[fd00::5]:9090"}) {
		t.Errorf("IPv6: %q", got)
	}
	for _, ports := range []string{`[{"name":"grpc"}]`, `[{"name":"grpc","port":null}]`, `[{"name":"grpc","port":70000}]`, `[{"name":"grpc","port":"9090"}]`, `[{"name":"grpc","port":9090.5}]`} {
		doc := `{"ports":` + ports + `,"endpoints":[{"addresses":["10.0.0.1"]}]}`
		if got := evalEP(t, `@endpoints:{"port":"grpc"}`, doc); got != nil {
			t.Errorf("ports %s: %q", ports, got)
		}
	}
	// An unnamed port is the port "".
	unnamed := `{"ports":[{"port":80}],"endpoints":[{"addresses":["10.0.0.1"]}]}`
	if got := evalEP(t, `@endpoints:{"port":""}`, unnamed); !slices.Equal(got, []string{"10.0.0.1:80"}) {
		t.Errorf("unnamed port: %q", got)
	}
}

// TestEndpointsModifierArguments: validation refuses what the modifier
// cannot read, naming it.
func TestEndpointsModifierArguments(t *testing.T) {
	for _, rule := range []string{
		`@endpoints:{"prot":"grpc"}`,
		`@endpoints:{"port":9090}`,
		`@endpoints:{"terminating":"yes"}`,
		`@endpoints:grpc`,
		`@endpoints:[1]`,
		`@endpoints:"grpc"`,
	} {
		_, err := CompileRule(rule)
		if err == nil || !strings.Contains(err.Error(), "@endpoints") {
			t.Errorf("%s: %v", rule, err)
		}
	}
	if _, err := CompileRule(`@endpoint`); err == nil || !strings.Contains(err.Error(), "did you mean @endpoints") {
		t.Errorf("@endpoint: %v", err)
	}
}

func TestEndpointsModifierHints(t *testing.T) {
	doc := `{"ports":[{"name":"http","port":80}],"endpoints":[
	  {"addresses":["10.0.0.1"],"zone":"a","hints":{"forZones":[{"name":"a"}],"forNodes":[{"name":"n1"}]}},
	  {"addresses":["10.0.0.2"],"conditions":{"ready":false,"serving":true,"terminating":true},"hints":{"forZones":[{"name":"b"},{"name":"c"}]}},
	  {"addresses":["10.0.0.3"],"zone":"c"},
	  {"addresses":["10.0.0.4"],"hints":{"forZones":[{"name":""},{}]}}]}`
	want := []string{"10.0.0.1:80\tzone=a", "10.0.0.1:80\tnode=n1", "10.0.0.2:80\tzone=b", "10.0.0.2:80\tzone=c"}
	if got := evalEP(t, `@endpoints:{"port":"http","hints":true}`, doc); !slices.Equal(got, want) {
		t.Errorf("hints = %q, want %q", got, want)
	}
}

// TestEndpointsModifierReusedBuffer: a document that is a view of a buffer
// reused for the next one (as the decoder reuses it) is never answered
// from what was parsed of the previous content.
func TestEndpointsModifierReusedBuffer(t *testing.T) {
	a := `{"endpoints":[{"addresses":["10.0.0.1"],"conditions":{"ready":true }}]}`
	b := `{"endpoints":[{"addresses":["10.0.0.1"],"conditions":{"ready":false}}]}`
	buf := []byte(a)
	view := unsafe.String(&buf[0], len(buf))
	if got := evalEP(t, `@endpoints`, view); !slices.Equal(got, []string{"10.0.0.1"}) {
		t.Fatalf("first: %q", got)
	}
	copy(buf, b)
	if got := evalEP(t, `@endpoints`, view); got != nil {
		t.Fatalf("the buffer reused, the endpoint not ready: %q", got)
	}
}
