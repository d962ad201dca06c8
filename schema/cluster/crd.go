package cluster

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/iidp/metasync/internal/configfile"
	"github.com/iidp/metasync/internal/plan"
	"github.com/iidp/metasync/schema"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// CRD is a CustomResourceDefinition.
type CRD = apiextensionsv1.CustomResourceDefinition

// ReadCRDs reads the CRDs of YAML files (several documents per file are
// fine; documents of other kinds are an error).
func ReadCRDs(paths []string) ([]*CRD, error) {
	var out []*CRD
	p := problems{where: "in the config"}
	for i, path := range paths {
		at := fmt.Sprintf("crds[%d]", i)
		data, err := configfile.Read(path)
		if err != nil {
			p.add(at, "%v", err)
			continue
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(string(data)), 4096)
		for n := 0; ; n++ {
			var raw map[string]any
			if err := dec.Decode(&raw); err != nil {
				if err.Error() != "EOF" {
					p.add(at, "%s: %v", path, err)
				}
				break
			}
			if len(raw) == 0 {
				continue
			}
			if raw["kind"] != "CustomResourceDefinition" {
				p.add(at, "%s: document %d is a %v, not a CustomResourceDefinition", path, n, raw["kind"])
				continue
			}
			b, _ := json.Marshal(raw)
			crd := &CRD{}
			if err := json.Unmarshal(b, crd); err != nil {
				p.add(at, "%s: %v", path, err)
				continue
			}
			out = append(out, crd)
		}
	}
	return out, p.result()
}

// CheckPaths checks every index and field path of the plan's resources
// that a CRD in crds defines against that CRD's OpenAPI v3 schema. A path
// through a field the schema lacks is a problem (the message lists the
// fields that exist); paths under x-kubernetes-preserve-unknown-fields, or
// past a gjson query or modifier, cannot be checked and yield a note.
// Resources that no CRD in crds defines are not checked.
func CheckPaths(p *schema.Plan, crds []*CRD) (notes []string, err error) {
	return checkPaths(p, crds, func(int) bool { return true })
}

// checkPaths is CheckPaths of the resource entries that reads accepts
// (by position): those read in the cluster whose CRDs crds are.
func checkPaths(p *schema.Plan, crds []*CRD, reads func(i int) bool) (notes []string, err error) {
	probs := problems{where: "in the config"}
	for i, r := range plan.Of(p).Resources {
		if !reads(i) {
			continue
		}
		crd := CRDOf(crds, r.GVR.Group, r.GVR.Resource)
		if crd == nil {
			continue
		}
		at := fmt.Sprintf("resources[%d]", i)
		var version *apiextensionsv1.CustomResourceDefinitionVersion
		var names []string
		for j := range crd.Spec.Versions {
			names = append(names, crd.Spec.Versions[j].Name)
			if crd.Spec.Versions[j].Name == r.GVR.Version {
				version = &crd.Spec.Versions[j]
			}
		}
		switch {
		case version == nil:
			probs.add(at+".version", "CRD %s has no version %q (versions: %s)", crd.Name, r.GVR.Version, strings.Join(names, ", "))
			continue
		case !version.Served:
			probs.add(at+".version", "CRD %s does not serve version %q", crd.Name, r.GVR.Version)
			continue
		case version.Schema == nil || version.Schema.OpenAPIV3Schema == nil:
			notes = append(notes, fmt.Sprintf("%s: CRD %s %s has no schema; paths not checked", at, crd.Name, r.GVR.Version))
			continue
		}
		root := version.Schema.OpenAPIV3Schema
		// A field may be any JSON; an index's key and value must be
		// strings (or arrays of them): a path to an object fails for
		// every object at run time.
		checkRule := func(field string, rule *plan.Rule, scalar bool) {
			for _, path := range rule.Paths() {
				problem, note := checkPath(root, path, scalar)
				if problem != "" {
					probs.add(field, "%s: %s in CRD %s %s", path, problem, crd.Name, r.GVR.Version)
				}
				if note != "" {
					notes = append(notes, fmt.Sprintf("%s: %s: %s", field, path, note))
				}
			}
		}
		for _, f := range r.Fields {
			checkRule(fmt.Sprintf("%s.fields.%s", at, f.Name), f.Rule, false)
		}
		j := -1 // the position of the index in the config
		for _, ix := range r.Indexes {
			if ix.Hidden() {
				field := "fallback"
				if ix.HintsOf != "" {
					field = "hints"
				}
				if ix.Value != nil {
					checkRule(fmt.Sprintf("%s.indexes[%d].%s", at, j, field), ix.Value, true)
				}
				continue
			}
			j++
			checkRule(fmt.Sprintf("%s.indexes[%d].key", at, j), ix.Key, true)
			if ix.Value != nil {
				checkRule(fmt.Sprintf("%s.indexes[%d].value", at, j), ix.Value, true)
			}
		}
	}
	return notes, probs.result()
}

// CRDOf returns the CRD among crds that defines group/resource (its
// plural), or nil.
func CRDOf(crds []*CRD, group, resource string) *CRD {
	for _, c := range crds {
		if c.Spec.Group == group && c.Spec.Names.Plural == resource {
			return c
		}
	}
	return nil
}

