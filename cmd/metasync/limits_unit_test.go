package main

import (
	"flag"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/iidp/metasync/cmd/metasync/internal/consul"
	"github.com/iidp/metasync/cmd/metasync/internal/server"
)

// TestLimitsFromFlags: the defaults follow the descriptor limit, and a
// flag beyond what it or the other limits allow is lowered.
func TestLimitsFromFlags(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, c := range []struct {
		fds  int
		args string
		want server.Limits
		err  string
	}{
		{fds: 1024, want: server.Limits{Connections: 896, Streams: 784, StreamsPerCaller: 196}},
		{fds: 256, want: server.Limits{Connections: 192, Streams: 168, StreamsPerCaller: 42}},
		{fds: 1 << 20, want: server.Limits{Connections: 16384, Streams: 4096, StreamsPerCaller: 256}},
		{fds: 0, want: server.Limits{Connections: 16384, Streams: 4096, StreamsPerCaller: 256}},
		{fds: 1024, args: "--max-connections 5000 --max-streams 5000 --max-streams-per-caller 5000", want: server.Limits{Connections: 896, Streams: 784, StreamsPerCaller: 784}},
		{fds: 1024, args: "--max-connections 100", want: server.Limits{Connections: 100, Streams: 84, StreamsPerCaller: 21}},
		{fds: 1024, args: "--max-streams 10 --max-streams-per-caller 3", want: server.Limits{Connections: 896, Streams: 10, StreamsPerCaller: 3}},
		{fds: 1024, args: "--max-connections 16", err: "leaves no room for streams"},
		{fds: 40, err: "file descriptor limit (40)"},
		{fds: 1024, args: "--max-streams -1", err: "want a positive number"},
	} {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		lf := addLimitFlags(fs)
		if err := fs.Parse(strings.Fields(c.args)); err != nil {
			t.Fatal(err)
		}
		all, err := lf.limits(c.fds, false, false, quiet)
		got := all.http
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("fds %d, %q: %+v, %v; want an error with %q", c.fds, c.args, got, err, c.err)
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("fds %d, %q: %+v, %v; want %+v", c.fds, c.args, got, err, c.want)
		}
	}
}

// TestLimitsWithXDS: with --xds-listen, the xDS connections come out of
// the same descriptor budget as HTTP's: the two and the reserve never
// pass the limit.
func TestLimitsWithXDS(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, c := range []struct {
		fds            int
		args           string
		http, xdsConns int
		errs           string
	}{
		{fds: 4096, http: 1792, xdsConns: 1792},
		{fds: 1 << 20, http: 16384, xdsConns: 4096},
		{fds: 4096, args: "--xds-max-connections 10000", http: 32, xdsConns: 3552},
		{fds: 4096, args: "--xds-max-connections 100 --max-connections 10000", http: 3484, xdsConns: 100},
		{fds: 4096, args: "--xds-max-connections -1", errs: "want a positive number"},
		{fds: 100, errs: "no room for xDS connections"},
	} {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		lf := addLimitFlags(fs)
		if err := fs.Parse(strings.Fields(c.args)); err != nil {
			t.Fatal(err)
		}
		all, err := lf.limits(c.fds, true, false, quiet)
		h, x := all.http, all.xds
		switch {
		case c.errs != "":
			if err == nil || !strings.Contains(err.Error(), c.errs) {
				t.Errorf("fds %d, %q: %v; want an error with %q", c.fds, c.args, err, c.errs)
			}
		case err != nil || h.Connections != c.http || x.Connections != c.xdsConns:
			t.Errorf("fds %d, %q: HTTP %d, xDS %d, %v; want %d and %d", c.fds, c.args, h.Connections, x.Connections, err, c.http, c.xdsConns)
		case c.fds > 0 && h.Connections+x.Connections+fdReserve(c.fds) > c.fds:
			t.Errorf("fds %d: %d + %d + %d descriptors", c.fds, h.Connections, x.Connections, fdReserve(c.fds))
		case x.ConnectionsPerCaller != 64 || x.StreamsPerCaller != 256 || x.NamesPerCaller != 10000 || x.FirstRequest != 15*time.Second:
			t.Errorf("per-caller defaults: %+v", x)
		}
	}
}

