package grpcresolver

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
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
// longer than 4 MiB (streamclient.DefaultMaxFrame) breaks the stream as
// well: what a stream reads into memory is bounded, whatever answers at
// daemonURL.
func NewRemoteBuilder(daemonURL string, opts ...Option) resolver.Builder {
	o := newOptions(opts)
	base := strings.TrimRight(daemonURL, "/")
	return &builder{opts: o, hub: &hub{followers: map[string]*follower{}, start: func(ctx context.Context, t target, f *follower) {
		followRemote(ctx, base, t, f, o)
	}}}
}

// errGone ends a stream whose target left the daemon's config.
var errGone = errors.New("the index or chain was removed from the daemon's config")

// followRemote follows a target's stream until ctx ends.
func followRemote(ctx context.Context, base string, t target, f *follower, o options) {
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
	if o.at.Zone != "" || o.at.Node != "" {
		so.Query = url.Values{}
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