// pathSegments splits a gjson path on unescaped dots. complete is false
// when the path goes on past something this check does not follow (a
// query, a modifier, a pipe, a wildcard, a multipath).
func pathSegments(path string) (segs []string, complete bool) {
	var cur strings.Builder
	for i := 0; i < len(path); i++ {
		c := path[i]
		switch {
		case c == '\\' && i+1 < len(path):
			i++
			cur.WriteByte(path[i])
		case c == '.':
			segs = append(segs, cur.String())
			cur.Reset()
		case strings.IndexByte("|@*?{[(!=<>%", c) >= 0 || (c == '#' && i+1 < len(path) && path[i+1] == '('):
			return segs, false
		default:
			cur.WriteByte(c)
		}
	}
	return append(segs, cur.String()), true
}

// checkPath follows path through an OpenAPI schema. scalar: the path
// must end at a string, number or boolean (or an array of them), not at
// an object.
func checkPath(root *apiextensionsv1.JSONSchemaProps, path string, scalar bool) (problem, note string) {
	segs, complete := pathSegments(path)
	if len(segs) > 0 && (segs[0] == "metadata" || segs[0] == "apiVersion" || segs[0] == "kind") {
		return "", "" // the same for every object; not in CRD schemas
	}
	s := root
	for i, seg := range segs {
		where := strings.Join(segs[:i], ".")
		if where == "" {
			where = "the root"
		}
		if s.XPreserveUnknownFields != nil && *s.XPreserveUnknownFields && len(s.Properties) == 0 {
			return "", fmt.Sprintf("%s keeps unknown fields (x-kubernetes-preserve-unknown-fields); not checked past it", where)
		}
		if s.Type == "array" || s.Items != nil {
			if seg != "#" && !isIndex(seg) {
				return fmt.Sprintf("%s is an array: use # for its elements (%s.#.%s)", where, where, seg), ""
			}
			if s.Items == nil || s.Items.Schema == nil {
				return "", ""
			}
			s = s.Items.Schema
			continue
		}
		if seg == "#" {
			return fmt.Sprintf("%s is not an array", where), ""
		}
		if prop, ok := s.Properties[seg]; ok {
			s = &prop
			continue
		}
		if s.AdditionalProperties != nil && (s.AdditionalProperties.Allows || s.AdditionalProperties.Schema != nil) {
			if s.AdditionalProperties.Schema == nil {
				return "", ""
			}
			s = s.AdditionalProperties.Schema
			continue
		}
		if s.XPreserveUnknownFields != nil && *s.XPreserveUnknownFields {
			return "", fmt.Sprintf("%s keeps unknown fields (x-kubernetes-preserve-unknown-fields); %q not checked", where, seg)
		}
		fields := make([]string, 0, len(s.Properties))
		for name := range s.Properties {
			fields = append(fields, name)
		}
		sort.Strings(fields)
		if len(fields) == 0 {
			return fmt.Sprintf("no field %q at %s, which declares no fields", seg, where), ""
		}
		return fmt.Sprintf("no field %q at %s (fields: %s)", seg, where, strings.Join(fields, ", ")), ""
	}
	if !complete {
		return "", "checked up to a gjson query or modifier"
	}
	// A path that ends with # is a count (a number), whatever the
	// elements are.
	if scalar && segs[len(segs)-1] != "#" {
		end, what := s, "an object"
		if (s.Type == "array" || s.Items != nil) && s.Items != nil && s.Items.Schema != nil {
			end, what = s.Items.Schema, "an array of objects"
		}
		if end.Type == "object" || end.Type == "" && len(end.Properties) > 0 {
			fields := make([]string, 0, len(end.Properties))
			for name := range end.Properties {
				fields = append(fields, name)
			}
			sort.Strings(fields)
			hint := ""
			if len(fields) > 0 {
				hint = fmt.Sprintf("; name a field inside it (fields: %s)", strings.Join(fields, ", "))
			}
			return fmt.Sprintf("is %s, and an index key or value must be a string or an array of strings: the rule would fail for every object%s", what, hint), ""
		}
	}
	return "", ""
}

func isIndex(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// UncheckedPaths names, one note each, the resources of the plan whose
// paths CheckPaths cannot check with crds alone: custom resources (a
// group with a dot that is not one of Kubernetes' own, *.k8s.io) that no
// CRD of crds defines. Their paths are checked against the cluster's
// copy of the CRD by `validate --cluster`, and by serve at its start and
// at each reload.
func UncheckedPaths(p *schema.Plan, crds []*CRD) []string {
	var notes []string
	for i, r := range plan.Of(p).Resources {
		g := r.GVR.Group
		if !strings.Contains(g, ".") || g == "k8s.io" || strings.HasSuffix(g, ".k8s.io") || CRDOf(crds, g, r.GVR.Resource) != nil {
			continue
		}
		notes = append(notes, fmt.Sprintf("resources[%d]: paths not checked: no CRD under crds: defines %s.%s; validate --cluster checks them against the cluster's CRD",
			i, r.GVR.Resource, g))
	}
	return notes
}
