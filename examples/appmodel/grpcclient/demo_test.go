package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/iidp/metasync/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, &env) }

// TestDemo runs `grpcclient --demo` as `make run`'s cluster would hold
// it: the calls are answered by both local servers, through the
// in-process resolver, and the demo's objects are gone when it ends.
func TestDemo(t *testing.T) {
	testenv.Need(t, env)
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	env.Namespace(t, demoNamespace)
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := run(ctx, []string{"--kubeconfig", env.WriteKubeconfig(t, ""), "--config", "../config.yaml", "--demo", "--calls", "6"}, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, &out)
	}
	backends := map[string]bool{}
	for _, line := range strings.Split(out.String(), "\n") {
		if _, addr, ok := strings.Cut(line, "answered by "); ok {
			backends[addr] = true
		}
	}
	if len(backends) != 2 || !strings.HasPrefix(out.String(), "demo: backends [") {
		t.Errorf("the calls reached %v, want both demo servers:\n%s", backends, &out)
	}
	slices, err := env.Kube.DiscoveryV1().EndpointSlices(demoNamespace).List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + demoApp})
	if err != nil || len(slices.Items) != 0 {
		t.Errorf("the demo's slices are left: %v %v", slices, err)
	}
}
