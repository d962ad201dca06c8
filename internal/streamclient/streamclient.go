// Package streamclient follows a change stream of a metasync daemon
// (?watch=true: NDJSON frames), resumed after every break from the last
// version it got, with a backoff. `metasync get --watch` and the remote
// gRPC resolver read streams through it.
package streamclient

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
	"strconv"
	"strings"
	"time"

	"github.com/iidp/metasync/internal/tlsfiles"
	"github.com/iidp/metasync/internal/wire"
)

// Frame is one line of a stream, and the line as the daemon sent it.
type Frame struct {
	wire.Frame
	// Raw is the line as the daemon sent it, valid until onFrame returns.
	Raw []byte `json:"-"`
}

// Options tune Follow.
type Options struct {
	// Client makes the requests; it must have no Timeout (a stream lasts).
	// Default: a client that follows no redirect.
	Client *http.Client
	// Token returns the bearer token of each connection, or nil for none.
	Token func() (string, error)
	// Idle is how long a stream may stay silent before Follow reconnects
	// (a daemon sends a heartbeat every 15 s by default). Default 1 minute.
	Idle time.Duration
	// StopOnRefusal makes Follow return an answer that retrying cannot
	// change (4xx other than 429) as a *Refused, instead of retrying it.
	StopOnRefusal bool
	// MaxFrame bounds a frame, one line of the stream with its newline,
	// in bytes: a longer line breaks the stream (with an error that says so), which is then
	// resumed after the backoff as after any break. What a stream holds
	// in memory stays under about twice the bound, whatever the daemon
	// sends. Default DefaultMaxFrame.
	MaxFrame int
	// OnBreak hears of each broken stream, with when it is retried.
	OnBreak func(err error, retry time.Duration)
	// Query holds parameters sent with each request beside watch and
	// version (zone and node, for a topology-aware answer).
	Query url.Values
}

// TokenFile returns a Token function that reads the bearer token in path
// at each call (each connection), so that a rotated token (a projected
// service account token, which the kubelet replaces before it expires) is
// the one sent. An empty file is an error, not a request without a token.
func TokenFile(path string) func() (string, error) {
	return func() (string, error) {
		// A pipe would block the open: only a regular file is read.
		if st, err := os.Stat(path); err != nil {
			return "", err
		} else if !st.Mode().IsRegular() {
			return "", fmt.Errorf("token file %s is not a regular file", path)
		}
		f, err := os.Open(path)
		if err != nil {
			return "", err
		}
		defer f.Close()
		// A token is a few KiB; a path that points at something endless
		// must not fill the memory.
		b, err := io.ReadAll(io.LimitReader(f, maxToken+1))
		if err != nil {
			return "", err
		}
		if len(b) > maxToken {
			return "", fmt.Errorf("token file %s is larger than %d bytes", path, maxToken)
		}
		token := strings.TrimSpace(string(b))
		if token == "" {
			return "", fmt.Errorf("token file %s is empty", path)
		}
		return token, nil
	}
}

// maxToken bounds what TokenFile reads.
const maxToken = 64 << 10

// DefaultMaxFrame is the default bound of a frame: 4 MiB, an answer of
// about 200,000 IPv4 addresses, far beyond any answer a resolver or a
// terminal uses.
const DefaultMaxFrame = 4 << 20

