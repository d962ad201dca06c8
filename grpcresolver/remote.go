package grpcresolver

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc/resolver"
)

// remoteIdle is how long a stream may stay silent (a daemon sends a
// heartbeat every 15 s by default) before the resolver reconnects.
var remoteIdle = time.Minute

// NewRemoteBuilder returns a resolver.Builder of the metasync scheme that
// resolves through the change streams of the metasync daemon at daemonURL
// (such as http://127.0.0.1:8080, or a node-local daemon's address). While
// the daemon cannot be reached, a resolver keeps its last addresses and
// reports the error; it reconnects with a backoff (0.5 s to 8 s) and
// resumes the stream from its last version.
func NewRemoteBuilder(daemonURL string, opts ...Option) resolver.Builder {
	o := newOptions(opts)
	base := strings.TrimRight(daemonURL, "/")
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &builder{opts: o, hub: &hub{followers: map[string]*follower{}, start: func(ctx context.Context, t target, f *follower) {
		followRemote(ctx, hc, base, t, f, o)
	}}}
}

// followRemote follows a target's stream until ctx ends.
func followRemote(ctx context.Context, hc *http.Client, base string, t target, f *follower, o options) {
	path := base + "/v1/" + t.kind + "/" + url.PathEscape(t.name) + "/keys/" + pathSegment(t.key)
	log := o.log.With("target", t.String(), "daemon", base)
	version := ""
	backoff := 500 * time.Millisecond
	for ctx.Err() == nil {
		start := time.Now()
		err := streamOnce(ctx, hc, path, &version, f, o.tokenFile)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > 10*time.Second {
			backoff = 500 * time.Millisecond
		}
		log.Warn("stream from the daemon broke; keeping the last addresses", "error", err.Error(), "retry", backoff.String())
		f.fail(fmt.Errorf("metasync daemon %s: %w", base, err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 8*time.Second)
	}
}

// pathSegment escapes a key as one path segment, "." and ".." included
// (which a client or ServeMux would otherwise clean away).
func pathSegment(s string) string {
	switch s {
	case ".":
		return "%2E"
	case "..":
		return "%2E%2E"
	}
	return url.PathEscape(s)
}

// streamOnce reads one stream until it ends, publishing each answer and
// keeping the last version.
func streamOnce(ctx context.Context, hc *http.Client, path string, version *string, f *follower, tokenFile string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	q := url.Values{"watch": {"true"}}
	if *version != "" {
		q.Set("version", *version)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, path+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	if tokenFile != "" {
		token, err := os.ReadFile(tokenFile) // again each time: tokens rotate
		if err != nil {
			return fmt.Errorf("bearer token: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			return fmt.Errorf("%s (%s)", e.Error, resp.Status)
		}
		return fmt.Errorf("answered %s", resp.Status)
	}
	idle := time.AfterFunc(remoteIdle, cancel)
	defer idle.Stop()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		idle.Reset(remoteIdle)
		var fr struct {
			Type    string    `json:"type"`
			Values  *[]string `json:"values"`
			Version string    `json:"version"`
		}
		if err := json.Unmarshal(sc.Bytes(), &fr); err != nil {
			return fmt.Errorf("not a frame: %.200s", sc.Text())
		}
		switch fr.Type {
		case "snapshot", "update":
			if fr.Values != nil {
				f.publish(*fr.Values)
			}
		case "gone":
			return errors.New("the index or chain was removed from the daemon's config")
		}
		if fr.Version != "" {
			*version = fr.Version
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return io.ErrUnexpectedEOF
}
