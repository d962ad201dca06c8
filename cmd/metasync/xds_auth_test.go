package main_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/iidp/metasync/internal/kubeapply"
	"github.com/iidp/metasync/test/testenv"
)

// xdsCallerEnv, in the environment of this test binary, makes it an xDS
// caller rather than a test run: grpc-go reads whether bootstrap call
// credentials are on (GRPC_EXPERIMENTAL_XDS_BOOTSTRAP_CALL_CREDS) when
// it starts, so a caller that sends its token runs as a process of its
// own, with GRPC_XDS_BOOTSTRAP naming its bootstrap.
const xdsCallerEnv = "METASYNC_TEST_XDS_CALLER"

// xdsCallerResult is what a caller process prints: calls by backend
// ("error CODE: message" for a failed one).
type xdsCallerResult map[string]int

// xdsCaller calls the health service at xds:///TARGET (the value of
// xdsCallerEnv) every 100 ms until a call succeeds or
// METASYNC_TEST_XDS_FOR (a duration) passes, and prints what it got as
// JSON; with xdsCallerModeEnv "continuous", xdsCallerContinuous instead.
// It is the body of a caller process (see TestMain).
func xdsCaller() int {
	if os.Getenv(xdsCallerModeEnv) == "continuous" {
		return xdsCallerContinuous()
	}
	d, err := time.ParseDuration(os.Getenv("METASYNC_TEST_XDS_FOR"))
	if err != nil {
		d = 20 * time.Second
	}
	conn, err := grpc.NewClient("xds:///"+os.Getenv(xdsCallerEnv), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Println(`{"error ` + strings.ReplaceAll(err.Error(), `"`, `'`) + `":1}`)
		return 0
	}
	defer conn.Close()
	got := xdsCallerResult{}
	h := healthpb.NewHealthClient(conn)
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		var p peer.Peer
		_, err := h.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
		cancel()
		if err == nil {
			got[p.Addr.String()]++
			break
		}
		msg := status.Convert(err).Message()
		if len(msg) > 120 {
			msg = msg[:120]
		}
		got["error "+status.Code(err).String()+": "+msg]++
	}
	b, _ := json.Marshal(got)
	fmt.Println(string(b))
	return 0
}

// xdsCallerCommand is the command of a caller process of target with
// bootstrap, for at most d, with extra environment.
func xdsCallerCommand(t *testing.T, bootstrap, target string, d time.Duration, extra ...string) *exec.Cmd {
	t.Helper()
	path := filepath.Join(t.TempDir(), "bootstrap.json")
	if err := os.WriteFile(path, []byte(bootstrap), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), xdsCallerEnv+"="+target, "METASYNC_TEST_XDS_FOR="+d.String(),
		"GRPC_XDS_BOOTSTRAP="+path, "GRPC_EXPERIMENTAL_XDS_BOOTSTRAP_CALL_CREDS=true")
	cmd.Env = append(cmd.Env, extra...)
	return cmd
}

// callXDS runs a caller process of target with bootstrap, for at most
// d, and returns what it got.
func callXDS(t *testing.T, bootstrap, target string, d time.Duration) xdsCallerResult {
	t.Helper()
	out, err := xdsCallerCommand(t, bootstrap, target, d).Output()
	if err != nil {
		t.Fatalf("xDS caller: %v\n%s", err, out)
	}
	got := xdsCallerResult{}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("xDS caller printed %q: %v", out, err)
	}
	return got
}

// saToken is a token of the ServiceAccount ns/sa for audience.
func saToken(t *testing.T, ns, sa, audience string) string {
	t.Helper()
	tr, err := env.Kube.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{audience}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// TestXDSTokenAuth: `serve --xds-listen` beyond loopback with
// --auth=tokenreview and TLS, on the real control plane, and grpc-go's
// own xDS client whose bootstrap gives TLS channel credentials (the
// test's CA) and its ServiceAccount token as call credentials
// (jwt_token_file). A client allowed the chain's HTTP lookup calls the
// model's pod; one allowed only another index gets no Listener and its
// calls fail; one without a token is refused. Without --auth, or with
// --auth=tokenreview but no TLS, serve refuses such an address.
func TestXDSTokenAuth(t *testing.T) {
	testenv.Need(t, env)
	ip := localIPv4()
	if ip == "" {
		t.Skip("no IPv4 address but loopback: an EndpointSlice may not point at 127.0.0.1, nor can xDS listen beyond loopback")
	}
	const ns, audience = "xds-auth", "metasync-xds"
	backends, config := xdsFixture(t, ns, ip, 1)
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
metadata: {name: metasync-xds-chain}
rules:
- nonResourceURLs: ["/v1/chains/model-to-endpoints/*"]
  verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: metasync-xds-index}
rules:
- nonResourceURLs: ["/v1/indexes/model-to-app/*"]
  verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: metasync-xds-chain}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: metasync-xds-chain}
