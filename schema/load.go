package schema

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/iidp/metasync/internal/configfile"
	"github.com/iidp/metasync/internal/plan"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/v2"
)

// envVars maps the environment variables that Load reads to config keys:
// METASYNC_ and the upper-snake name of the matching flag.
var envVars = map[string]string{
	"METASYNC_LISTEN": "server.listen",
}

// LoadOptions are the layers that Load puts over the file.
type LoadOptions struct {
	// Environ is the environment as os.Environ returns it; its METASYNC_
	// variables (METASYNC_LISTEN) override the file.
	Environ []string
	// Flags override everything else: config key (such as "server.listen")
	// to value. Only the flags that were set belong here.
	Flags map[string]any
	// CheckAll is for a validator: when every problem is one of policy
	// (a Secrets entry without allowSecrets) or an unknown key (the rest
	// of the file decoded and compiled whole), LoadPlan returns the plan
	// with the error, so that the checks that need a plan (CRD schemas,
	// the cluster) report their problems in the same run. Such a plan
	// must not be started.
	CheckAll bool
}

// Load reads the config file at path, layered as defaults < file <
// environment < flags, and decodes it strictly: an unknown key is an error.
// It then validates the result. The error lists every problem at once, one
// per line, each with its field path.
//
// Relative paths under crds: are relative to the folder of the config file
// (as given in path, symlinks not followed), not to the working directory;
// Load rewrites them so. Paths given in opts.Flags["crds"] are kept as
// they are.
func Load(path string, opts LoadOptions) (*Config, error) {
	c, _, err := load(path, opts)
	return c, err
}

// LoadPlan loads the config file at path and compiles it: Load, then
// Compile, in one pass.
func LoadPlan(path string, opts LoadOptions) (*Plan, error) {
	_, p, err := load(path, opts)
	return p, err
}

// load is Load, and the plan compiled while validating.
func load(path string, opts LoadOptions) (*Config, *Plan, error) {
	k := koanf.New(".")
	_ = k.Load(confmap.Provider(map[string]any{"server.listen": DefaultListen}, "."), nil)
	data, err := configfile.Read(path)
	if err != nil {
		return nil, nil, fmt.Errorf("read config %s: %w", path, err)
	}
	if err := k.Load(bytesProvider(data), yaml.Parser()); err != nil {
		return nil, nil, fmt.Errorf("read config %s: %w", path, err)
	}
	env := map[string]any{}
	for _, kv := range opts.Environ {
		name, value, _ := strings.Cut(kv, "=")
		if key, ok := envVars[name]; ok {
			env[key] = value
		}
	}
	_ = k.Load(confmap.Provider(env, "."), nil)
	_ = k.Load(confmap.Provider(opts.Flags, "."), nil)

	var c Config
	var p problems
	decodeErr := k.UnmarshalWithConf("", &c, koanf.UnmarshalConf{
		DecoderConfig: &mapstructure.DecoderConfig{
			DecodeHook:  mapstructure.ComposeDecodeHookFunc(durationHook),
			ErrorUnused: true,
			Result:      &c,
			TagName:     "koanf",
		},
	})
	if _, fromFlags := opts.Flags["crds"]; !fromFlags {
		resolveCRDPaths(&c, path)
	}
	// An entry under the wrong list is one problem, said as such, not
	// the many that its keys make under that list.
	wrong := misplaced(k.Raw())
	said := map[string]bool{}
	add := func(fe *FieldError) bool {
		if e := within(fe.Path, wrong); e != "" {
			if !said[e] {
				said[e] = true
				p.list.Add(&FieldError{Path: e, Msg: wrong[e]})
			}
			return false
		}
		p.list.Add(fe)
		return true
	}
	decoded := map[string]bool{}
	unknownKeys, otherDecode := 0, false
	for _, fe := range decodeProblems(decodeErr) {
		decoded[fe.Path] = true
		if add(fe) {
			if strings.HasPrefix(fe.Msg, "unknown key") {
				unknownKeys++
			} else {
				otherDecode = true
			}
		} else {
			otherDecode = true
		}
	}
	var v problems
	compiled := c.compile(&v)
	for _, err := range Problems(v.result()) {
		var fe *FieldError
		if errors.As(err, &fe) {
			if decoded[fe.Path] {
				continue // already reported by the decoder
			}
			add(fe)
			continue
		}
		p.list.Add(err)
	}
	if err := p.result(); err != nil {
		// A validator goes on with a plan whose only problems are of
		// policy or unknown keys (the rest of the file decoded and
		// compiled whole): the checks that need a plan report theirs in
		// the same run.
		if opts.CheckAll && !otherDecode && len(Problems(err)) == v.policy+unknownKeys {
			return nil, compiled, err
		}
		return nil, nil, err
	}
	return &c, compiled, nil
}

