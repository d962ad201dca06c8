package integration_test

// A measurement, not a test (it skips unless METASYNC_MEASURE is set): how
// many LISTs and WATCHes does one resource whose watch always fails send in
// a window, and does Ready turn false after StaleAfter? RELIABILITY.md
// ("Failing watches") has its numbers and the commands.
//
//	METASYNC_MEASURE=1 go test -count=1 -run TestMeasureFailingWatch -v ./test/integration/

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
	"github.com/iidp/metasync/test/testenv"
)

type measureRT struct {
	next           http.RoundTripper
	mode           string
	lists, watches atomic.Int64
}

const measureErrorEvent = `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"configmaps is forbidden: watch refused in the stream","reason":"Forbidden","code":403}}` + "\n"

func (c *measureRT) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/configmaps") {
		if r.URL.Query().Get("watch") == "true" {
			c.watches.Add(1)
			body := ""
			switch c.mode {
			case "error-event":
				body = measureErrorEvent
			case "closes-at-once":
			default:
				return c.next.RoundTrip(r)
			}
			return &http.Response{StatusCode: 200, Status: "200 OK", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
				Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(body)), Request: r}, nil
		}
		c.lists.Add(1)
	}
	return c.next.RoundTrip(r)
}

func TestMeasureFailingWatch(t *testing.T) {
	if os.Getenv("METASYNC_MEASURE") == "" {
		t.Skip("METASYNC_MEASURE not set")
	}
	testenv.Need(t, env)
	ns := "measure-refused"
	env.Namespace(t, ns)
	ctx := context.Background()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "list-only", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list"}}}}
	if _, err := env.Kube.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "list-only", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "list-only"},
		Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "measure-lister"}}}
	if _, err := env.Kube.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	_, userCfg := env.UserKubeconfig(t, "measure-lister")
	window := 10 * time.Second
	if v, err := strconv.Atoi(os.Getenv("METASYNC_MEASURE_SECONDS")); err == nil {
		window = time.Duration(v) * time.Second
	}
	staleAfter := 3 * time.Second
	if v, err := strconv.Atoi(os.Getenv("METASYNC_MEASURE_STALE")); err == nil {
		staleAfter = time.Duration(v) * time.Second
	}
	modes := []string{"rbac", "error-event", "closes-at-once"}
	if v := os.Getenv("METASYNC_MEASURE_MODES"); v != "" {
		modes = strings.Split(v, ",")
	}
	qpss := []float32{0, -1}
	if os.Getenv("METASYNC_MEASURE_DEFAULT_QPS_ONLY") != "" {
		qpss = qpss[:1]
	}
	plan, err := mschema.Compile(&mschema.Config{Resources: []mschema.Resource{{
		Name: "cms", Version: "v1", Resource: "configmaps", Namespace: ns,
		Indexes: []mschema.Index{{Name: "cm-app", Key: "data.app"}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range modes {
		for _, qps := range qpss {
			cfg := rest.CopyConfig(userCfg)
			if mode != "rbac" {
				cfg = rest.CopyConfig(env.Config)
			}
			cfg.QPS, cfg.Burst = qps, 0
			rt := &measureRT{mode: mode}
			cfg.WrapTransport = func(next http.RoundTripper) http.RoundTripper { rt.next = next; return rt }
			e, err := msync.New(plan, cfg, msync.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), StaleAfter: staleAfter})
			if err != nil {
				t.Fatal(err)
			}
			ectx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			start := time.Now()
			go func() { _ = e.Start(ectx); close(done) }()
			var syncedAt, notReadyAt time.Duration = -1, -1
			reason := ""
			for time.Since(start) < window {
				if syncedAt < 0 && e.Inspect().Synced() {
					syncedAt = time.Since(start)
				}
				if notReadyAt < 0 && syncedAt >= 0 && !e.Ready() {
					notReadyAt = time.Since(start)
					reason = e.Status()[0].Reason
				}
				time.Sleep(20 * time.Millisecond)
			}
			st := e.Status()[0]
			cancel()
			<-done
			label := fmt.Sprintf("QPS %v", qps)
			if qps == 0 {
				label = "default QPS (5, burst 10)"
			}
			if qps < 0 {
				label = "no rate limit (QPS -1)"
			}
			nr := "never"
			if notReadyAt >= 0 {
				nr = notReadyAt.Round(100 * time.Millisecond).String()
			}
			t.Logf("RESULT %s, %s, %s: LIST=%d WATCH=%d synced at %v; ready=%v at end; not ready first at %s (StaleAfter %v) reason=%q; status relists=%d listErrors=%d watchErrors=%d error=%q",
				mode, label, window, rt.lists.Load(), rt.watches.Load(), syncedAt.Round(time.Millisecond), st.Ready, nr, staleAfter, reason, st.Relists, st.ListErrors, st.WatchErrors, st.Error)
		}
	}
}
