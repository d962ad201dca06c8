package auth

import (
	"context"
	"encoding/json"
	"net/http"

	authenticationv1 "k8s.io/api/authentication/v1"

	"github.com/iidp/metasync/internal/wire"
)

// Caller is who the guard found an authorized request to come from, and
// how to ask again on its behalf. Wrap puts it in the request's context
// (WithCaller); the handlers behind it read it there (CallerFrom), as the
// apiserver's handlers read request.UserFrom.
type Caller struct {
	// Name names the caller for the per-caller limits (see CallerName).
	Name string
	// Recheck authorizes the request again, from the same caches as the
	// first check: 0, or the HTTP status that would refuse it now. A
	// change stream calls it as it goes.
	Recheck func() int
	// MayGet asks whether the caller may get thing too (a non-resource
	// URL as in the table of TokenAuth): code 0, or the status that
	// refuses it and why. An explained chain asks it of each step.
	MayGet func(thing string) (code int, msg string)
}

type callerKey struct{}

// WithCaller returns a copy of parent that carries c.
func WithCaller(parent context.Context, c Caller) context.Context {
	return context.WithValue(parent, callerKey{}, c)
}

// CallerFrom returns the Caller that ctx carries, and whether it carries
// one (it does not without the guard).
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

type withheldKey struct{}

// WithWithheld returns a copy of parent that carries why the guard took
// ?verbose away from a /readyz request.
func WithWithheld(parent context.Context, why string) context.Context {
	return context.WithValue(parent, withheldKey{}, why)
}

// WithheldFrom returns why the guard took ?verbose away from the request
// of ctx, or "".
func WithheldFrom(ctx context.Context) string {
	s, _ := ctx.Value(withheldKey{}).(string)
	return s
}

// CallerName names an authenticated caller for the per-caller limits:
// its user name and, for a service account token bound to a pod, the
// pod: the pods of one Deployment share their account, not their limit.
// The other extras (a token's credential id among them) are left out: one
// caller cannot multiply its limit by asking for more tokens.
func CallerName(u authenticationv1.UserInfo) string {
	name := "user:" + u.Username
	if pod := u.Extra["authentication.kubernetes.io/pod-uid"]; len(pod) > 0 {
		name += "\x00pod:" + pod[0]
	}
	return name
}

// writeError answers code with the API's error body (wire.Error).
func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(wire.Error{Error: msg})
}
