package main

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/schema"
)

func gaugeOf(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	if m.Gauge != nil {
		return m.GetGauge().GetValue()
	}
	return m.GetCounter().GetValue()
}

// TestReloadRefusedCRDsStayRefused: a SIGHUP whose CRD file is broken is
// refused; the next poll of the unchanged config neither hides the failure
// nor tries again before the retry time; putting the CRD file right and
// sending SIGHUP again applies it. No cluster is needed: the CRD file is
// refused before anything is sent.
func TestReloadRefusedCRDsStayRefused(t *testing.T) {
	dir := t.TempDir()
	crd := filepath.Join(dir, "crd.yaml")
	path := filepath.Join(dir, "config.yaml")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(path, []byte(`crds: [crd.yaml]
resources:
  - name: appmodels
    group: iidp.com
    version: v1
    resource: appmodels
    indexes:
      - {name: model-to-app, key: spec.models}
`), 0o644))
	good, err := os.ReadFile(filepath.Join("..", "..", "examples", "appmodel", "crd.yaml"))
	must(err)
	must(os.WriteFile(crd, good, 0o644))
	opts := schema.LoadOptions{Environ: []string{}}
	plan, err := schema.LoadPlan(path, opts)
	must(err)
	r := newReloader(path, hashFile(path), opts, plan, nil, &rest.Config{Host: "http://127.0.0.1:1", Timeout: time.Second},
		slog.New(slog.NewTextHandler(io.Discard, nil)))

	must(os.WriteFile(crd, []byte("not: [a crd"), 0o644))
	r.reload(true) // SIGHUP
	if gaugeOf(t, r.lastOK) != 0 || gaugeOf(t, r.reloads.WithLabelValues("failure")) != 1 {
		t.Fatalf("a broken CRD file was not refused")
	}
	r.reload(false) // the next poll, nothing changed
	if gaugeOf(t, r.lastOK) != 0 || gaugeOf(t, r.reloads.WithLabelValues("failure")) != 1 || !r.failed {
		t.Fatalf("the poll after a refused SIGHUP: last_reload_successful %v, failures %v",
			gaugeOf(t, r.lastOK), gaugeOf(t, r.reloads.WithLabelValues("failure")))
	}
	r.retryAt = time.Now() // the retry time has come: tried again, refused again
	r.reload(false)
	if gaugeOf(t, r.reloads.WithLabelValues("failure")) != 2 {
		t.Fatalf("no retry after the retry time")
	}
}
