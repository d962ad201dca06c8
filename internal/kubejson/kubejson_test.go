package kubejson_test

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/internal/kubejson"
	"github.com/iidp/metasync/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.MainLeakChecked(m, &env) }

// TestCalls makes each kind of call on the real apiserver: a discovery
// GET, a 404 that errors.IsNotFound recognizes, a create, a server-side
// apply, and an invalid object whose error carries the apiserver's
// message.
func TestCalls(t *testing.T) {
	testenv.Need(t, env)
	ctx := context.Background()
	c, err := kubejson.New(env.Config)
	if err != nil {
		t.Fatal(err)
	}

	list := &metav1.APIResourceList{}
	if err := c.Get(ctx, kubejson.Path("api", "v1"), list); err != nil {
		t.Fatal(err)
	}
	if !servesResource(list, "configmaps") {
		t.Fatalf("/api/v1 does not list configmaps: %+v", list)
	}
	for _, path := range []string{kubejson.Path("apis", "nothere.example.com", "v1"), kubejson.Path("api", "v1", "namespaces", "no-such-namespace")} {
		if err := c.Get(ctx, path, list); !apierrors.IsNotFound(err) {
			t.Errorf("GET %s: %v, want NotFound", path, err)
		}
	}

	review := &authorizationv1.SelfSubjectAccessReview{}
	err = c.Create(ctx, "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", &authorizationv1.SelfSubjectAccessReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "authorization.k8s.io/v1", Kind: "SelfSubjectAccessReview"},
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: "list", Resource: "configmaps",
		}},
	}, review)
	if err != nil || !review.Status.Allowed {
		t.Fatalf("self access review: %v, %+v", err, review.Status)
	}

	cm := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"kubejson-apply","namespace":"default"},"data":{"a":"1"}}`
	got := &struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
		Data     map[string]string `json:"data"`
	}{}
	if err := c.Apply(ctx, kubejson.Path("api", "v1", "namespaces", "default", "configmaps", "kubejson-apply"), "kubejson-test", []byte(cm), got); err != nil {
		t.Fatal(err)
	}
	if got.Data["a"] != "1" || len(got.Metadata.ManagedFields) == 0 || got.Metadata.ManagedFields[0].Manager != "kubejson-test" {
		t.Fatalf("apply answered %+v", got)
	}

	bad := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"Not_A_Name","namespace":"default"}}`
	err = c.Apply(ctx, kubejson.Path("api", "v1", "namespaces", "default", "configmaps", "Not_A_Name"), "kubejson-test", []byte(bad), nil)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "Not_A_Name") {
		t.Fatalf("apply of an invalid name: %v, want Invalid naming it", err)
	}
}

// TestTransportWrapped: the client keeps the config's transport wrappers
// (the auth guard's tests count reviews through one).
func TestTransportWrapped(t *testing.T) {
	testenv.Need(t, env)
	var calls atomic.Int64
	cfg := rest.CopyConfig(env.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) { calls.Add(1); return rt.RoundTrip(r) })
	}
	c, err := kubejson.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	list := &metav1.APIResourceList{}
	for range 3 {
		if err := c.Get(context.Background(), "/api/v1", list); err != nil {
			t.Fatal(err)
		}
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("%d requests through the wrapped transport, want 3", n)
	}
}

// TestDaemonLinksNoClientset guards what the package is for: the daemon
// links none of client-go's generated clientsets, nor the API groups they
// register (each adds megabytes resident; BENCHMARKS.md). Nor gRPC and
// the generated xDS packages: its xDS server is written on net/http and
// protowire (cmd/metasync/internal/xds), for the same reason.
func TestDaemonLinksNoClientset(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	goTool := os.Getenv("GO")
	if goTool == "" {
		goTool = "go"
	}
	out, err := exec.Command(goTool, "list", "-deps", "github.com/iidp/metasync/cmd/metasync").CombinedOutput()
	if err != nil {
		t.Skipf("go list: %v: %s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		switch {
		case pkg == "k8s.io/client-go/kubernetes",
			pkg == "k8s.io/client-go/kubernetes/scheme",
			pkg == "k8s.io/client-go/discovery",
			strings.HasPrefix(pkg, "k8s.io/apiextensions-apiserver/pkg/client/"),
			pkg == "k8s.io/api/core/v1",
			pkg == "google.golang.org/grpc",
			strings.HasPrefix(pkg, "github.com/envoyproxy/"):
			t.Errorf("metasync links %s", pkg)
		}
	}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func servesResource(list *metav1.APIResourceList, name string) bool {
	for _, r := range list.APIResources {
		if r.Name == name {
			return true
		}
	}
	return false
}

// TestPath: segments are joined as they are (the REST client escapes the
// path once), and one that would name another path names nothing.
func TestPath(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want string
	}{
		{[]string{"apis", "iidp.com", "v1"}, "/apis/iidp.com/v1"},
		{[]string{"api", "v1", "namespaces", "a b"}, "/api/v1/namespaces/a b"},
		{[]string{"apis", "..", "v1"}, "/apis/_/v1"},
		{[]string{"apis", "a/b", ""}, "/apis/_/_"},
	} {
		if got := kubejson.Path(c.in...); got != c.want {
			t.Errorf("Path(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
