package schema

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/hashicorp/go-multierror"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"
)

// EnvVars maps the environment variables that Load reads to config keys:
// METASYNC_ and the upper-snake name of the matching flag.
var EnvVars = map[string]string{
	"METASYNC_LISTEN": "server.listen",
}

// LoadOptions are the layers that Load puts over the file.
type LoadOptions struct {
	// Environ is the environment as os.Environ returns it; its METASYNC_
	// variables (see EnvVars) override the file.
	Environ []string
	// Flags override everything else: config key (such as "server.listen")
	// to value. Only the flags that were set belong here.
	Flags map[string]any
}

// Load reads the config file at path, layered as defaults < file <
// environment < flags, and decodes it strictly: an unknown key is an error.
// It then validates the result. The error lists every problem at once, one
// per line, each with its field path.
func Load(path string, opts LoadOptions) (*Config, error) {
	k := koanf.New(".")
	_ = k.Load(confmap.Provider(map[string]any{"server.listen": DefaultListen}, "."), nil)
	if err := k.Load(file.Provider(path), yaml.Parser()); err != nil {
		return nil, fmt.Errorf("read config %s: %w", path, err)
	}
	env := map[string]any{}
	for _, kv := range opts.Environ {
		name, value, _ := strings.Cut(kv, "=")
		if key, ok := EnvVars[name]; ok {
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
	decoded := map[string]bool{}
	for _, fe := range decodeProblems(decodeErr) {
		decoded[fe.Path] = true
		p.err = multierror.Append(p.err, fe)
	}
	var v problems
	c.validate(&v)
	for _, err := range Problems(v.result()) {
		var fe *FieldError
		if errors.As(err, &fe) && decoded[fe.Path] {
			continue // already reported by the decoder
		}
		p.err = multierror.Append(p.err, err)
	}
	if err := p.result(); err != nil {
		return nil, err
	}
	return &c, nil
}

// LoadPlan loads the config file at path and compiles it.
func LoadPlan(path string, opts LoadOptions) (*Plan, error) {
	c, err := Load(path, opts)
	if err != nil {
		return nil, err
	}
	return Compile(c)
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

var unknownKeysRE = regexp.MustCompile(`^has invalid keys: (.*)$`)

// decodeProblems turns mapstructure's error tree into FieldErrors.
func decodeProblems(err error) []*FieldError {
	if err == nil {
		return nil
	}
	var out []*FieldError
	var walk func(err error)
	walk = func(err error) {
		if multi, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range multi.Unwrap() {
				walk(e)
			}
			return
		}
		var de *mapstructure.DecodeError
		if !errors.As(err, &de) {
			out = append(out, &FieldError{Path: "config", Msg: err.Error()})
			return
		}
		inner := de.Unwrap()
		if _, nested := inner.(interface{ Unwrap() []error }); nested {
			walk(inner)
			return
		}
		var deeper *mapstructure.DecodeError
		if errors.As(inner, &deeper) {
			walk(inner)
			return
		}
		path := strings.TrimPrefix(de.Name(), ".")
		msg := inner.Error()
		if m := unknownKeysRE.FindStringSubmatch(msg); m != nil {
			for _, key := range strings.Split(m[1], ", ") {
				at := key
				if path != "" {
					at = path + "." + key
				}
				out = append(out, &FieldError{Path: at, Msg: "unknown key"})
			}
			return
		}
		if path == "" {
			path = "config"
		}
		out = append(out, &FieldError{Path: path, Msg: cleanDecodeMsg(msg)})
	}
	walk(err)
	return out
}

// cleanDecodeMsg drops mapstructure's Go type names where a user would not
// know them.
func cleanDecodeMsg(msg string) string {
	msg = strings.ReplaceAll(msg, "expected type 'string'", "want a string")
	msg = strings.ReplaceAll(msg, "source data must be an array or slice", "want a list")
	return msg
}
