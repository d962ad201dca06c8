package auth_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/iidp/metasync/cmd/metasync/internal/server"
	"github.com/iidp/metasync/test/authtest"
	"github.com/iidp/metasync/test/testenv"
)

// TestAuthExplainOfAChainNeedsItsIndexes: a caller allowed to read a
// chain, and no index, gets its answers but not their explanation, which
// shows each step's index (its keys, values and objects); a caller allowed
// every index gets both. A caller without a token, or refused a step,
// spends no one's explanations.
func TestAuthExplainOfAChainNeedsItsIndexes(t *testing.T) {
	testenv.Need(t, env)
	reader, _, _ := authtest.Identities(t, env)
	ctx := context.Background()
	const sa, role = "chain-only", "metasync-api-test-chain-only"
	if _, err := env.Kube.CoreV1().ServiceAccounts(authtest.NS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := env.Kube.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/v1/chains/model-to-addresses/*"}, Verbs: []string{"get"}}}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := env.Kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: authtest.NS}}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	authtest.WaitAllowed(t, env, sa, "/v1/chains/model-to-addresses/*")
	chainOnly := authtest.Token(t, env, sa)
	srv := guarded(t, env.Config, quietLog())
	const chain = "/v1/chains/model-to-addresses/keys/model1"
	if code, body := getWith(t, http.DefaultClient, srv.URL+chain, chainOnly); code != 200 {
		t.Fatalf("the chain: %d %s", code, body)
	}
	// Refused a step, as often as the server's budget allows and more:
	// 403 every time (never 429), and no explanation spent.
	for i := range server.ExplainBurst + 5 {
		if code, body := getWith(t, http.DefaultClient, srv.URL+chain+"?explain=true", chainOnly); code != 403 || !strings.Contains(body, "/v1/indexes/model-to-app/*") {
			t.Fatalf("its explanation %d, allowed the chain alone: %d %s", i, code, body)
		}
	}
	for range 30 { // no token: 401, and no explanation spent
		if code, _ := getWith(t, http.DefaultClient, srv.URL+chain+"?explain=true", ""); code != 401 {
			t.Fatalf("no token: %d", code)
		}
	}
	if code, body := getWith(t, http.DefaultClient, srv.URL+chain+"?explain=true", reader); code != 200 || !strings.Contains(body, `"steps":[`) {
		t.Fatalf("explained to a reader of every index: %d %s", code, body)
	}
}
