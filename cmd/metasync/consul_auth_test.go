package main_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/iidp/metasync/internal/kubeapply"
	"github.com/iidp/metasync/test/testenv"
)

// TestConsulTokenAuth: the Consul facade with --auth=tokenreview on the
// real control plane. consul/api sends its Token in X-Consul-Token: a
// ServiceAccount allowed the chain's HTTP lookups reads the service; one
// allowed only another index is refused 403 (the catalog too); no token
// is 401. A token in Authorization: Bearer reads as X-Consul-Token does.
func TestConsulTokenAuth(t *testing.T) {
	const ns, audience = "consul-auth", "metasync-consul"
	_, consulAddr, backends, _ := consulDaemon(t, ns, 1, "--auth=tokenreview", "--auth-audience", audience)
	rbac := fmt.Sprintf(`
apiVersion: v1
kind: ServiceAccount
metadata: {name: chain-reader, namespace: %[1]s}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: index-reader, namespace: %[1]s}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: metasync-consul-chain}
rules:
- nonResourceURLs: ["/v1/chains/model-to-endpoints/*"]
  verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: metasync-consul-index}
rules:
- nonResourceURLs: ["/v1/indexes/model-to-app/*"]
  verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: metasync-consul-chain}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: metasync-consul-chain}
subjects:
- {kind: ServiceAccount, name: chain-reader, namespace: %[1]s}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: metasync-consul-index}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: metasync-consul-index}
subjects:
- {kind: ServiceAccount, name: index-reader, namespace: %[1]s}
`, ns)
	path := filepath.Join(t.TempDir(), "rbac.yaml")
	_ = os.WriteFile(path, []byte(rbac), 0o600)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := kubeapply.Files(ctx, env.Config, path); err != nil {
		t.Fatal(err)
	}
	chainToken, indexToken := saToken(t, ns, "chain-reader", audience), saToken(t, ns, "index-reader", audience)
	clientOf := func(token string) *consulapi.Client {
		c, err := consulapi.NewClient(&consulapi.Config{Address: consulAddr, Token: token})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	testenv.Eventually(t, "the chain's reader reads the service", func() string {
		entries, _, err := clientOf(chainToken).Health().Service("xds-model", "", true, nil)
		if err != nil {
			return err.Error()
		}
		if got := addrsOf(entries); len(got) != 1 || got[0] != backends[0] {
			return fmt.Sprint(got)
		}
		return ""
	})
	if s, _, err := clientOf(chainToken).Catalog().Services(nil); err != nil || len(s) != 1 {
		t.Errorf("the chain's reader's catalog: %v %v", s, err)
	}
	if _, err := clientOf(chainToken).Agent().Self(); err != nil {
		t.Errorf("agent/self with a valid token: %v", err)
	}
	if _, _, err := clientOf(indexToken).Health().Service("xds-model", "", true, nil); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("the index's reader reads the chain's service: %v, want 403", err)
	}
	if _, _, err := clientOf(indexToken).Catalog().Services(nil); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("the index's reader lists the chain's services: %v, want 403", err)
	}
	if _, _, err := clientOf("").Health().Service("xds-model", "", true, nil); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("no token: %v, want 401", err)
	}
	if _, err := clientOf("").Agent().Self(); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("agent/self without a token: %v, want 401", err)
	}
	// A refused token closes its connection: a caller without a token
	// that may read holds none kept alive.
	for token, code := range map[string]int{"": 401, indexToken: 403} {
		req, _ := http.NewRequest("GET", "http://"+consulAddr+"/v1/health/service/xds-model", nil)
		req.Header.Set("X-Consul-Token", token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != code || !resp.Close {
			t.Errorf("refused %d (Connection: %q), want %d and the connection closed", resp.StatusCode, resp.Header.Get("Connection"), code)
		}
	}
	req, _ := http.NewRequest("GET", "http://"+consulAddr+"/v1/health/service/xds-model", nil)
	req.Header.Set("Authorization", "Bearer "+chainToken)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Errorf("Authorization: Bearer: %v %v, want 200", resp, err)
	}
}
