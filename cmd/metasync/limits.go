package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/iidp/metasync/cmd/metasync/internal/consul"
	"github.com/iidp/metasync/cmd/metasync/internal/server"
	"github.com/iidp/metasync/cmd/metasync/internal/xds"
)

// The defaults of the limits on streams and connections (see limitFlags).
const (
	// maxAutoConnections bounds the connections that the descriptor limit
	// would allow: beyond, memory is the limit (a connection costs about
	// 10 KB idle, a stream about 30 KB).
	maxAutoConnections = 16384
	defaultStreams     = 4096
	defaultPerCaller   = 256
)

// fdReserve is how many of the process's file descriptors the connection
// limit leaves to the rest of it (the watches' connections to the
// apiserver, the config and snapshot files, the refusals being answered):
// an eighth of the limit, at least 64.
func fdReserve(fds int) int { return max(64, fds/8) }

// lookupRoom is how many of the connections are never streams: room for
// lookups and probes while streams are refused. An eighth, at least 16.
func lookupRoom(conns int) int { return max(16, conns/8) }

// limitFlags are serve's flags of the limits on streams and connections.
type limitFlags struct {
	connections, streams, perCaller *int
	// The xDS server's (with --xds-listen).
	xdsConnections, xdsConnsPerCaller, xdsStreamsPerCaller, xdsNamesPerCaller, xdsAssignments *int
	// The Consul facade's (with --consul-listen).
	consulBlocking, consulPerCaller, consulConnections, consulConnsPerCaller *int
}

// faceLimits are the limits of the HTTP API, the xDS server and the
// Consul facade, out of one descriptor budget.
type faceLimits struct {
	http   server.Limits
	xds    xds.Limits
	consul consul.Limits
}

func addLimitFlags(fs *flag.FlagSet) limitFlags {
	return limitFlags{
		connections:    fs.Int("max-connections", 0, fmt.Sprintf("most HTTP connections open at once; beyond, the connection idle longest is closed, or with none idle the new one gets 503 (0: the file descriptor limit less an eighth of it, at least 64 kept for the rest of the process, at most %d)", maxAutoConnections)),
		streams:        fs.Int("max-streams", 0, fmt.Sprintf("most change streams (?watch=true) open at once, of all callers; beyond, 503 (0: %d, within --max-connections less an eighth of it, at least 16, kept for lookups and probes)", defaultStreams)),
		perCaller:      fs.Int("max-streams-per-caller", 0, fmt.Sprintf("most change streams that one caller (the identity with --auth=tokenreview, else the remote address) may hold open; beyond, 429 (0: %d, at most a quarter of --max-streams)", defaultPerCaller)),
		xdsConnections: fs.Int("xds-max-connections", 0, fmt.Sprintf("with --xds-listen: most xDS connections open at once; beyond, the one without a stream idle longest is closed, else the new one; taken from the same file descriptor budget as --max-connections (0: half the budget, at most %d)", xds.DefaultConnections)),
		xdsConnsPerCaller: fs.Int("xds-max-connections-per-caller", xds.DefaultConnectionsPerCaller,
			"with --xds-listen: most xDS connections that carry one caller's streams, and most connections without a stream from one address; beyond, RESOURCE_EXHAUSTED (0: no limit)"),
		xdsStreamsPerCaller: fs.Int("xds-max-streams-per-caller", xds.DefaultStreamsPerCaller,
			"with --xds-listen: most ADS streams that one caller (the identity with --auth=tokenreview, else the remote address) may hold open; beyond, RESOURCE_EXHAUSTED (0: no limit)"),
		xdsNamesPerCaller: fs.Int("xds-max-names-per-caller", xds.DefaultNamesPerCaller,
			"with --xds-listen: most resource names (of all types) that one caller's ADS streams may follow at once; beyond, the stream ends RESOURCE_EXHAUSTED (0: no limit)"),
		xdsAssignments: fs.Int("xds-max-assignments", xds.DefaultAssignments,
			"with --xds-listen: most assignments (by target and zone) that all clients follow together, a quarter of them started by one caller (about 25 KiB each); a name beyond is not answered until some are let go (0: no limit)"),
		consulBlocking: fs.Int("consul-max-blocking", consul.DefaultBlocking,
			"with --consul-listen: most Consul blocking queries open at once, of all callers; beyond, 503 (0: no limit but --consul-max-connections); lowered to leave an eighth of --consul-max-connections, at least 16, to reads that answer at once"),
		consulPerCaller: fs.Int("consul-max-blocking-per-caller", consul.DefaultBlockingPerCaller,
			"with --consul-listen: most Consul blocking queries that one caller (the identity with --auth=tokenreview, else the remote address) may hold open; beyond, 429 (0: no limit)"),
		consulConnections: fs.Int("consul-max-connections", 0, fmt.Sprintf("with --consul-listen: most Consul facade connections open at once; beyond, the idle one (kept alive, or with no request yet) of the address holding the most is closed, else the new one gets 503; taken from the same file descriptor budget as --max-connections (0: --consul-max-blocking + %d, at most half of what xDS leaves of the budget)", consul.Room)),
		consulConnsPerCaller: fs.Int("consul-max-connections-per-caller", consul.DefaultConnectionsPerCaller,
			"with --consul-listen: most Consul facade connections open at once from one remote address; beyond, that address's idle one is closed, else the new one gets 503 (0: no limit; at most half of --consul-max-connections)"),
	}
}