// NewClient is the HTTP client of a stream (no Timeout: a stream lasts;
// no redirect followed) whose https:// connections verify the daemon's
// certificate against the CA certificates of caFile, read again at each
// connection (the system's roots when caFile is ""), for serverName (the
// URL's host when "").
func NewClient(caFile, serverName string) *http.Client {
	return &http.Client{
		Transport:     tlsfiles.Transport(caFile, serverName),
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Refused is an answer of the daemon that retrying cannot change: an
// unknown index or chain, a bad token, a denied access.
type Refused struct{ Err error }

func (r *Refused) Error() string { return r.Err.Error() }
func (r *Refused) Unwrap() error { return r.Err }

// Follow reads the stream of the lookup at target (a URL without
// ?watch=true) until ctx ends (then it returns nil), onFrame returns an
// error (returned), or, with StopOnRefusal, the daemon refuses. Heartbeats
// go to onFrame too. After a break it waits (0.5 s, doubling to 8 s; back
// to 0.5 s after a stream that lasted 10 s) and resumes from the last
// version; the daemon then sends what changed, or a reset and a snapshot.
func Follow(ctx context.Context, target string, o Options, onFrame func(Frame) error) error {
	if o.Client == nil {
		o.Client = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	if o.Idle <= 0 {
		o.Idle = time.Minute
	}
	if o.MaxFrame <= 0 {
		o.MaxFrame = DefaultMaxFrame
	}
	version := ""
	backoff := 500 * time.Millisecond
	for {
		start := time.Now()
		err := once(ctx, target, &version, o, onFrame)
		if ctx.Err() != nil {
			return nil
		}
		var refused *Refused
		var stop stopError
		switch {
		case errors.As(err, &stop):
			return stop.err
		case errors.As(err, &refused) && o.StopOnRefusal:
			return err
		}
		if time.Since(start) > 10*time.Second {
			backoff = 500 * time.Millisecond
		}
		wait := backoff
		var busy *busyError
		if errors.As(err, &busy) {
			wait = max(wait, busy.after)
		}
		if o.OnBreak != nil {
			o.OnBreak(err, wait)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		backoff = min(2*backoff, 8*time.Second)
	}
}

// busyError is an answer with Retry-After (the daemon's limits answer
// 429 or 503 with it): Follow asks again no sooner than after.
type busyError struct {
	err   error
	after time.Duration
}

func (b *busyError) Error() string { return b.err.Error() }
func (b *busyError) Unwrap() error { return b.err }

// maxRetryAfter bounds how long a Retry-After keeps Follow away.
const maxRetryAfter = time.Minute

// retryAfter reads a Retry-After of whole seconds (the only form the
// daemon sends); 0 when absent or of another form.
func retryAfter(v string) time.Duration {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n <= 0 {
		return 0
	}
	return min(time.Duration(n)*time.Second, maxRetryAfter)
}

// stopError carries an error of onFrame out of Follow.
type stopError struct{ err error }

func (s stopError) Error() string { return s.err.Error() }

// once reads one stream until it ends.
func once(ctx context.Context, target string, version *string, o Options, onFrame func(Frame) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	q := url.Values{"watch": {"true"}}
	for k, vs := range o.Query {
		q[k] = vs
	}
	if *version != "" {
		q.Set("version", *version)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target+"?"+q.Encode(), nil)
	if err != nil {
		return &Refused{err}
	}
	if o.Token != nil {
		token, err := o.Token()
		if err != nil {
			return fmt.Errorf("bearer token: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
	}
	// From the request on: a daemon (or a proxy without a backend) that
	// accepts the connection and never answers breaks the stream after
	// Idle, reported and retried, as one that goes silent later does.
	idle := time.AfterFunc(o.Idle, cancel)
	defer idle.Stop()
	resp, err := o.Client.Do(req)
	if err != nil {
		if ctx.Err() != nil && !idle.Stop() {
			return fmt.Errorf("no answer within %v", o.Idle)
		}
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		var e wire.Error
		err := fmt.Errorf("answered %s", resp.Status)
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			err = fmt.Errorf("%s (%s)", e.Error, resp.Status)
		}
		if resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusTooManyRequests {
			return &Refused{err}
		}
		if after := retryAfter(resp.Header.Get("Retry-After")); after > 0 {
			return &busyError{err: err, after: after}
		}
		return err
	}
	idle.Reset(o.Idle)
	sc := bufio.NewScanner(resp.Body)
	// The buffer holds a frame and its newline, and grows (doubling) to
	// that at most: the scanner then stops with ErrTooLong.
	sc.Buffer(make([]byte, min(64<<10, o.MaxFrame)), o.MaxFrame)
	for sc.Scan() {
		idle.Reset(o.Idle)
		var f Frame
		if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
			return fmt.Errorf("a line that is not a frame: %.200s", sc.Text())
		}
		f.Raw = sc.Bytes()
		if err := onFrame(f); err != nil {
			return stopError{err}
		}
		if f.Version != "" {
			*version = f.Version
		}
	}
	if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
		return fmt.Errorf("a frame longer than %d bytes: not a stream of a metasync daemon, or an answer beyond the bound (streamclient.Options.MaxFrame)", o.MaxFrame)
	} else if err != nil {
		return err
	}
	return io.ErrUnexpectedEOF
}

// PathSegment escapes s as one segment of a URL path: "/" and every other
// reserved byte percent-encoded, and "." and ".." (which url.PathEscape
// leaves alone, and which a client or ServeMux would clean away as "this
// folder" and "the parent") as %2E and %2E%2E. ServeMux cleans the path as
// sent, so %2E stays, and it unescapes each segment when it matches.
func PathSegment(s string) string {
	switch s {
	case ".":
		return "%2E"
	case "..":
		return "%2E%2E"
	}
	return url.PathEscape(s)
}
