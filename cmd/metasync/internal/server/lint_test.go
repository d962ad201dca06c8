package server

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestMetricsLint: the daemon's metrics, client-go's request metrics
// included (with one sample each, so that they are gathered), pass the
// Prometheus linter.
func TestMetricsLint(t *testing.T) {
	s := fedServer(t, map[string][]string{"base": {"model1"}})
	s.MustRegister(ClientGoMetrics()...)
	u := url.URL{Scheme: "https", Host: "10.0.0.1:443"}
	latencyAdapter{clientGo.latency}.Observe(context.Background(), "GET", u, time.Millisecond)
	latencyAdapter{clientGo.rateLimits}.Observe(context.Background(), "GET", u, time.Millisecond)
	resultAdapter{clientGo.results}.Increment(context.Background(), "200", "GET", u.Host)
	s.lookups.WithLabelValues("index", "model-to-app", "hit").Inc()
	problems, err := testutil.GatherAndLint(s.registry)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	families, _ := s.registry.Gather()
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
	}
	for _, want := range []string{"rest_client_requests_total", "rest_client_request_duration_seconds", "metasync_list_duration_seconds", "metasync_watch_duration_seconds", "metasync_resource_syncing"} {
		if !names[want] {
			t.Errorf("%s not gathered", want)
		}
	}
}
