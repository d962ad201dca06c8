// Package testenv starts a real control plane (kube-apiserver and etcd,
// driven by controller-runtime's envtest) for metasync's integration tests,
// and holds the helpers they share.
//
// The binaries come from hack/envtest-assets.sh, which `make test` runs and
// points KUBEBUILDER_ASSETS at. Without KUBEBUILDER_ASSETS, Start skips the
// calling test with a message saying so.
package testenv

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"
)

// Env is a running control plane.
type Env struct {
	env     *envtest.Environment
	Config  *rest.Config
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
	// KubeConfig is a kubeconfig file's content for the control plane.
	KubeConfig []byte
}

// Available reports whether the control-plane binaries are configured.
func Available() bool { return os.Getenv("KUBEBUILDER_ASSETS") != "" }

// Root returns the repository's root folder.
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Start starts a control plane. Call Stop when done (TestMain-style) or use
// StartT.
func Start() (*Env, error) {
	if !Available() {
		return nil, fmt.Errorf("KUBEBUILDER_ASSETS is not set: run `make test`, which builds the control plane")
	}
	env := &envtest.Environment{
		ControlPlaneStartTimeout: 60 * time.Second,
		ControlPlaneStopTimeout:  30 * time.Second,
	}
	return start(env)
}

// start starts env's control plane and builds the Env of it.
func start(env *envtest.Environment) (*Env, error) {
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("start control plane: %w", err)
	}
	cfg.QPS, cfg.Burst = 200, 400
	e := &Env{env: env, Config: cfg, KubeConfig: env.KubeConfig}
	if err := e.clients(); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *Env) clients() error {
	var err error
	if e.Kube, err = kubernetes.NewForConfig(e.Config); err != nil {
		return err
	}
	e.Dynamic, err = dynamic.NewForConfig(e.Config)
	return err
}

// fuzzing reports a test binary run by `go test -fuzz`: the coordinator
// or one of its workers.
func fuzzing() bool {
	for _, name := range []string{"test.fuzz", "test.fuzzworker"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" && f.Value.String() != "false" {
			return true
		}
	}
	return false
}

// Stop stops the control plane.
func (e *Env) Stop() error { return e.env.Stop() }

// Main runs a test binary's tests around one shared control plane, or
// without one (integration tests then skip) when none is configured.
func Main(m *testing.M, shared **Env) {
	flag.Parse()
	if fuzzing() {
		// Fuzz targets need no control plane, and a fuzz worker's would
		// outlive it: the apiserver and etcd it started keep the worker's
		// pipes open, and the coordinator waits on them forever.
		os.Exit(m.Run())
	}
	if !Available() {
		fmt.Fprintln(os.Stderr, "testenv: KUBEBUILDER_ASSETS is not set; integration tests skip (run `make test`)")
		os.Exit(m.Run())
	}
	env, err := Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*shared = env
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop control plane:", err)
	}
	if len(leaks) > 0 {
		code = LeakCheck(code, leaks...)
	}
	os.Exit(code)
}

// MainLeakChecked is Main, and fails the run when goroutines that the
// tests started are still running once they end and the control plane
// has stopped (see LeakCheck).
func MainLeakChecked(m *testing.M, shared **Env, opts ...goleak.Option) {
	leaks = append([]goleak.Option{goleak.IgnoreCurrent()}, opts...)
	Main(m, shared)
}

// leaks: Main checks for goroutines left running, but these
// (MainLeakChecked); none: no check.
var leaks []goleak.Option

