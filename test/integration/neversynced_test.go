package integration_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"

	"github.com/iidp/metasync/test/testenv"
)

// TestNeverServedIsNotCleared: a resource whose plural is misspelled was
// never served. Its log says so (not "not served any more: its keys are
// cleared"), and its index tells "not known yet" from "no values".
func TestNeverServedIsNotCleared(t *testing.T) {
	testenv.Need(t, env)
	plan, err := mschema.Compile(&mschema.Config{Resources: []mschema.Resource{{
		Name: "typo", Group: "iidp.com", Version: "v1", Resource: "appmodelz", Namespace: "default",
		Indexes: []mschema.Index{{Name: "typo-index", Key: "spec.models"}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	var logs testenv.Buffer
	e, err := msync.New(plan, env.Config, msync.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Start(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	testenv.Eventually(t, "a log line about the resource", func() string {
		if strings.Contains(logs.String(), "not served") {
			return ""
		}
		return logs.String()
	})
	time.Sleep(100 * time.Millisecond)
	out := logs.String()
	if strings.Contains(out, "not served any more") || strings.Contains(out, "cleared") {
		t.Errorf("a resource that was never served is said to be served no more:\n%s", out)
	}
	if !strings.Contains(out, "not served by the apiserver") || !strings.Contains(out, "iidp.com/v1, Resource=appmodelz") {
		t.Errorf("the log does not say that the resource is not served, naming it:\n%s", out)
	}
	if e.Inspect().IndexSynced("typo-index") || e.Ready() {
		t.Error("a resource that never listed is synced or ready")
	}
}