// consulLimits derives the Consul facade's limits from the flags, given
// the connections that the descriptor budget leaves (connCap, after
// xDS's share), and returns them with what remains of the budget for
// HTTP connections. Without --consul-listen (on false), the facade takes
// nothing.
func (f limitFlags) consulLimits(on bool, connCap int, log *slog.Logger) (consul.Limits, int, error) {
	for name, v := range map[string]int{"consul-max-blocking": *f.consulBlocking, "consul-max-blocking-per-caller": *f.consulPerCaller,
		"consul-max-connections": *f.consulConnections, "consul-max-connections-per-caller": *f.consulConnsPerCaller} {
		if v < 0 {
			return consul.Limits{}, 0, fmt.Errorf("--%s %d: want a positive number, or 0 for the default or no limit", name, v)
		}
	}
	if !on {
		return consul.Limits{}, connCap, nil
	}
	l := consul.Limits{Blocking: *f.consulBlocking, BlockingPerCaller: *f.consulPerCaller, ConnectionsPerCaller: *f.consulConnsPerCaller}
	const minHTTPConnections = 32
	room := connCap - minHTTPConnections
	if room < 16 {
		return consul.Limits{}, 0, fmt.Errorf("the file descriptor limit leaves no room for Consul facade connections beside HTTP's: raise it (ulimit -n)")
	}
	switch n := *f.consulConnections; {
	case n == 0:
		n = consul.DefaultConnections
		if l.Blocking > 0 {
			n = l.Blocking + consul.Room
		}
		l.Connections = min(n, connCap/2)
	case n > room:
		log.Warn("--consul-max-connections lowered: the file descriptor limit leaves no more beside HTTP's", "asked", n, "connections", room)
		l.Connections = room
	default:
		l.Connections = n
	}
	if l.Connections < 32 {
		return consul.Limits{}, 0, fmt.Errorf("--consul-max-connections %d: want at least 32 (blocking queries, and room for reads)", l.Connections)
	}
	if blockingCap := l.Connections - lookupRoom(l.Connections); l.Blocking > blockingCap {
		if l.Blocking != consul.DefaultBlocking {
			log.Warn("--consul-max-blocking lowered: blocking queries would take the room of reads", "asked", l.Blocking, "blocking", blockingCap, "connections", l.Connections)
		}
		l.Blocking = blockingCap
	}
	if l.Blocking > 0 && l.BlockingPerCaller > l.Blocking {
		l.BlockingPerCaller = l.Blocking
	}
	if half := l.Connections / 2; l.ConnectionsPerCaller > half {
		l.ConnectionsPerCaller = half
	}
	return l, connCap - l.Connections, nil
}

