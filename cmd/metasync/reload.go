package main

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/internal/configfile"
	"github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

// Reload timing: a change of the config's directory is read once it has
// been quiet this long (several quick edits make one reload, of the last);
// the file is read again this often whatever the notifications say.
const (
	reloadSettle = 200 * time.Millisecond
	reloadPoll   = 10 * time.Second
)

// reloader applies the config file to a running engine when it changes
// (a write, a rename, or the kubelet's swap of a ConfigMap volume's
// ..data symlink: the file's directory is watched and the content
// hashed) and on SIGHUP. One reload runs at a time. An invalid config
// changes nothing and logs each problem.
type reloader struct {
	path    string
	opts    schema.LoadOptions
	engine  *msync.Engine
	restCfg *rest.Config
	log     *slog.Logger

	started *schema.Plan // what serve started with: its server settings stay
	current *schema.Plan
	applied [32]byte // hash of the content current was loaded from
	// tried is the hash of the content of the last refused reload, not
	// tried again until retryAt (never, for an invalid config: only an
	// edit or SIGHUP); failed is set from a refused reload to the next
	// success.
	tried   [32]byte
	retryAt time.Time
	failed  bool
	readErr string // the last read error, logged once

	lastOK  prometheus.Gauge
	lastAt  prometheus.Gauge
	reloads *prometheus.CounterVec
}

// hashFile returns the hash of a file's content (zero when unreadable).
func hashFile(path string) (sum [32]byte) {
	if b, err := configfile.Read(path); err == nil {
		sum = sha256.Sum256(b)
	}
	return sum
}

// newReloader builds the reloader of a daemon that started with plan,
// loaded from content of hash sum (hashed before it was loaded: an edit
// in between is applied by the first reload).
func newReloader(path string, sum [32]byte, opts schema.LoadOptions, plan *schema.Plan, engine *msync.Engine, restCfg *rest.Config, log *slog.Logger) *reloader {
	r := &reloader{
		path: path, opts: opts, engine: engine, restCfg: restCfg, log: log, started: plan, current: plan,
		lastOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "metasync_config_last_reload_successful",
			Help: "1 when the last config reload applied (or none was tried), 0 when it was refused.",
		}),
		lastAt: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "metasync_config_last_reload_success_timestamp_seconds",
			Help: "When the config was last applied (at start, or by a reload), in Unix seconds.",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metasync_config_reloads_total",
			Help: "Config reloads tried, by result (success, failure).",
		}, []string{"result"}),
	}
	r.lastOK.Set(1)
	r.lastAt.SetToCurrentTime()
	r.reloads.WithLabelValues("success")
	r.reloads.WithLabelValues("failure")
	r.applied = sum
	return r
}

func (r *reloader) collectors() []prometheus.Collector {
	return []prometheus.Collector{r.lastOK, r.lastAt, r.reloads}
}

// run reloads until ctx ends: on hup, on a change of the config's
// directory, and every reloadPoll.
func (r *reloader) run(ctx context.Context, hup <-chan os.Signal) {
	var events <-chan fsnotify.Event
	var errs <-chan error
	if fw, err := fsnotify.NewWatcher(); err != nil {
		r.log.Warn("config changes are noticed by polling only", "every", reloadPoll.String(), "error", err.Error())
	} else {
		defer fw.Close()
		dir := filepath.Dir(r.path)
		if err := fw.Add(dir); err != nil {
			r.log.Warn("config changes are noticed by polling only", "directory", dir, "every", reloadPoll.String(), "error", err.Error())
		} else {
			events, errs = fw.Events, fw.Errors
		}
	}
	poll := time.NewTicker(reloadPoll)
	defer poll.Stop()
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			r.log.Info("SIGHUP: reading the config again", "config", r.path)
			r.reload(true)
		case <-events:
			settle.Reset(reloadSettle)
		case err := <-errs:
			r.log.Warn("watching the config's directory", "error", err.Error())
		case <-settle.C:
			r.reload(false)
		case <-poll.C:
			r.reload(false)
		}
	}
}

// reload reads the config and applies it when its content changed (or
// when forced, by SIGHUP).
func (r *reloader) reload(force bool) {
	b, err := configfile.Read(r.path)
	if err != nil {
		if force || err.Error() != r.readErr {
			r.readErr = err.Error()
			r.fail("config file unreadable: nothing changed", err)
		}
		return
	}
	r.readErr = ""
	sum := sha256.Sum256(b)
	switch {
	case force:
	case sum == r.tried:
		if time.Now().Before(r.retryAt) {
			return // refused, and logged: wait for an edit, SIGHUP or the retry
		}
	case sum == r.applied:
		if r.failed {
			// Back to the running config after a refused one: nothing to
			// change, and the config in force is the file's again.
			r.log.Info("config is the running one again", "config", r.path)
			r.succeeded(sum)
		}
		return
	}
	next, err := schema.LoadPlan(r.path, r.opts)
	if err != nil {
		r.refuse(sum, time.Time{}, "invalid config: nothing changed", err)
		return
	}
	changes := schema.Compare(r.current, next)
	for _, setting := range schema.Compare(r.started, next).NotLive {
		r.log.Warn("a setting differs from the running one and takes effect only at the next start: restart to apply it", "setting", setting)
	}
	if len(next.CRDs()) > 0 {
		if err := installCRDs(next, r.restCfg, r.log); err != nil {
			// The apiserver may refuse for a while: try again later.
			r.refuse(sum, time.Now().Add(crdRetry), "CRDs not applied: nothing changed; retried in "+crdRetry.String()+", or at an edit or SIGHUP", err)
			return
		}
	}
	if err := checkInstalledPaths(next, r.restCfg, 15*time.Second, r.log); err != nil {
		r.refuse(sum, time.Time{}, "config paths not in the installed CRDs' schemas: nothing changed; tried again at an edit or SIGHUP", err)
		return
	}
	if _, err := r.engine.Reload(next); err != nil {
		r.refuse(sum, time.Time{}, "config not applied: nothing changed", err)
		return
	}
	r.current = next
	r.succeeded(sum)
	if changes.None() {
		r.log.Info("config reloaded: no resource or chain changed", "config", r.path)
	}
}

// crdRetry is how long a reload whose CRDs the apiserver refused waits
// before it tries the same content again.
const crdRetry = time.Minute

func (r *reloader) succeeded(sum [32]byte) {
	r.applied, r.failed = sum, false
	r.tried, r.retryAt = [32]byte{}, time.Time{}
	r.lastOK.Set(1)
	r.lastAt.SetToCurrentTime()
	r.reloads.WithLabelValues("success").Inc()
}

// refuse records a refused reload of the content sum, not tried again
// before retryAt (zero: not until it changes), and logs it.
func (r *reloader) refuse(sum [32]byte, retryAt time.Time, msg string, err error) {
	r.tried, r.retryAt = sum, retryAt
	if retryAt.IsZero() {
		r.retryAt = time.Now().Add(100 * 365 * 24 * time.Hour)
	}
	r.fail(msg, err)
}

// fail logs every problem of a refused reload, one line each with its
// field path, and sets the metrics.
func (r *reloader) fail(msg string, err error) {
	problems := schema.Problems(err)
	for _, p := range problems {
		r.log.Error("config reload refused", "config", r.path, "problem", p.Error())
	}
	r.log.Error(msg, "config", r.path, "problems", len(problems))
	r.failed = true
	r.lastOK.Set(0)
	r.reloads.WithLabelValues("failure").Inc()
}
