package server

import (
	"context"
	"net/url"
	gosync "sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientmetrics "k8s.io/client-go/tools/metrics"
)

// clientGo holds the adapters of client-go's request metrics: what every
// REST client of the process (the engine's watches, the auth reviews, the
// CRD install) asked of the apiserver, by verb, code and host. The names
// are those controller-runtime registers, so that existing dashboards and
// alerts read them.
var clientGo struct {
	once       gosync.Once
	latency    *prometheus.HistogramVec
	results    *prometheus.CounterVec
	rateLimits *prometheus.HistogramVec
}

// ClientGoMetrics hooks client-go's request metrics (package
// k8s.io/client-go/tools/metrics, once per process: the first caller
// wins, as with client-go's own Register) and returns their collectors, for
// the daemon's registry. A program that embeds the engine and wants them
// registers its own adapters the same way, on its own registry: the
// library never does it behind the host's back.
func ClientGoMetrics() []prometheus.Collector {
	clientGo.once.Do(func() {
		buckets := []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60}
		clientGo.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "rest_client_request_duration_seconds",
			Help:    "Latency of the apiserver requests that client-go times, in seconds, by verb and host: not lists and watches (streamed; see metasync_list_duration_seconds and metasync_watch_duration_seconds).",
			Buckets: buckets,
		}, []string{"verb", "host"})
		clientGo.results = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rest_client_requests_total",
			Help: "Requests to the apiserver, by HTTP status code, method and host (code \"<error>\" when no answer came).",
		}, []string{"code", "method", "host"})
		clientGo.rateLimits = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "rest_client_rate_limiter_duration_seconds",
			Help:    "Time requests waited for the client-side rate limiter in seconds, by verb and host.",
			Buckets: buckets,
		}, []string{"verb", "host"})
		clientmetrics.Register(clientmetrics.RegisterOpts{
			RequestLatency:     latencyAdapter{clientGo.latency},
			RequestResult:      resultAdapter{clientGo.results},
			RateLimiterLatency: latencyAdapter{clientGo.rateLimits},
		})
	})
	return []prometheus.Collector{clientGo.latency, clientGo.results, clientGo.rateLimits}
}

type latencyAdapter struct{ h *prometheus.HistogramVec }

func (a latencyAdapter) Observe(_ context.Context, verb string, u url.URL, latency time.Duration) {
	a.h.WithLabelValues(verb, u.Host).Observe(latency.Seconds())
}

type resultAdapter struct{ c *prometheus.CounterVec }

func (a resultAdapter) Increment(_ context.Context, code, method, host string) {
	a.c.WithLabelValues(code, method, host).Inc()
}