// xdsLimits derives the xDS server's limits from the flags, given the
// connections that the descriptor budget leaves (connCap), and returns
// them with what remains of the budget for HTTP connections. Without
// --xds-listen (on false), xDS takes nothing.
func (f limitFlags) xdsLimits(on bool, connCap int, log *slog.Logger) (xds.Limits, int, error) {
	if v := *f.xdsConnections; v < 0 {
		return xds.Limits{}, 0, fmt.Errorf("--xds-max-connections %d: want a positive number, or 0 for the default", v)
	}
	for name, v := range map[string]int{"xds-max-connections-per-caller": *f.xdsConnsPerCaller,
		"xds-max-streams-per-caller": *f.xdsStreamsPerCaller, "xds-max-names-per-caller": *f.xdsNamesPerCaller,
		"xds-max-assignments": *f.xdsAssignments} {
		if v < 0 {
			return xds.Limits{}, 0, fmt.Errorf("--%s %d: want a positive number, or 0 for no limit", name, v)
		}
	}
	if !on {
		return xds.Limits{}, connCap, nil
	}
	l := xds.DefaultLimits()
	l.ConnectionsPerCaller, l.StreamsPerCaller, l.NamesPerCaller = *f.xdsConnsPerCaller, *f.xdsStreamsPerCaller, *f.xdsNamesPerCaller
	l.Assignments = *f.xdsAssignments
	// HTTP keeps at least minHTTPConnections of the budget: the probes
	// and lookups.
	const minHTTPConnections = 32
	room := connCap - minHTTPConnections
	if room < 16 {
		return xds.Limits{}, 0, fmt.Errorf("the file descriptor limit leaves no room for xDS connections beside HTTP's: raise it (ulimit -n)")
	}
	switch n := *f.xdsConnections; {
	case n == 0:
		l.Connections = min(xds.DefaultConnections, connCap/2)
	case n > room:
		log.Warn("--xds-max-connections lowered: the file descriptor limit leaves no more beside HTTP's", "asked", n, "connections", room)
		l.Connections = room
	default:
		l.Connections = n
	}
	return l, connCap - l.Connections, nil
}

