// The gRPC resolver: from a write to the resolver's UpdateState with the
// new address, timed from the same writes as write -> visible.

package main

import (
	"fmt"
	"net/url"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/resolver"

	"github.com/iidp/metasync/grpcresolver"
	msync "github.com/iidp/metasync/sync"
)

// stateTimer is the ClientConn of a resolver under test: it notes when an
// UpdateState first carries an address.
type stateTimer struct {
	resolver.ClientConn // only UpdateState and ReportError are called
	at                  atomic.Pointer[time.Time]
}

func (c *stateTimer) UpdateState(s resolver.State) error {
	now := time.Now()
	if len(s.Addresses) > 0 && len(s.Endpoints) > 0 {
		c.at.CompareAndSwap(nil, &now)
	}
	return nil
}

func (c *stateTimer) ReportError(error) {}

// resolverProbe builds, before each write, an in-process resolver of the
// key about to be written (metasync:///indexes/model-to-app/KEY?port=1:
// each app name becomes the address name:1) and notes when its
// UpdateState first holds an address.
func resolverProbe(e *msync.Engine) probe {
	builder := grpcresolver.NewBuilder(e, grpcresolver.WithLogger(quiet))
	var cc *stateTimer
	var r resolver.Resolver
	return probe{
		prepare: func(m string) error {
			u, err := url.Parse("metasync:///indexes/model-to-app/" + url.PathEscape(m) + "?port=1")
			if err != nil {
				return err
			}
			cc = &stateTimer{}
			r, err = builder.Build(resolver.Target{URL: *u}, cc, resolver.BuildOptions{})
			if err != nil {
				return fmt.Errorf("resolver of %s: %w", m, err)
			}
			return nil
		},
		seen: func(string) (time.Time, bool) {
			if at := cc.at.Load(); at != nil {
				return *at, true
			}
			return time.Time{}, false
		},
		done: func(string) { r.Close() },
	}
}
