package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/iidp/metasync/cmd/metasync/internal/auth"
	"github.com/iidp/metasync/internal/wire"
	msync "github.com/iidp/metasync/sync"
)

// DefaultHeartbeat is how long a stream may go without a frame before it
// gets a heartbeat.
const DefaultHeartbeat = 15 * time.Second

// streamWriteTimeout bounds one frame's write: a client that reads nothing
// for this long loses its stream (and resumes with ?version=). Until then
// it costs one subscription, whose changes coalesce, and the socket's
// buffers: never a backlog.
const streamWriteTimeout = time.Minute

// streamMetrics count the streams; no label carries a key.
type streamMetrics struct {
	open   prometheus.Gauge
	frames *prometheus.CounterVec
}

func newStreamMetrics() *streamMetrics {
	return &streamMetrics{
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "metasync_streams_open",
			Help: "HTTP change streams open (?watch=true).",
		}),
		frames: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metasync_stream_frames_total",
			Help: "Frames written to HTTP change streams, by type.",
		}, []string{"type"}),
	}
}

// SetHeartbeat sets how long a stream may go without a frame before it
// gets a heartbeat (default DefaultHeartbeat).
func (s *Server) SetHeartbeat(d time.Duration) {
	if d > 0 {
		s.heartbeat = d
	}
}

// CloseStreams ends every change stream cleanly, as the HTTP server's
// drain begins: http.Server.Shutdown waits for handlers, and a stream's
// handler would otherwise never return. A stream stuck writing to a client
// that reads nothing is cut at once. HTTPServer registers it.
func (s *Server) CloseStreams() {
	s.endStreams()
	s.openStreams.Range(func(k, _ any) bool {
		_ = k.(*http.ResponseController).SetWriteDeadline(time.Now())
		return true
	})
}

// watching reports whether a request asks for a stream.
func watching(r *http.Request) bool {
	return r.Method == http.MethodGet && r.URL.Query().Get("watch") == "true"
}

// stream answers a ?watch=true request for target t: NDJSON frames, each
// flushed, until the client goes or the server drains.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, t msync.Target) {
	// Within the limits, or refused with 429 or 503 (see Limits).
	release, ok := s.admitStream(w, r)
	if !ok {
		return
	}
	defer release()
	t.Resume = r.URL.Query().Get("version")
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(s.streams, cancel)
	defer stop()
	sub, err := s.engine.Subscribe(ctx, t)
	if err != nil {
		writeError(w, http.StatusNotFound, err.Error())
		return
	}
	defer sub.Close()
	s.streamMetrics.open.Inc()
	defer s.streamMetrics.open.Dec()

	rc := http.NewResponseController(w)
	s.openStreams.Store(rc, nil)
	defer s.openStreams.Delete(rc)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_ = rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	// Behind --auth=tokenreview the caller is authorized again each
	// heartbeat period (from the auth caches, so a review at most every
	// 10 s or so): a token that lost its access, or expired, ends its
	// streams; the client's reconnect then gets the 401 or 403. When the
	// review cannot be made (the apiserver unreachable, metasync's own
	// review rights gone), a re-check answers what a lookup with the token
	// would: the cached verdict while it lasts (at most 60 s after the
	// review that granted it, see TokenAuth), then 503. A stream re-checked
	// 503 at two checks in a row, a heartbeat period apart, ends: a
	// caller's streams outlive the last review that worked by at most that
	// verdict's life and two heartbeat periods (and the reviews' timeouts).
	access := streamAccess{heartbeat: s.heartbeat, checked: time.Now()}
	if c, ok := auth.CallerFrom(r.Context()); ok {
		access.recheck = c.Recheck
	}
	stale := false // the last frame sent said "stale"
	for {
		if !access.still(s.log, r.URL.Path) {
			return
		}
		f, ok := s.nextFrame(ctx, sub, t, stale)
		if !ok {
			return // the client went, or the server drains
		}
		stale = f.Stale
		buf.Reset()
		_ = enc.Encode(f) // a frame always encodes; Encode ends the line
		if ctx.Err() != nil {
			return // draining: CloseStreams may have cut the deadline already
		}
		if err := rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return
		}
		if _, err := w.Write(buf.Bytes()); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
		s.streamMetrics.frames.WithLabelValues(f.Type).Inc()
		if f.Type == wire.FrameGone {
			return // a reload removed the target
		}
	}
}

