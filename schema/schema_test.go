package schema

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestFiveMistakesAllReported(t *testing.T) {
	_, err := Load("testdata/five-mistakes.bad.yaml", LoadOptions{})
	if err == nil {
		t.Fatal("a config with mistakes loaded")
	}
	want := []string{
		"resources[1].labelSelctor: unknown key (did you mean labelSelector?)",
		"resources[0].version: required (for example v1)",
		`resources[0].labelSelector: "iidp in (iidp": unable to parse requirement: found '', expected: ',' or ')'`,
		"resources[0].resync: -5s is negative; use 0 for no resync",
		`resources[1].indexes[0].name: "model-to-app" is already the name of resources[0].indexes[0]`,
		"resources[1].indexes[0].key: empty gjson path",
		`chains[0].indexes[1]: unknown index "service-to-addresses" (known: model-to-app)`,
	}
	lines := strings.Split(err.Error(), "\n")
	if lines[0] != "7 problems in the config:" {
		t.Errorf("first line = %q", lines[0])
	}
	for _, w := range want {
		if !slices.Contains(lines[1:], w) {
			t.Errorf("missing problem %q in:\n%v", w, err)
		}
	}
	if n := len(Problems(err)); n != len(want) {
		t.Errorf("Problems() has %d entries, want %d", n, len(want))
	}
	var fe *FieldError
	if !errors.As(Problems(err)[0], &fe) {
		t.Errorf("problem is %T, want *FieldError", Problems(err)[0])
	}
}

func TestBadFiles(t *testing.T) {
	cases := map[string][]string{
		"resync-number.bad.yaml": {"resources[0].resync: 300 has no unit; write a duration such as 300s or 5m"},
		"shapes.bad.yaml": {
			"resources[1].version: want a string, got a list",
			`server.listen: "nonsense" is not host:port`,
			`resources[0].name: "bad name!": use letters, digits, '.', '_' and '-'`,
			"resources[0].fields.node: empty gjson path",
			"resources[0].indexes: no index is declared; declare at least one",
			`resources[1].indexes[0].key: template "${spec.nodeName": "${" at offset 0 is not closed`,
			"chains[0].indexes: a chain needs at least two indexes, has 1",
		},
	}
	for file, want := range cases {
		_, err := Load(filepath.Join("testdata", file), LoadOptions{})
		if err == nil {
			t.Fatalf("%s loaded", file)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w+"\n") && !strings.HasSuffix(err.Error(), w) {
				t.Errorf("%s: missing %q in:\n%v", file, w, err)
			}
		}
	}
}

func TestMissingFile(t *testing.T) {
	_, err := Load("testdata/nope.yaml", LoadOptions{})
	if err == nil || !strings.Contains(err.Error(), "read config testdata/nope.yaml") {
		t.Fatalf("err = %v", err)
	}
}

func TestGoodFileCompiles(t *testing.T) {
	plan, err := LoadPlan("testdata/good.yaml", LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := plan.Server().Listen; got != DefaultListen {
		t.Errorf("listen = %q, want the default", got)
	}
	r := plan.c.Resources[0]
	if r.GVR.String() != "iidp.com/v1, Resource=appmodels" || r.Namespace != "meta-test" || r.LabelSelector != "iidp=iidp" || r.Resync != 300*time.Second {
		t.Errorf("resource plan = %+v", r)
	}
	var names []string
	for _, f := range r.Fields {
		names = append(names, f.Name)
	}
	if !slices.Equal(names, []string{"models", "type", "version"}) {
		t.Errorf("fields = %v", names)
	}
}

func TestPrecedenceFlagsEnvFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	body, _ := os.ReadFile("testdata/good.yaml")
	body = append([]byte("server:\n  listen: 127.0.0.1:1111\n"), body...)
	if err := os.WriteFile(path, body, 0o600); err != nil {
		t.Fatal(err)
	}
	load := func(opts LoadOptions) string {
		t.Helper()
		c, err := Load(path, opts)
		if err != nil {
			t.Fatal(err)
		}
		return c.Server.Listen
	}
	if got := load(LoadOptions{}); got != "127.0.0.1:1111" {
		t.Errorf("file: %s", got)
	}
	env := []string{"METASYNC_LISTEN=127.0.0.1:2222", "OTHER=x"}
	if got := load(LoadOptions{Environ: env}); got != "127.0.0.1:2222" {
		t.Errorf("env over file: %s", got)
	}
	if got := load(LoadOptions{Environ: env, Flags: map[string]any{"server.listen": "127.0.0.1:3333"}}); got != "127.0.0.1:3333" {
		t.Errorf("flag over env: %s", got)
	}
}

func TestExampleConfigsLoad(t *testing.T) {
	files, _ := filepath.Glob("../examples/*/config*.yaml")
	files = append(files, "../config.example.yaml")
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if _, err := LoadPlan(f, LoadOptions{}); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func TestConfigLiteralWithoutKoanf(t *testing.T) {
	plan, err := Compile(&Config{Resources: []Resource{{
		Name: "appmodels", Group: "iidp.com", Version: "v1", Resource: "appmodels",
		Indexes: []Index{{Name: "model-to-app", Key: "spec.models"}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if plan.c.Resources[0].Indexes[0].Value != nil {
		t.Error("an empty value must compile to the object key (nil rule)")
	}
	if _, err := Compile(&Config{}); err == nil {
		t.Error("an empty config compiled")
	}
}

func TestSecretsOnlyOnPurpose(t *testing.T) {
	cfg := &Config{Resources: []Resource{{
		Name: "secrets", Version: "v1", Resource: "secrets",
		Indexes: []Index{{Name: "by-type", Key: "type"}},
	}}}
	err := cfg.Validate()
	if err == nil || !strings.Contains(err.Error(), "resources[0].resource: watching Secrets puts their content in memory and behind the HTTP API; set allowSecrets: true") {
		t.Fatalf("err = %v", err)
	}
	cfg.Resources[0].AllowSecrets = true
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
}