// resolveCRDPaths makes each relative entry of c.CRDs relative to the
// folder of the config file at path, not to the working directory, so that
// `crds: [crd.yaml]` names the file next to the config wherever the daemon
// runs. Absolute entries stay as they are; blank ones too, for validation
// to report.
func resolveCRDPaths(c *Config, path string) {
	dir := filepath.Dir(path)
	for i, f := range c.CRDs {
		if strings.TrimSpace(f) == "" || filepath.IsAbs(f) {
			continue
		}
		c.CRDs[i] = filepath.Join(dir, f)
	}
	// A cluster's kubeconfig likewise.
	for i, cl := range c.Clusters {
		if f := cl.Kubeconfig; strings.TrimSpace(f) != "" && !filepath.IsAbs(f) {
			c.Clusters[i].Kubeconfig = filepath.Join(dir, f)
		}
	}
}

var durationType = reflect.TypeFor[time.Duration]()

// durationHook accepts "300s" and 0 for a duration; a bare number other
// than 0 is refused, since it would silently mean nanoseconds.
func durationHook(from, to reflect.Type, data any) (any, error) {
	if to != durationType {
		return data, nil
	}
	switch v := data.(type) {
	case string:
		d, err := time.ParseDuration(v)
		if err != nil {
			return nil, fmt.Errorf("%q is not a duration (such as 300s or 5m)", v)
		}
		return d, nil
	case int, int64, uint64, float64:
		if reflect.ValueOf(v).IsZero() {
			return time.Duration(0), nil
		}
		return nil, fmt.Errorf("%v has no unit; write a duration such as 300s or 5m", v)
	}
	return data, nil
}

// rootName is what mapstructure calls the config's root in an error.
var rootName = fmt.Sprintf("%T", Config{})

var unknownKeysRE = regexp.MustCompile(`^has invalid keys: (.*)$`)

// decodeProblems turns mapstructure's error tree into FieldErrors, one per
// problem. mapstructure reports every problem (at each struct level, its
// unknown keys after the errors of its fields), in a tree of joined errors
// under a wrapping error; every leaf is kept, and the unknown keys of a
// level come before the problems inside it.
func decodeProblems(err error) []*FieldError {
	var out []*FieldError
	leaf := func(at, msg string) {
		if m := unknownKeysRE.FindStringSubmatch(msg); m != nil {
			known := keysAt(at)
			for _, key := range strings.Split(m[1], ", ") {
				path := key
				if at != "" {
					path = at + "." + key
				}
				msg := "unknown key"
				if hint := plan.Closest(key, known); hint != "" {
					msg += " (did you mean " + hint + "?)"
				}
				out = append(out, &FieldError{Path: path, Msg: msg})
			}
			return
		}
		if at == "" {
			at = "config"
		}
		out = append(out, &FieldError{Path: at, Msg: msg})
	}
	var walk func(err error, at string)
	walk = func(err error, at string) {
		switch e := err.(type) {
		case nil:
		case interface{ Unwrap() []error }:
			errs := e.Unwrap()
			for _, x := range errs {
				if isUnknownKeys(x) {
					walk(x, at)
				}
			}
			for _, x := range errs {
				if !isUnknownKeys(x) {
					walk(x, at)
				}
			}
		case *mapstructure.DecodeError:
			at = strings.TrimPrefix(e.Name(), ".")
			if at == rootName {
				at = "" // mapstructure names the root by its Go type
			}
			inner := e.Unwrap()
			if inner == nil {
				leaf(at, cleanDecodeMsg(e.Error()))
				return
			}
			if hasDecodeErrors(inner) {
				walk(inner, at)
				return
			}
			leaf(at, decodeMsg(inner))
		default:
			// Such as the "decoding failed due to the following error(s)"
			// that wraps the whole tree.
			if inner := errors.Unwrap(err); hasDecodeErrors(inner) {
				walk(inner, at)
				return
			}
			leaf(at, cleanDecodeMsg(err.Error()))
		}
	}
	walk(err, "")
	return out
}