// streamAccess re-checks a stream's caller each heartbeat period (see
// Server.stream).
type streamAccess struct {
	recheck      func() int // nil: no --auth
	heartbeat    time.Duration
	checked      time.Time
	failingSince time.Time
}

// still reports whether the stream may go on, and logs why not.
func (a *streamAccess) still(log *slog.Logger, path string) bool {
	if a.recheck == nil || time.Since(a.checked) < a.heartbeat {
		return true
	}
	a.checked = time.Now()
	switch code := a.recheck(); {
	case code == 0:
		a.failingSince = time.Time{}
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		log.Info("stream ended: the caller is no longer authorized", "path", path, "status", code)
		return false
	case a.failingSince.IsZero():
		a.failingSince = a.checked
	case a.checked.Sub(a.failingSince) >= a.heartbeat:
		log.Info("stream ended: the caller's access cannot be reviewed", "path", path, "status", code,
			"failing_for", a.checked.Sub(a.failingSince).Round(time.Millisecond).String())
		return false
	}
	return true
}

// nextFrame is the stream's next frame: the subscription's next event, or a
// heartbeat after a heartbeat period without one. A client that holds
// answers marked stale (stale) hears at once, from a heartbeat without
// "stale", that the daemon has caught up, not a heartbeat period later.
// ok is false when the client went or the server drains.
func (s *Server) nextFrame(ctx context.Context, sub *msync.Subscription, t msync.Target, stale bool) (f wire.Frame, ok bool) {
	wait, done := context.WithTimeout(ctx, s.heartbeat)
	if stale {
		changed := s.engine.StaleChanged()
		if !s.engine.Stale() {
			done()
		} else {
			go func() {
				select {
				case <-changed:
					done()
				case <-wait.Done():
				}
			}()
		}
	}
	ev, err := sub.Next(wait)
	done()
	switch {
	case err == nil:
		f = s.frameOf(t, ev)
	case ctx.Err() == nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)):
		f = wire.Frame{Type: wire.FrameHeartbeat, Version: sub.Version()}
	default:
		return f, false
	}
	f.Stale = s.engine.Stale()
	if f.Type != wire.FrameGone {
		cs := s.engine.ClusterStates(t)
		if t.Cluster != "" {
			// One cluster's part: that cluster's stale (cs holds that
			// cluster alone).
			f.Stale = cs[t.Cluster].Stale
		}
		f.Clusters = wireClusters(cs)
	}
	return f, true
}

// frameType is the frame of each event.
var frameType = map[msync.EventType]string{
	msync.EventSnapshot: wire.FrameSnapshot,
	msync.EventSynced:   wire.FrameSynced,
	msync.EventUpdate:   wire.FrameUpdate,
	msync.EventReset:    wire.FrameReset,
	msync.EventGone:     wire.FrameGone,
}

// frameOf turns an event into a frame of target t.
func (s *Server) frameOf(t msync.Target, ev msync.Event) wire.Frame {
	f := wire.Frame{Type: frameType[ev.Type], Version: ev.Version}
	switch {
	case ev.Type == msync.EventReset:
	case t.Chain != "":
		f.Chain = t.Chain
	default:
		f.Index = t.Index
	}
	if ev.Type == msync.EventGone {
		f.Version = ""
	}
	if ev.Type == msync.EventSnapshot || ev.Type == msync.EventUpdate {
		key, values := ev.Key, nonNil(ev.Values)
		f.Key, f.Values = &key, &values
	}
	return f
}
