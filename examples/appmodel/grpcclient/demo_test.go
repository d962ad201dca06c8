package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/iidp/metasync/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.MainLeakChecked(m, &env) }

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
	// A second demo while an object of its names exists refuses, and
	// leaves it.
	kc := env.WriteKubeconfig(t, "")
	if _, err := env.Kube.CoreV1().Services(demoNamespace).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: demoApp},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := run(ctx, []string{"--kubeconfig", kc, "--config", "../config.yaml", "--demo", "--calls", "1"}, &out); err == nil || !strings.Contains(err.Error(), "Service meta-test/grpc-demo exists already") {
		t.Errorf("a demo over an existing Service: %v", err)
	}
	if _, err := env.Kube.CoreV1().Services(demoNamespace).Get(ctx, demoApp, metav1.GetOptions{}); err != nil {
		t.Errorf("the demo removed a Service it did not write: %v", err)
	}
	slices, err := env.Kube.DiscoveryV1().EndpointSlices(demoNamespace).List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + demoApp})
	if err != nil || len(slices.Items) != 0 {
		t.Errorf("the demo's slices are left: %v %v", slices, err)
	}
}