// LeakCheck is the exit code of a test binary whose tests ended with
// code: 1 when they passed but left goroutines running, saying which.
// opts name goroutines that are not the tests' (goleak.IgnoreCurrent()
// taken before the tests, those of client-go's shared parts); client
// connections whose answer a test left unread are not counted.
func LeakCheck(code int, opts ...goleak.Option) int {
	if code != 0 {
		return code
	}
	// Keep-alive connections of the default client, idle, and those a
	// test left unread: the test's, not the code's under test.
	http.DefaultClient.CloseIdleConnections()
	opts = append(opts,
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"))
	if err := goleak.Find(opts...); err != nil {
		fmt.Fprintln(os.Stderr, "goroutines left running after the tests:", err)
		return 1
	}
	return code
}

// Need skips t when no control plane runs.
func Need(t testing.TB, env *Env) {
	t.Helper()
	if env == nil {
		t.Skip("no control plane: KUBEBUILDER_ASSETS is not set (run `make test`)")
	}
}

// InstallCRDFile installs the CRDs of a YAML file and waits until each is
// established.
func (e *Env) InstallCRDFile(t testing.TB, path string) {
	t.Helper()
	crds, err := envtest.InstallCRDs(e.Config, envtest.CRDInstallOptions{
		Paths:              []string{path},
		ErrorIfPathMissing: true,
	})
	if err != nil {
		t.Fatalf("install CRDs of %s: %v", path, err)
	}
	if len(crds) == 0 {
		t.Fatalf("no CRD in %s", path)
	}
}

// InstallCRD installs one CRD given as YAML and waits until it is served.
func (e *Env) InstallCRD(t testing.TB, manifest string) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict([]byte(manifest), crd); err != nil {
		t.Fatalf("CRD manifest: %v", err)
	}
	if err := envtest.CreateCRDs(e.Config, []*apiextensionsv1.CustomResourceDefinition{crd}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create CRD %s: %v", crd.Name, err)
	}
	if err := envtest.WaitForCRDs(e.Config, []*apiextensionsv1.CustomResourceDefinition{crd}, envtest.CRDInstallOptions{MaxTime: 30 * time.Second, PollInterval: 100 * time.Millisecond}); err != nil {
		t.Fatalf("wait for CRD %s: %v", crd.Name, err)
	}
	return crd
}

// Namespace creates a namespace (if missing).
func (e *Env) Namespace(t testing.TB, name string) {
	t.Helper()
	_, err := e.Kube.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create namespace %s: %v", name, err)
	}
}

// ListOnlyRole lets user get and list, not watch, ConfigMaps in namespace
// ns, through a Role named "list-only" that it returns: a watch refused by
// RBAC while lists work.
func (e *Env) ListOnlyRole(t testing.TB, ns, user string) *rbacv1.Role {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "list-only", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list"}}}}
	role, err := e.Kube.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "list-only", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "list-only"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}}}
	if _, err := e.Kube.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return role
}

// WriteKubeconfig writes the control plane's kubeconfig into a temporary
// file and returns its path. A non-empty server replaces the apiserver's
// address (host:port), to go through a proxy, say.
func (e *Env) WriteKubeconfig(t testing.TB, server string) string {
	t.Helper()
	kc, err := clientcmd.Load(e.KubeConfig)
	if err != nil {
		t.Fatal(err)
	}
	if server != "" {
		for _, c := range kc.Clusters {
			c.Server = "https://" + server
		}
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// UserKubeconfig adds a user authenticated by a client certificate, with
// the given groups and no other rights, and writes a kubeconfig for it.
func (e *Env) UserKubeconfig(t testing.TB, name string, groups ...string) (string, *rest.Config) {
	t.Helper()
	u, err := e.env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		t.Fatalf("add user %s: %v", name, err)
	}
	kc, err := u.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, u.Config()
}

// Eventually polls cond every 20 ms until it returns "" or 20 s pass, then
// fails with the last message.
func Eventually(t testing.TB, what string, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var msg string
	for time.Now().Before(deadline) {
		if msg = cond(); msg == "" {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: still %s after 20s", what, msg)
}

// LooseCRD returns the manifest of a namespaced CRD, version v1, whose
// spec keeps any fields: the test CRDs that need no schema of their own.
func LooseCRD(group, kind, plural string) string {
	return fmt.Sprintf(`
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: %[3]s.%[1]s
spec:
  group: %[1]s
  names: {kind: %[2]s, listKind: %[2]sList, plural: %[3]s, singular: %[4]s}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            x-kubernetes-preserve-unknown-fields: true
`, group, kind, plural, strings.ToLower(kind))
}
