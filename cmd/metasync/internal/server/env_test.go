package server

import (
	"io"
	"log/slog"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/cmd/metasync/internal/auth"
	"github.com/iidp/metasync/test/testenv"
)

// The guard's own tests live beside it (package auth); here, on a
// control plane, only what the API does with a caller's identity: its
// limits per caller and /readyz?verbose.

var env *testenv.Env

func TestMain(m *testing.M) { testenv.MainLeakChecked(m, &env) }

// newGuard is NewTokenAuth, failing t on an error.
func newGuard(t *testing.T, cfg *rest.Config, log *slog.Logger) *auth.TokenAuth {
	t.Helper()
	a, err := auth.NewTokenAuth(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
