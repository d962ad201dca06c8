package server

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestInvalidUTF8KeyRefused: a key that is not valid UTF-8 gets 400 with
// a JSON error naming the problem, on every route that takes a key, for a
// lookup and a stream alike; never an answer that echoes it with U+FFFD,
// which names another key. The key that does hold U+FFFD answers its own
// values.
func TestInvalidUTF8KeyRefused(t *testing.T) {
	s := fedServer(t, map[string][]string{"other": {"\uFFFD"}})
	for _, target := range []string{
		"/v1/indexes/model-to-app/keys/%FF",
		"/v1/indexes/model-to-app/keys/%FF?watch=true",
		"/v1/indexes/model-to-app/keys/a%C3",
		"/v1/indexes/model-to-app/keys/a/%80b",
		"/v1/chains/model-to-addresses/keys/%FF",
		"/v1/chains/model-to-addresses/keys/%FF?watch=true",
		"/v1/chains/model-to-addresses/keys/%ED%A0%80", // a surrogate half
	} {
		// A stream that were served would last until the context ends.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest("GET", target, nil).WithContext(ctx))
		cancel()
		var body struct {
			Error string `json:"error"`
		}
		if rec.Code != 400 || rec.Header().Get("Content-Type") != "application/json" ||
			json.Unmarshal(rec.Body.Bytes(), &body) != nil || !strings.Contains(body.Error, "not valid UTF-8") {
			t.Errorf("GET %s = %d %q %s, want 400 with a JSON error naming invalid UTF-8", target, rec.Code, rec.Header().Get("Content-Type"), rec.Body)
		}
		if strings.Contains(rec.Body.String(), "\uFFFD") || strings.Contains(rec.Body.String(), `\ufffd`) {
			t.Errorf("GET %s: the answer holds U+FFFD: %s", target, rec.Body)
		}
	}
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/indexes/model-to-app/keys/%EF%BF%BD", nil))
	if got := strings.TrimSpace(rec.Body.String()); rec.Code != 200 || got != `{"index":"model-to-app","key":"`+"\uFFFD"+`","values":["other"]}` {
		t.Errorf("the key U+FFFD: %d %s", rec.Code, got)
	}
}
