package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestListMode: --streaming-list takes what a boolean flag takes, and
// auto in any case; anything else is refused with a message that names
// the values.
func TestListMode(t *testing.T) {
	for in, want := range map[string]string{"true": "true", "1": "true", "T": "true", "TRUE": "true", "false": "false", "0": "false", "F": "false", "auto": "auto", "Auto": "auto", "AUTO": "auto"} {
		var m listMode
		if err := m.Set(in); err != nil || string(m) != want {
			t.Errorf("Set(%q) = %q, %v; want %q", in, m, err, want)
		}
	}
	for _, in := range []string{"", "yes", "on", " auto", "automatic"} {
		var m listMode
		if err := m.Set(in); err == nil || !strings.Contains(err.Error(), "true, false or auto") {
			t.Errorf("Set(%q) = %v, want an error naming the values", in, err)
		}
	}
}

// TestServeStreamingListValueApart: "--streaming-list auto" (the value
// apart, which a boolean flag does not take) is refused with a message
// that shows how to write it, exit 2.
func TestServeStreamingListValueApart(t *testing.T) {
	var stderr bytes.Buffer
	err := serve([]string{"--config", "x.yaml", "--streaming-list", "auto"}, &bytes.Buffer{}, &stderr)
	if e, ok := err.(exitError); !ok || e != (exitError{2}) {
		t.Fatalf("serve = %v, want exit 2", err)
	}
	if !strings.Contains(stderr.String(), "--streaming-list=auto") {
		t.Errorf("stderr %q, want it to show --streaming-list=auto", stderr.String())
	}
}

// TestConsulBeyondLoopbackNeedsAuth: --consul-listen beyond loopback is
// refused without --auth, and with --auth=tokenreview over plain HTTP
// without --insecure-plaintext-auth, naming the flag; on loopback it
// listens without either.
func TestConsulBeyondLoopbackNeedsAuth(t *testing.T) {
	quiet := slog.New(slog.DiscardHandler)
	audience, plaintext := "", false
	o := authOptions{audience: &audience, insecurePlaintext: &plaintext}
	for _, c := range []struct{ auth, want string }{
		{"", "--consul-listen 0.0.0.0:0: beyond loopback Consul clients must authenticate: --auth=tokenreview"},
		{"tokenreview", "--consul-listen 0.0.0.0:0: --auth=tokenreview beyond loopback needs TLS"},
	} {
		var stderr bytes.Buffer
		ln, err := listenFace("consul-listen", "Consul", "", "0.0.0.0:0", c.auth, o, quiet, &stderr)
		if err == nil {
			ln.Close()
			t.Errorf("--auth %q: listening beyond loopback", c.auth)
			continue
		}
		if !strings.Contains(stderr.String(), c.want) {
			t.Errorf("--auth %q: %q, want it to say %q", c.auth, stderr.String(), c.want)
		}
	}
	var stderr bytes.Buffer
	ln, err := listenFace("consul-listen", "Consul", "", "127.0.0.1:0", "", o, quiet, &stderr)
	if err != nil {
		t.Fatalf("on loopback: %v %s", err, stderr.String())
	}
	ln.Close()
}
