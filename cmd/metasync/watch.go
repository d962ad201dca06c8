package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/iidp/metasync/internal/streamclient"
	"github.com/iidp/metasync/internal/wire"
)

// watchContext ends on Ctrl-C or SIGTERM.
func watchContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// errGone ends a stream whose index or chain left the daemon's config.
var errGone = errors.New("the index or chain was removed from the daemon's config")

// follow prints the answers of a change stream (path, without ?watch), one
// JSON line each (the stream's snapshot, synced, update, reset and gone
// frames: a synced frame says that the values before it are now known), until
// ctx ends. A broken stream is resumed with the last version, after a
// backoff; the daemon then sends only what changed, or a reset and a
// fresh snapshot.
func (c *client) follow(ctx context.Context, path string, stdout, stderr io.Writer) error {
	err := streamclient.Follow(ctx, c.base+path, streamclient.Options{
		Client:        c.stream, // no Timeout: a stream lasts
		Token:         c.token,
		StopOnRefusal: true,
		Query:         c.query,
		OnBreak: func(err error, retry time.Duration) {
			fmt.Fprintf(stderr, "metasync get: stream from %s broke (%v); resuming in %v\n", c.base, err, retry)
		},
	}, func(f streamclient.Frame) error {
		switch f.Type {
		case wire.FrameSnapshot, wire.FrameSynced, wire.FrameUpdate, wire.FrameReset, wire.FrameGone:
			if _, err := fmt.Fprintf(stdout, "%s\n", f.Raw); err != nil {
				return err
			}
		}
		if f.Type == wire.FrameGone {
			return errGone
		}
		return nil
	})
	if err != nil {
		fmt.Fprintf(stderr, "metasync get: %v\n", err)
		return exitError{1}
	}
	return nil
}
