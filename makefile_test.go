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
