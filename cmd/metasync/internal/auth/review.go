package auth

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The reviews of TokenAuth: TokenReview and SubjectAccessReview, through
// the apiserver.

// typeMeta is the apiVersion and kind a review is sent with.
func typeMeta(apiVersion, kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: apiVersion, Kind: kind}
}

// reviewFailed counts a failed review and logs it, at most a few times
// every 10 s.
func (a *TokenAuth) reviewFailed(kind, what string, err error) error {
	a.reviews.WithLabelValues(kind, "error").Inc()
	a.failures.Add(1)
	a.failLog.Do(func() {
		a.log.Warn(what+" failed", "error", err.Error(), "failures", a.failures.Swap(0))
	})
	return errors.New("cannot review the " + kind + " now")
}

func (a *TokenAuth) authenticate(ctx context.Context, token string) (verdict, error) {
	spec := authenticationv1.TokenReviewSpec{Token: token}
	if a.audience != "" {
		spec.Audiences = []string{a.audience}
	}
	tr := &authenticationv1.TokenReview{}
	err := a.kube.Create(ctx, "/apis/authentication.k8s.io/v1/tokenreviews", &authenticationv1.TokenReview{
		TypeMeta: typeMeta("authentication.k8s.io/v1", "TokenReview"),
		Spec:     spec,
	}, tr)
	if err != nil {
		return verdict{}, a.reviewFailed("token", "token review", err)
	}
	// The apiserver answers the audiences that both the review and the
	// token name; an authenticator that knows nothing of audiences
	// answers none, and its "authenticated" says nothing of ours.
	if !tr.Status.Authenticated || (a.audience != "" && !slices.Contains(tr.Status.Audiences, a.audience)) {
		a.reviews.WithLabelValues("token", "denied").Inc()
		msg := "the token is not valid"
		if a.audience != "" {
			msg = fmt.Sprintf("the token is not valid for audience %q", a.audience)
		}
		return verdict{code: http.StatusUnauthorized, msg: msg}, nil
	}
	a.reviews.WithLabelValues("token", "ok").Inc()
	return verdict{user: tr.Status.User}, nil
}

func (a *TokenAuth) authorize(ctx context.Context, u authenticationv1.UserInfo, thing string) (verdict, error) {
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar := &authorizationv1.SubjectAccessReview{}
	err := a.kube.Create(ctx, "/apis/authorization.k8s.io/v1/subjectaccessreviews", &authorizationv1.SubjectAccessReview{
		TypeMeta: typeMeta("authorization.k8s.io/v1", "SubjectAccessReview"),
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: thing, Verb: "get"},
		},
	}, sar)
	if err != nil {
		return verdict{}, a.reviewFailed("access", "access review", err)
	}
	if !sar.Status.Allowed {
		a.reviews.WithLabelValues("access", "denied").Inc()
		return verdict{code: http.StatusForbidden, msg: fmt.Sprintf("%s may not get %s", u.Username, thing)}, nil
	}
	a.reviews.WithLabelValues("access", "ok").Inc()
	return verdict{user: u}, nil
}
