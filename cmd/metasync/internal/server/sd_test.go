package server

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/iidp/metasync/internal/wire"
	"github.com/iidp/metasync/metasynctest"
	"github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

// staleKeyEngine answers key stale, as a cluster cut off would.
type staleKeyEngine struct {
	*msync.Inspector
	key string
}

func (e staleKeyEngine) Answers(ts ...msync.Target) []msync.Answer {
	as := e.Inspector.Answers(ts...)
	for i, t := range ts {
		if t.Key == e.key {
			as[i].Stale = true
		}
	}
	return as
}

// TestSDStaleAndUnsynced: a target group of a stale answer is labelled
// __meta_metasync_stale "true", the others not; before the index's first
// list the answer is a 503 with a JSON error and Retry-After, after it
// the groups.
func TestSDStaleAndUnsynced(t *testing.T) {
	plan, err := schema.LoadPlan("../../../../examples/appmodel/config.yaml", schema.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fake, err := metasynctest.New(plan, metasynctest.Unsynced("endpointslices"))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(staleKeyEngine{fake.Engine().Inspect(), "model1"}, slog.New(slog.DiscardHandler)))
	t.Cleanup(srv.Close)
	url := srv.URL + "/v1/sd/indexes/service-to-endpoints"

	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	var e wire.Error
	_ = json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || e.Error == "" {
		t.Errorf("before the first list: %d, Retry-After %q, error %q; want 503 with both", resp.StatusCode, resp.Header.Get("Retry-After"), e.Error)
	}

	if err := fake.Feed().Replace("endpointslices", sdSlice("a", "model1", "10.0.0.1"), sdSlice("b", "model2", "10.0.0.2")); err != nil {
		t.Fatal(err)
	}
	var groups []wire.TargetGroup
	if err := json.Unmarshal(sdGet(t, url), &groups); err != nil {
		t.Fatal(err)
	}
	if len(groups) != 2 {
		t.Fatalf("groups %+v, want model1's and model2's", groups)
	}
	for _, g := range groups {
		want := ""
		if g.Labels[labelKey] == "model1" {
			want = "true"
		}
		if got := g.Labels[labelStale]; got != want {
			t.Errorf("%s: %s %q, want %q", g.Labels[labelKey], labelStale, got, want)
		}
	}
}
