package auth_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/cmd/metasync/internal/server"
	"github.com/iidp/metasync/metasynctest"
	"github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

// The guard's tests on a control plane serve the daemon's HTTP API behind
// it, as serve does.

// offlineServer serves examples/appmodel's config over an engine whose
// apiserver never answers: nothing synced.
func offlineServer(t testing.TB) *server.Server {
	t.Helper()
	plan, err := schema.LoadPlan("../../../../examples/appmodel/config.yaml", schema.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := msync.New(plan, &rest.Config{Host: "https://127.0.0.1:1"}, msync.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return server.New(e.Inspect(), slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// fedServer serves an engine without a cluster, synced, holding one
// AppModel of examples/appmodel's config per entry of apps (name to models).
func fedServer(t testing.TB, apps map[string][]string) *server.Server {
	t.Helper()
	plan, err := schema.LoadPlan("../../../../examples/appmodel/config.yaml", schema.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fake, err := metasynctest.New(plan)
	if err != nil {
		t.Fatal(err)
	}
	for name, models := range apps {
		b, _ := json.Marshal(map[string]any{
			"metadata": map[string]any{"name": name, "namespace": "meta-test", "labels": map[string]string{"iidp": "iidp"}},
			"spec":     map[string]any{"models": models},
		})
		if err := fake.Feed().Apply("appmodels", b); err != nil {
			t.Fatal(err)
		}
	}
	return server.New(fake.Engine().Inspect(), slog.New(slog.NewTextHandler(io.Discard, nil)))
}