// limits derives the limits from the flags and the process's descriptor
// limit fds (0: unknown). A limit set above what fds or the other limits
// allow is lowered to it, with a warning: never so high that accepting a
// connection could fail for want of a descriptor, nor that streams could
// take the room of lookups and probes.
//
// With xDS on, the xDS connections come out of the same budget (see
// xdsLimits), then with the Consul facade on, the facade's (see
// consulLimits): HTTP connections, xDS and Consul connections and the
// reserve never pass the descriptor limit.
func (f limitFlags) limits(fds int, xdsOn, consulOn bool, log *slog.Logger) (faceLimits, error) {
	for name, v := range map[string]int{"max-connections": *f.connections, "max-streams": *f.streams, "max-streams-per-caller": *f.perCaller} {
		if v < 0 {
			return faceLimits{}, fmt.Errorf("--%s %d: want a positive number, or 0 for the default", name, v)
		}
	}
	connCap := maxAutoConnections
	if fds > 0 {
		connCap = fds - fdReserve(fds)
		if connCap < 32 {
			return faceLimits{}, fmt.Errorf("the file descriptor limit (%d) leaves no room for connections: raise it (ulimit -n)", fds)
		}
	}
	xl, left, err := f.xdsLimits(xdsOn, connCap, log)
	if err != nil {
		return faceLimits{}, err
	}
	cl, left, err := f.consulLimits(consulOn, left, log)
	if err != nil {
		return faceLimits{}, err
	}
	if fds > 0 {
		connCap = left
	}
	conns := *f.connections
	switch {
	case conns == 0:
		conns = min(connCap, maxAutoConnections)
	case fds > 0 && conns > connCap:
		log.Warn("--max-connections lowered: the file descriptor limit leaves no more", "asked", conns, "connections", connCap, "fdLimit", fds)
		conns = connCap
	}
	streamCap := conns - lookupRoom(conns)
	if streamCap < 1 {
		return faceLimits{}, fmt.Errorf("--max-connections %d leaves no room for streams beside the %d kept for lookups and probes", conns, lookupRoom(conns))
	}
	streams := *f.streams
	switch {
	case streams == 0:
		streams = min(defaultStreams, streamCap)
	case streams > streamCap:
		log.Warn("--max-streams lowered: streams would take the room of lookups and probes", "asked", streams, "streams", streamCap, "connections", conns)
		streams = streamCap
	}
	perCaller := *f.perCaller
	switch {
	case perCaller == 0:
		perCaller = min(defaultPerCaller, max(1, streams/4))
	case perCaller > streams:
		perCaller = streams
	}
	l := server.Limits{Streams: streams, StreamsPerCaller: perCaller, Connections: conns}
	attrs := []any{"connections", l.Connections, "streams", l.Streams, "streamsPerCaller", l.StreamsPerCaller, "fdLimit", fds}
	if xdsOn {
		attrs = append(attrs, "xdsConnections", xl.Connections, "xdsConnectionsPerCaller", xl.ConnectionsPerCaller,
			"xdsStreamsPerCaller", xl.StreamsPerCaller, "xdsNamesPerCaller", xl.NamesPerCaller, "xdsAssignments", xl.Assignments)
	}
	if consulOn {
		attrs = append(attrs, "consulConnections", cl.Connections, "consulConnectionsPerCaller", cl.ConnectionsPerCaller,
			"consulBlocking", cl.Blocking, "consulBlockingPerCaller", cl.BlockingPerCaller)
	}
	log.Info("limits", attrs...)
	return faceLimits{http: l, xds: xl, consul: cl}, nil
}

// streamBurstDrop is the drop in open streams, from their peak since the
// last trim, after which trimAfterStreams returns memory: at least this
// many, and at least half of the peak. It looks every streamTrimPeriod,
// and trims at most every streamTrimSpacing: a caller that opens and
// closes streams in a loop cannot make the daemon collect its whole heap
// every second.
const (
	streamBurstDrop   = 64
	streamTrimPeriod  = time.Second
	streamTrimSpacing = 10 * time.Second
)

// trimAfterStreams returns the memory a burst of change streams leaves
// behind once it has ended. Each stream holds buffers and a goroutine's
// stack; when many end, that memory is garbage that an idle process does
// not collect before the runtime's forced collection, two minutes on, and
// that returnFreeMemory does not see either (its count of dead objects
// is from the last collection). Every streamTrimPeriod it looks at the
// peak of open streams since its last trim: when the streams open now are
// fewer by streamBurstDrop and by half, and have stopped falling (the
// handlers of a burst that ended take a moment to return), it collects
// twice and returns the free memory to the kernel (debug.FreeOSMemory):
// net/http keeps a connection's buffers in pools that the first
// collection only moves aside. It returns when ctx ends.
func trimAfterStreams(ctx context.Context, log *slog.Logger, s *server.Server) {
	t := time.NewTicker(streamTrimPeriod)
	defer t.Stop()
	peak, prev := 0, 0
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p, now := s.StreamPeak()
		peak = max(peak, p)
		falling := now < prev
		prev = now
		if peak-now >= streamBurstDrop && now <= peak/2 && !falling && time.Since(last) >= streamTrimSpacing {
			start := time.Now()
			runtime.GC()
			debug.FreeOSMemory()
			last = time.Now()
			log.Debug("memory of ended streams returned to the kernel", "peak", peak, "open", now, "took", last.Sub(start).String())
			peak = now
		}
	}
}
