package metasync_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestMakeTargetsDocumented: every target of the Makefile has the "##
// target:" comment that `make help` prints.
func TestMakeTargetsDocumented(t *testing.T) {
	b, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^## ([a-z][a-z-]*):`).FindAllStringSubmatch(string(b), -1) {
		documented[m[1]] = true
	}
	phony := regexp.MustCompile(`(?m)^\.PHONY:(.*)$`).FindStringSubmatch(string(b))
	if phony == nil {
		t.Fatal("the Makefile has no .PHONY line")
	}
	for _, target := range regexp.MustCompile(`(?m)^([a-z][a-z-]*):`).FindAllStringSubmatch(string(b), -1) {
		if !documented[target[1]] {
			t.Errorf("make %s has no \"## %s:\" comment for make help", target[1], target[1])
		}
		if !strings.Contains(phony[1]+" ", " "+target[1]+" ") {
			t.Errorf("make %s is not .PHONY", target[1])
		}
	}
}

// TestCIEndsNoProcessByName: .ci/run never ends processes by name (pkill,
// killall): on a shared machine another's process may bear it. A
// package's own service is kept from starting, or stopped through its
// service manager.
func TestCIEndsNoProcessByName(t *testing.T) {
	b, err := os.ReadFile(".ci/run")
	if err != nil {
		t.Fatal(err)
	}
	for i, line := range strings.Split(string(b), "\n") {
		code, _, _ := strings.Cut(line, "#")
		for _, tool := range []string{"pkill", "killall"} {
			if regexp.MustCompile(`\b` + tool + `\b`).MatchString(code) {
				t.Errorf(".ci/run:%d ends processes by name (%s): %s", i+1, tool, line)
			}
		}
	}
	if !strings.Contains(string(b), "policy-rc.d") {
		t.Error(".ci/run no longer keeps the prometheus service from starting during its install")
	}
}