subjects:
- {kind: ServiceAccount, name: chain-reader, namespace: %[1]s}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: metasync-xds-index}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: metasync-xds-index}
subjects:
- {kind: ServiceAccount, name: index-reader, namespace: %[1]s}
`, ns)
	dir := t.TempDir()
	rbacFile := filepath.Join(dir, "rbac.yaml")
	_ = os.WriteFile(rbacFile, []byte(rbac), 0o600)
	if err := kubeapply.Files(context.Background(), env.Config, rbacFile); err != nil {
		t.Fatal(err)
	}

	ca := testenv.NewCA(t, "metasync-xds-ca")
	caFile := ca.WriteCA(t, dir, "ca.crt")
	certPEM, keyPEM, _ := ca.Issue(t, "metasync.test", "127.0.0.1", ip)
	vol := testenv.NewSecretVolume(t, certPEM, keyPEM)
	_, freePort, _ := net.SplitHostPort(testenv.FreeAddr(t))
	xdsAddr := net.JoinHostPort(ip, freePort)
	addr := testenv.FreeAddr(t)
	kubeconfig := env.WriteKubeconfig(t, "")

	// Beyond loopback, xDS needs --auth, and tokens need TLS.
	for name, extra := range map[string][]string{
		"no --auth":               nil,
		"tokenreview without TLS": {"--auth", "tokenreview"},
	} {
		_, errOut, code := metasync(t, append([]string{"serve", "--config", config, "--kubeconfig", kubeconfig, "--listen", addr, "--xds-listen", xdsAddr}, extra...)...)
		if code != 2 || !strings.Contains(errOut, "--xds-listen") {
			t.Errorf("serve --xds-listen %s with %s: exit %d, want 2 and why\n%s", xdsAddr, name, code, errOut)
		}
	}

	d := start(t, nil, "--config", config, "--kubeconfig", kubeconfig, "--listen", addr, "--xds-listen", xdsAddr,
		"--auth", "tokenreview", "--auth-audience", audience, "--tls-cert-file", vol.Cert(), "--tls-private-key-file", vol.Key())
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM)
	waitHTTPS(t, d, addr, httpsClient(pool))

	bootstrap := func(tokenFile string) string {
		creds := ""
		if tokenFile != "" {
			creds = fmt.Sprintf(`,"call_creds":[{"type":"jwt_token_file","config":{"jwt_token_file":%q}}]`, tokenFile)
		}
		return fmt.Sprintf(`{"xds_servers":[{"server_uri":%q,"channel_creds":[{"type":"tls","config":{"ca_certificate_file":%q}}]%s,"server_features":["xds_v3"]}],"node":{"id":"auth-e2e"}}`,
			xdsAddr, caFile, creds)
	}
	tokenFile := func(sa string) string {
		path := filepath.Join(dir, sa+".token")
		_ = os.WriteFile(path, []byte(saToken(t, ns, sa, audience)), 0o600)
		return path
	}
	target := "chains/model-to-endpoints/xds-model"
	if got := callXDS(t, bootstrap(tokenFile("chain-reader")), target, 30*time.Second); got[backends[0]] != 1 {
		t.Errorf("a client allowed the chain: %v, want a call to %s", got, backends[0])
	}
	// The client without a token first: its refusals must not use up the
	// log lines of the denied target that follows.
	for _, c := range []struct{ name, boot string }{
		{"a client without a token", bootstrap("")},
		{"a client allowed another index only", bootstrap(tokenFile("index-reader"))},
	} {
		name, boot := c.name, c.boot
		// 12 s: a client process on a loaded machine (the whole suite,
		// -race) may take several seconds to bootstrap, handshake and ask;
		// 5 s missed the denial's log line once in a few runs.
		got := callXDS(t, boot, target, 12*time.Second)
		if got[backends[0]] != 0 || len(got) == 0 {
			t.Errorf("%s: %v, want only failed calls", name, got)
		}
		t.Logf("%s: %v", name, got)
	}
	if !strings.Contains(d.stderr.String(), "xDS client may not read a target") {
		t.Errorf("no log line of the denied target:\n%s", d.stderr)
	}
}
