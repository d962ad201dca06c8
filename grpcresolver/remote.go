package grpcresolver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	gosync "sync"
	"time"

	"google.golang.org/grpc/resolver"

	"github.com/iidp/metasync/internal/streamclient"
	"github.com/iidp/metasync/internal/wire"
)

// NewRemoteBuilder returns a resolver.Builder of the metasync scheme that
// resolves through the change streams of the metasync daemon at daemonURL
// (such as http://127.0.0.1:8080, or https://metasync.metasync.svc:8080
// with WithCAFile and WithTokenFile for a daemon that serves TLS and
// reviews tokens). While
// the daemon cannot be reached, or refuses the target, a resolver keeps
// its last addresses and reports the error; it reconnects with a backoff
// (0.5 s to 8 s) and resumes the stream from its last version. A frame
// longer than 4 MiB breaks the stream as
// well: what a stream reads into memory is bounded, whatever answers at
// daemonURL.
func NewRemoteBuilder(daemonURL string, opts ...Option) resolver.Builder {
	o := newOptions(opts)
	base := strings.TrimRight(daemonURL, "/")
	return &builder{opts: o, hub: &hub{followers: map[string]*follower{}, start: func(ctx context.Context, t target, f *follower) {
		h := &homeFirst{f: f}
		var wg gosync.WaitGroup
		wg.Go(func() { followRemoteHome(ctx, base, t, side{h, true}, o) })
		followRemote(ctx, base, t, side{h, false}, "", o)
		wg.Wait()
	}}}
}

// errGone ends a stream whose target left the daemon's config.
var errGone = errors.New("the index or chain was removed from the daemon's config")

// followRemoteHome asks the daemon for its home cluster (GET
// /v1/clusters, again after a backoff while it cannot), and follows the
// home's part of the target until ctx ends; a daemon that reads one
// cluster, or none marked home, gives no part (the whole answer is used).
func followRemoteHome(ctx context.Context, base string, t target, s sink, o options) {
	for delay := 500 * time.Millisecond; ctx.Err() == nil; delay = min(2*delay, 8*time.Second) {
		home, err := remoteHome(ctx, base, o)
		if err == nil {
			if home != "" {
				followRemote(ctx, base, t, s, home, o)
			}
			return
		}
		o.log.Debug("the daemon's clusters not read yet", "daemon", base, "error", err.Error())
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
	}
}

// remoteHome returns the name of the daemon's home cluster, "" when it
// reads one cluster or has no home.
func remoteHome(ctx context.Context, base string, o options) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/clusters", nil)
	if err != nil {
		return "", err
	}
	if o.tokenFile != "" {
		token, err := streamclient.TokenFile(o.tokenFile)()
		if err != nil {
			return "", err
		}
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := streamclient.NewClient(o.caFile, o.serverName).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound:
		// Not told (a token that may read its target only, an older
		// daemon): the whole answer, as with one cluster.
		o.log.Info("the daemon's clusters cannot be read: following the whole answer, not the home cluster's first", "daemon", base, "status", resp.Status)
		return "", nil
	default:
		return "", fmt.Errorf("GET /v1/clusters: %s", resp.Status)
	}
	var cs wire.Clusters
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&cs); err != nil {
		return "", fmt.Errorf("GET /v1/clusters: %w", err)
	}
	for _, c := range cs.Clusters {
		if c.Home {
			return c.Name, nil
		}
	}
	return "", nil
}

// followRemote follows a target's stream (of cluster's part, when
// cluster is not "") until ctx ends.
func followRemote(ctx context.Context, base string, t target, f sink, cluster string, o options) {
	log := o.log.With("target", t.String(), "daemon", base)
	so := streamclient.Options{
		Client: streamclient.NewClient(o.caFile, o.serverName),
		OnBreak: func(err error, retry time.Duration) {
			log.Warn("stream from the daemon broke; keeping the last addresses", "error", err.Error(), "retry", retry.String())
			f.fail(fmt.Errorf("metasync daemon %s: %w", base, err))
		},
	}
	if o.tokenFile != "" {
		so.Token = streamclient.TokenFile(o.tokenFile) // read again each time: tokens rotate
	}
	if o.at.Zone != "" || o.at.Node != "" || cluster != "" {
		so.Query = url.Values{}
		if cluster != "" {
			so.Query.Set("cluster", cluster)
		}
		if o.at.Zone != "" {
			so.Query.Set("zone", o.at.Zone)
		}
		if o.at.Node != "" {
			so.Query.Set("node", o.at.Node)
		}
	}
	path := base + "/v1/" + t.kind + "/" + streamclient.PathSegment(t.name) + "/keys/" + streamclient.PathSegment(t.key)
	for ctx.Err() == nil {
		err := streamclient.Follow(ctx, path, so, func(fr streamclient.Frame) error {
			switch {
			case fr.Type == wire.FrameGone:
				return errGone
			case (fr.Type == wire.FrameSnapshot || fr.Type == wire.FrameUpdate) && fr.Values != nil:
				f.publish(*fr.Values)
			}
			return nil
		})
		if err != nil { // gone: keep the addresses, and look again later
			so.OnBreak(err, 8*time.Second)
			select {
			case <-ctx.Done():
			case <-time.After(8 * time.Second):
			}
		}
	}
}