// TestLimitsWithConsul: with --consul-listen, the Consul facade's
// connections come out of the same descriptor budget as HTTP's and
// xDS's: the three and the reserve never pass the limit, and the
// facade's blocking queries and one caller's connections fit in its
// share.
func TestLimitsWithConsul(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, c := range []struct {
		fds            int
		xds            bool
		args           string
		http, xdsConns int
		consul         consul.Limits
		errs           string
	}{
		{fds: 4096, http: 1792, consul: consul.Limits{Connections: 1792, ConnectionsPerCaller: 320, Blocking: 1568, BlockingPerCaller: 256}},
		{fds: 4096, xds: true, http: 896, xdsConns: 1792, consul: consul.Limits{Connections: 896, ConnectionsPerCaller: 320, Blocking: 784, BlockingPerCaller: 256}},
		{fds: 1 << 20, xds: true, http: 16384, xdsConns: 4096, consul: consul.Limits{Connections: 4160, ConnectionsPerCaller: 320, Blocking: 3640, BlockingPerCaller: 256}},
		{fds: 0, http: 16384, consul: consul.Limits{Connections: 4160, ConnectionsPerCaller: 320, Blocking: 3640, BlockingPerCaller: 256}},
		{fds: 256, http: 96, consul: consul.Limits{Connections: 96, ConnectionsPerCaller: 48, Blocking: 80, BlockingPerCaller: 80}},
		{fds: 4096, args: "--consul-max-blocking 100", http: 3420, consul: consul.Limits{Connections: 164, ConnectionsPerCaller: 82, Blocking: 100, BlockingPerCaller: 100}},
		{fds: 4096, args: "--consul-max-connections 10000", http: 32, consul: consul.Limits{Connections: 3552, ConnectionsPerCaller: 320, Blocking: 3108, BlockingPerCaller: 256}},
		{fds: 4096, args: "--consul-max-connections 64 --consul-max-connections-per-caller 8", http: 3520, consul: consul.Limits{Connections: 64, ConnectionsPerCaller: 8, Blocking: 48, BlockingPerCaller: 48}},
		{fds: 4096, args: "--consul-max-connections 16", errs: "want at least 32"},
		{fds: 4096, args: "--consul-max-connections-per-caller -1", errs: "want a positive number"},
		{fds: 100, xds: true, errs: "no room for"},
	} {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		lf := addLimitFlags(fs)
		if err := fs.Parse(strings.Fields(c.args)); err != nil {
			t.Fatal(err)
		}
		all, err := lf.limits(c.fds, c.xds, true, quiet)
		switch {
		case c.errs != "":
			if err == nil || !strings.Contains(err.Error(), c.errs) {
				t.Errorf("fds %d, %q: %v; want an error with %q", c.fds, c.args, err, c.errs)
			}
		case err != nil || all.http.Connections != c.http || all.xds.Connections != c.xdsConns || all.consul != c.consul:
			t.Errorf("fds %d, xDS %v, %q: HTTP %d, xDS %d, Consul %+v, %v; want %d, %d, %+v", c.fds, c.xds, c.args,
				all.http.Connections, all.xds.Connections, all.consul, err, c.http, c.xdsConns, c.consul)
		case c.fds > 0 && all.http.Connections+all.xds.Connections+all.consul.Connections+fdReserve(c.fds) > c.fds:
			t.Errorf("fds %d: %d + %d + %d + %d descriptors", c.fds, all.http.Connections, all.xds.Connections, all.consul.Connections, fdReserve(c.fds))
		}
	}
}
