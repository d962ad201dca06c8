package deploy_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// hostLimits are the errors of an OCI runtime that cannot run any
// container on this machine, whatever the image: crun refuses hybrid
// cgroups (v1 controllers with a v2 hierarchy beside them), which runc
// runs on.
var hostLimits = []string{"cgroups in hybrid mode not supported"}

// pickRuntime runs the image's `version` (no network) with podman's
// default OCI runtime and returns its output. When the default cannot run
// it, it tries each other runtime installed (runc, crun); the first that
// works goes into conf ([engine] runtime), so that every later podman call
// of the test uses it, and the test says so. When the default fails for a
// limit of this machine and no other runtime is installed, the test skips
// and says what to install; any other failure fails the test.
func pickRuntime(t *testing.T, conf, image string) string {
	t.Helper()
	run := func(global ...string) (string, error) {
		args := append(global, "run", "--rm", "--network", "none", image, "version")
		out, err := podman(t, conf, args...).CombinedOutput()
		return string(out), err
	}
	out, err := run()
	def := defaultRuntime(t, conf)
	if err == nil {
		t.Logf("OCI runtime: %s (podman's default)", def)
		return out
	}
	failures := []string{fmt.Sprintf("%s (podman's default): %v %q", def, err, out)}
	for _, rt := range []string{"runc", "crun"} {
		if rt == def {
			continue
		}
		if _, err := exec.LookPath(rt); err != nil {
			continue
		}
		alt, err := run("--runtime", rt)
		if err != nil {
			failures = append(failures, fmt.Sprintf("%s: %v %q", rt, err, alt))
			continue
		}
		t.Logf("OCI runtime: %s, since podman's default, %s, cannot run a container here: %s", rt, def, strings.TrimSpace(out))
		if err := appendEngineRuntime(conf, rt); err != nil {
			t.Fatal(err)
		}
		return alt
	}
	if len(failures) == 1 && hostLimited(out) {
		t.Skipf("podman's OCI runtime %s cannot run a container on this machine (%s) and no other runtime is installed: "+
			"install runc (Debian: apt-get install runc), which this test then uses (podman --runtime runc)", def, strings.TrimSpace(out))
	}
	t.Fatalf("podman run IMAGE version: %s", strings.Join(failures, "; "))
	return ""
}

// defaultRuntime names podman's default OCI runtime ("" when podman
// cannot say).
func defaultRuntime(t *testing.T, conf string) string {
	t.Helper()
	out, err := podman(t, conf, "info", "--format", "{{.Host.OCIRuntime.Name}}").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

func hostLimited(out string) bool {
	for _, l := range hostLimits {
		if strings.Contains(out, l) {
			return true
		}
	}
	return false
}

// appendEngineRuntime makes rt the OCI runtime of the containers.conf at
// conf.
func appendEngineRuntime(conf, rt string) error {
	b, err := os.ReadFile(conf)
	if err != nil {
		return err
	}
	if strings.Contains(string(b), "[engine]") {
		return errors.New(conf + " has an [engine] table already")
	}
	return os.WriteFile(conf, append(b, fmt.Sprintf("\n[engine]\nruntime = %q\n", rt)...), 0o644)
}
