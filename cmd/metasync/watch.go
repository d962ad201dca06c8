package main

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
	"os/signal"
	"syscall"
	"time"
)

// watchContext ends on Ctrl-C or SIGTERM.
func watchContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// streamIdle is how long a stream may stay silent (the daemon sends a
// heartbeat every 15 s by default) before get --watch reconnects.
var streamIdle = time.Minute

// follow prints the answers of a change stream (path, without ?watch), one
// JSON line each (the stream's snapshot, update and reset frames), until
// ctx ends. A broken stream is resumed with the last version, after a
// backoff; the daemon then sends only what changed, or a reset and a
// fresh snapshot.
func (c *client) follow(ctx context.Context, path string, stdout, stderr io.Writer) error {
	hc := &http.Client{CheckRedirect: c.http.CheckRedirect} // no Timeout: a stream lasts
	version := ""
	backoff := 500 * time.Millisecond
	for {
		q := url.Values{"watch": {"true"}}
		if version != "" {
			q.Set("version", version)
		}
		start := time.Now()
		err := c.followOnce(ctx, hc, path+"?"+q.Encode(), &version, stdout)
		if ctx.Err() != nil {
			return nil // interrupted: a clean end
		}
		var fatal fatalError
		if errors.As(err, &fatal) {
			fmt.Fprintf(stderr, "metasync get: %v\n", err)
			return exitError{1}
		}
		if time.Since(start) > 10*time.Second {
			backoff = 500 * time.Millisecond
		}
		fmt.Fprintf(stderr, "metasync get: stream from %s broke (%v); resuming in %v\n", c.base, err, backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 8*time.Second)
	}
}

// fatalError is an answer that retrying cannot change (404, 400, 401...).
type fatalError struct{ error }

// followOnce reads one stream until it ends, printing frames and keeping
// the last version.
func (c *client) followOnce(ctx context.Context, hc *http.Client, path string, version *string, stdout io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return fatalError{err}
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
		msg := fmt.Sprintf("%s answered %s", c.base, resp.Status)
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			msg = fmt.Sprintf("%s (%s)", e.Error, resp.Status)
		}
		if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
			return errors.New(msg)
		}
		return fatalError{errors.New(msg)}
	}
	idle := time.AfterFunc(streamIdle, cancel)
	defer idle.Stop()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		idle.Reset(streamIdle)
		var f struct {
			Type    string `json:"type"`
			Version string `json:"version"`
		}
		if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
			return fatalError{fmt.Errorf("%s sent a line that is not a frame: %.200s", c.base, sc.Text())}
		}
		switch f.Type {
		case "snapshot", "update", "reset":
			if _, err := fmt.Fprintf(stdout, "%s\n", sc.Bytes()); err != nil {
				return fatalError{err}
			}
		case "gone":
			fmt.Fprintf(stdout, "%s\n", sc.Bytes())
			return fatalError{errors.New("the index or chain was removed from the daemon's config")}
		}
		if f.Version != "" {
			*version = f.Version
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return io.ErrUnexpectedEOF
}