// hasDecodeErrors tells whether err is a list of errors or holds a
// mapstructure.DecodeError, which has a field path.
func hasDecodeErrors(err error) bool {
	if _, multi := err.(interface{ Unwrap() []error }); multi {
		return true
	}
	var de *mapstructure.DecodeError
	return errors.As(err, &de)
}

// isUnknownKeys tells whether err is mapstructure's report of the unknown
// keys of one struct level.
func isUnknownKeys(err error) bool {
	de, ok := err.(*mapstructure.DecodeError)
	return ok && de.Unwrap() != nil && unknownKeysRE.MatchString(de.Unwrap().Error())
}

// keysAt returns the keys known at the struct level that the decoder's
// field path at names ("" for the top, "resources[0].indexes[1]"), from the
// koanf tags of Config and its nested types; nil if at names no struct.
func keysAt(at string) []string {
	t := reflect.TypeFor[Config]()
	if at != "" {
		for _, seg := range strings.Split(at, ".") {
			name, _, _ := strings.Cut(seg, "[")
			f, ok := fieldForKey(t, name)
			if !ok {
				return nil
			}
			t = f.typ
			for range strings.Count(seg, "[") {
				t = derefType(t)
				switch t.Kind() {
				case reflect.Slice, reflect.Array, reflect.Map:
					t = t.Elem()
				default:
					return nil
				}
			}
		}
	}
	t = derefType(t)
	if t.Kind() != reflect.Struct {
		return nil
	}
	var keys []string
	for _, f := range koanfFields(t) {
		keys = append(keys, f.key)
	}
	return keys
}

type koanfField struct {
	key string
	typ reflect.Type
}

// koanfFields lists the fields of struct type t under their config keys
// (koanf tags, as the decoder reads them), in order, squashed embedded
// structs included.
func koanfFields(t reflect.Type) []koanfField {
	var out []koanfField
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("koanf"), ",")
		if f.Anonymous && slices.Contains(strings.Split(opts, ","), "squash") {
			if st := derefType(f.Type); st.Kind() == reflect.Struct {
				out = append(out, koanfFields(st)...)
			}
			continue
		}
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, koanfField{key: name, typ: f.Type})
	}
	return out
}

// fieldForKey finds the field of key in struct type t, matching as the
// decoder does: exactly, else ignoring case.
func fieldForKey(t reflect.Type, key string) (koanfField, bool) {
	t = derefType(t)
	if t.Kind() != reflect.Struct {
		return koanfField{}, false
	}
	fields := koanfFields(t)
	for _, f := range fields {
		if f.key == key {
			return f, true
		}
	}
	for _, f := range fields {
		if strings.EqualFold(f.key, key) {
			return f, true
		}
	}
	return koanfField{}, false
}

func derefType(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// bytesProvider gives koanf a file already read.
type bytesProvider []byte

func (b bytesProvider) ReadBytes() ([]byte, error) { return b, nil }

func (bytesProvider) Read() (map[string]any, error) {
	return nil, errors.New("bytesProvider gives bytes only")
}
