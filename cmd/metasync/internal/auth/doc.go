// Package auth is the daemon's guard: Kubernetes bearer tokens checked by
// TokenReview and SubjectAccessReview, for the HTTP API (TokenAuth.Wrap)
// and the xDS server (TokenAuth.Check).
//
// The files follow its parts: guard.go the filter and what a request asks
// access to, review.go the two reviews, cache.go the verdicts' caches,
// gates and single flight, context.go what the guard tells the handlers
// behind it (WithCaller and CallerFrom, in the style of the apiserver's
// request.WithUser and request.UserFrom).
package auth
