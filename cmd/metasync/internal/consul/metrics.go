package consul

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/iidp/metasync/internal/admission"
)

// metrics are the facade's; no label carries a service name.
type metrics struct {
	requests *prometheus.CounterVec
	open     prometheus.Gauge
	answers  *prometheus.CounterVec
	refusals *admission.Refusals // logged a few times every 10 s
	refused  *prometheus.CounterVec
	evicted  prometheus.Counter
}

func newMetrics() *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metasync_consul_requests_total",
			Help: "Requests to the Consul facade, by endpoint (agent_self, catalog_services, catalog_service, health_service, other) and status code.",
		}, []string{"endpoint", "code"}),
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "metasync_consul_blocking_queries",
			Help: "Blocking queries of the Consul facade waiting now.",
		}),
		answers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metasync_consul_blocking_answers_total",
			Help: "Blocking queries of the Consul facade ended, by result: changed (the answer passed the index), timeout (the wait was over), drain (the daemon stops), gone (the client went), stale (the answer became stale or caught up).",
		}, []string{"result"}),
		refusals: admission.NewRefusals(prometheus.CounterOpts{
			Name: "metasync_consul_refused_total",
			Help: "Requests and connections of the Consul facade refused at a limit, by reason: blocking (503), blocking_per_caller (429), connections and connections_per_caller (503, answered by the listener), services_per_caller (an idle watch let go).",
		}, []string{refusedBlocking, refusedPerCaller, refusedConnections, refusedConnsOfCaller, refusedServices}, 3, 10*time.Second),
		evicted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metasync_consul_connections_evicted_total",
			Help: "Idle connections of the Consul facade (kept alive between requests, or with no request read yet) closed to make room for a new one at a connection limit.",
		}),
	}
	for _, r := range []string{"changed", "timeout", "drain", "gone", "stale"} {
		m.answers.WithLabelValues(r)
	}
	for _, e := range []string{endpointAgentSelf, endpointCatalogServices, endpointCatalogService, endpointHealthService} {
		m.requests.WithLabelValues(e, "200")
	}
	m.refused = m.refusals.Metric
	return m
}

// collectors are the metrics to register, with the watches' count and
// the limits.
func (m *metrics) collectors(s *Server) []prometheus.Collector {
	watches := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "metasync_consul_watches",
		Help: "Service names, served or not, (and the catalog) that the Consul facade follows in the engine for blocking queries, those idle for a while included.",
	}, func() float64 { return float64(s.watches.count.Load()) })
	limit := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "metasync_consul_blocking_limit",
		Help: "The most blocking queries of the Consul facade open at once (all callers); 0 for no limit.",
	}, func() float64 { return float64(s.limits.Blocking) })
	conns := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "metasync_consul_connections_open",
		Help: "Connections open on the Consul facade's listener (when it is limited).",
	}, func() float64 { return float64(s.openConnections()) })
	return []prometheus.Collector{m.requests, m.open, m.answers, m.refused, m.evicted, watches, limit, conns}
}
