// Package admission bounds what the callers of a server may hold open at
// once, so that no caller takes the server from the others: places
// (streams, blocking queries) under a global bound and a bound per caller
// (Gate), and connections under a budget of file descriptors (Pool, an
// evicting listener). It names the callers (Caller), counts the
// refusals by reason on a metric of the server's own and logs them a few
// at a time (Refusals). The numbers, the reasons and what a refused
// client is told are the server's: admission knows no protocol but the
// bytes of an answer it is handed.
package admission

import (
	"net"
	gosync "sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
)

// Bound names the bounds that a refusal or an eviction met: a set, so
// that a server that checks both picks the one it answers first.
type Bound int

const (
	// Total is the bound of all callers together.
	Total Bound = 1 << iota
	// PerCaller is the bound of one caller (for a connection not yet
	// claimed, one remote address).
	PerCaller
)

// Caller names who a request comes from, for the bounds per caller: its
// identity behind authentication when it has one, as it is, else
// "addr:" and its remote address without the port.
func Caller(identity, remote string) string {
	if identity != "" {
		return identity
	}
	return "addr:" + Host(remote)
}

// Host is the remote address without its port (remote itself when it
// has none).
func Host(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return remote
	}
	return host
}

// Tally counts by key; a key counted down to 0 is forgotten. The zero
// Tally is empty and ready.
type Tally map[string]int

// Add counts delta more for key and returns its count.
func (t *Tally) Add(key string, delta int) int {
	if *t == nil {
		*t = Tally{}
	}
	n := (*t)[key] + delta
	if n <= 0 {
		delete(*t, key)
		return 0
	}
	(*t)[key] = n
	return n
}

// Gate counts the places open (streams, blocking queries), in all and
// per caller. The zero Gate is ready.
type Gate struct {
	mu       gosync.Mutex
	open     int
	peak     int // the most open at once since the last Peak
	byCaller Tally
}

// Admit takes a place for caller, unless total places are open (Total) or
// caller holds perCaller already (PerCaller): then it takes none and
// reports each bound met. A bound of 0 bounds nothing; the caller "" is
// not counted apart. release gives the place back, once however often it
// is called.
func (g *Gate) Admit(caller string, total, perCaller int) (release func(), full Bound) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if perCaller > 0 && g.byCaller[caller] >= perCaller {
		full |= PerCaller
	}
	if total > 0 && g.open >= total {
		full |= Total
	}
	if full != 0 {
		return nil, full
	}
	g.open++
	g.peak = max(g.peak, g.open)
	if caller != "" {
		g.byCaller.Add(caller, 1)
	}
	var once gosync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.open--
			if caller != "" {
				g.byCaller.Add(caller, -1)
			}
		})
	}, 0
}

// Peak returns the most places open at once since the last call, and how
// many are open now.
func (g *Gate) Peak() (peak, now int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	peak, now = g.peak, g.open
	g.peak = g.open
	return peak, now
}

// Open is the number of places open, and of callers holding one.
func (g *Gate) Open() (places, callers int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open, len(g.byCaller)
}

// Refusals counts the refusals at a limit on a metric by reason, and
// logs them a few at a time.
type Refusals struct {
	// Metric counts the refusals; its one label is the reason.
	Metric *prometheus.CounterVec
	log    rate.Sometimes
}

// NewRefusals returns the refusals counted on a new metric of opts,
// each of reasons at 0 from the start, whose first lines are logged and
// then one each interval.
func NewRefusals(opts prometheus.CounterOpts, reasons []string, first int, interval time.Duration) *Refusals {
	r := &Refusals{Metric: prometheus.NewCounterVec(opts, []string{"reason"}),
		log: rate.Sometimes{First: first, Interval: interval}}
	for _, reason := range reasons {
		r.Metric.WithLabelValues(reason)
	}
	return r
}

// Count counts a refusal for reason, and calls line to log it unless
// lines are over their rate.
func (r *Refusals) Count(reason string, line func()) {
	r.Metric.WithLabelValues(reason).Inc()
	r.Sometimes(line)
}

// Sometimes calls line unless lines are over their rate.
func (r *Refusals) Sometimes(line func()) { r.log.Do(line) }
