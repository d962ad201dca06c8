package main_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	gosync "sync"
	"testing"
	"time"

	"google.golang.org/grpc/resolver"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/iidp/metasync/grpcresolver"
	"github.com/iidp/metasync/internal/kubeapply"
	"github.com/iidp/metasync/test/testenv"
)

const (
	tlsNS       = "tls-test"
	tlsAudience = "metasync-e2e"
)

var tlsAppModels = schema.GroupVersionResource{Group: "iidp.com", Version: "v1", Resource: "appmodels"}

// tlsCallers creates, in tlsNS, the ServiceAccount reader, allowed to get
// /v1/* and /metrics.
func tlsCallers(t *testing.T) {
	t.Helper()
	env.Namespace(t, tlsNS)
	rbac := fmt.Sprintf(`
apiVersion: v1
kind: ServiceAccount
metadata: {name: reader, namespace: %[1]s}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: metasync-client-tls-test}
rules:
- nonResourceURLs: ["/v1/*", "/metrics"]
  verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: metasync-client-tls-test}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: metasync-client-tls-test}
subjects:
- {kind: ServiceAccount, name: reader, namespace: %[1]s}
`, tlsNS)
	path := filepath.Join(t.TempDir(), "rbac.yaml")
	_ = os.WriteFile(path, []byte(rbac), 0o600)
	if err := kubeapply.Files(context.Background(), env.Config, path); err != nil {
		t.Fatal(err)
	}
}

// readerToken is a token of tlsNS's reader for audience ("": the
// apiserver's own), bound to the Secret named bound if not "" (deleting
// it revokes the token).
func readerToken(t *testing.T, audience, bound string) string {
	t.Helper()
	ctx := context.Background()
	req := &authenticationv1.TokenRequest{}
	if audience != "" {
		req.Spec.Audiences = []string{audience}
	}
	if bound != "" {
		s, err := env.Kube.CoreV1().Secrets(tlsNS).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: bound}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Secret", APIVersion: "v1", Name: s.Name, UID: s.UID}
	}
	tr, err := env.Kube.CoreV1().ServiceAccounts(tlsNS).CreateToken(ctx, "reader", req, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// httpsClient trusts the CA of pool.
func httpsClient(pool *x509.CertPool) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
}

// waitHTTPS waits until addr answers /livez over TLS.
func waitHTTPS(t *testing.T, d *daemon, addr string, client *http.Client) {
	t.Helper()
	testenv.Eventually(t, "metasync serve answers HTTPS on "+addr, func() string {
		select {
		case <-d.done:
			t.Fatalf("metasync serve exited: %v\n%s", d.err, d.stderr)
		default:
		}
		resp, err := client.Get("https://" + addr + "/livez")
		if err != nil {
			return err.Error()
		}
		resp.Body.Close()
		return ""
	})
}

// TestServeTLSAndAudience: serve with --auth-audience and TLS on a real
// control plane. Plain HTTP gets no answer of the API; a token for the
// apiserver's audience is refused with 401, one for the audience gets
// 200; the CLI (lookup and --watch) and the remote gRPC resolver ask over
// TLS with a CA file and a token file; a watch whose token is revoked
// reconnects with the token file's new token and goes on; a rotated
// certificate is served without a restart, a broken one is not (the last
// good one is).
func TestServeTLSAndAudience(t *testing.T) {
	testenv.Need(t, env)
	setupCluster(t)
	tlsCallers(t)
	dir := t.TempDir()
	ca := testenv.NewCA(t, "metasync-test-ca")
	caFile := ca.WriteCA(t, dir, "ca.crt")
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM)
	certPEM, keyPEM, serial1 := ca.Issue(t, "metasync.test", "127.0.0.1")
	vol := testenv.NewSecretVolume(t, certPEM, keyPEM)

	addr := testenv.FreeAddr(t)
	d := start(t, nil, "--config", writeConfig(t, addr), "--kubeconfig", env.WriteKubeconfig(t, ""), "--stream-heartbeat", "500ms",
		"--auth", "tokenreview", "--auth-audience", tlsAudience, "--tls-cert-file", vol.Cert(), "--tls-private-key-file", vol.Key())
	client := httpsClient(pool)
	waitHTTPS(t, d, addr, client)
	base := "https://" + addr

	// Nothing of the API in cleartext.
	if resp, err := http.Get("http://" + addr + "/livez"); err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "HTTPS") {
			t.Fatalf("plain HTTP: %d %s, want 400 (an HTTPS server)", resp.StatusCode, body)
		}
	}

	get := func(path, token string) (int, string) {
		req, _ := http.NewRequest("GET", base+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	lookup := "/v1/indexes/model-to-app/keys/model1"
	clusterToken := readerToken(t, "", "")
	if code, body := get(lookup, clusterToken); code != 401 || !strings.Contains(body, `not valid for audience \"metasync-e2e\"`) {
		t.Fatalf("a token for the apiserver's audience: %d %s, want 401", code, body)
	}
	token := readerToken(t, tlsAudience, "")
	testenv.Eventually(t, "a token for the audience gets the answer", func() string {
		if code, body := get(lookup, token); code != 200 || !strings.Contains(body, `"values":["base"]`) {
			return fmt.Sprintf("%d %s", code, body)
		}
		return ""
	})

	// The CLI: a CA file and a token file.
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tlsCLI(t, base, addr, dir, caFile, tokenFile, clusterToken)
	tlsRevokedWatch(t, d, base, dir, caFile)

	// The remote gRPC resolver: a CA file and a token file.
	target, _ := url.Parse("metasync:///chains/model-to-addresses/model1?port=9000")
	quiet := slog.New(slog.DiscardHandler)
	cc := &stateRecorder{}
	r, err := grpcresolver.NewRemoteBuilder(base, grpcresolver.WithCAFile(caFile), grpcresolver.WithTokenFile(tokenFile), grpcresolver.WithLogger(quiet)).
		Build(resolver.Target{URL: *target}, cc, resolver.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	testenv.Eventually(t, "the resolver resolves over TLS", func() string {
		if got := cc.addresses(); !slices.Equal(got, []string{"10.0.0.5:9000", "10.0.0.6:9000"}) {
			return fmt.Sprintf("%v (error %v)", got, cc.lastError())
		}
		return ""
	})
	untrusting := &stateRecorder{}
	r2, err := grpcresolver.NewRemoteBuilder(base, grpcresolver.WithTokenFile(tokenFile), grpcresolver.WithLogger(quiet)).
		Build(resolver.Target{URL: *target}, untrusting, resolver.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	testenv.Eventually(t, "a resolver without the CA file refuses the daemon's certificate", func() string {
		var unknown x509.UnknownAuthorityError
		if err := untrusting.lastError(); err == nil || !errors.As(err, &unknown) && !strings.Contains(err.Error(), "certificate signed by unknown authority") {
			return fmt.Sprint(err)
		}
		return ""
	})
	if got := untrusting.addresses(); len(got) != 0 {
		t.Fatalf("a resolver that cannot verify the daemon published %v", got)
	}

	tlsRotation(t, d, addr, pool, ca, vol, serial1)
	if code, body := get("/metrics", token); code != 200 || !strings.Contains(body, "metasync_tls_certificate_not_after_timestamp_seconds ") {
		t.Errorf("/metrics: %d, no expiry of the served certificate", code)
	}
	select {
	case <-d.done:
		t.Fatalf("the daemon exited: %v", d.err)
	default:
	}
}

// tlsCLI: the CLI asks the daemon at base (and addr) over TLS with a CA
// file and a token file; without the CA file, for another server name,
// without a token or with one for the apiserver's audience, it fails; a CA
// file with an http:// server is a usage error.
func tlsCLI(t *testing.T, base, addr, dir, caFile, tokenFile, clusterToken string) {
	out, errOut, code := metasync(t, "get", "--server", base, "--ca-file", caFile, "--token-file", tokenFile, "model-to-app", "model1")
	if code != 0 || out != "base\n" {
		t.Fatalf("get over TLS: exit %d, %q %s", code, out, errOut)
	}
	out, errOut, code = metasync(t, "indexes", "--server", "https://127.0.0.1:"+port(addr), "--tls-server-name", "metasync.test", "--ca-file", caFile, "--token-file", tokenFile)
	if code != 0 || !strings.Contains(out, "model-to-app") {
		t.Fatalf("indexes over TLS, the certificate checked for metasync.test: exit %d, %q %s", code, out, errOut)
	}
	for name, args := range map[string][]string{
		"no CA file":               {"--token-file", tokenFile},
		"another server name":      {"--ca-file", caFile, "--token-file", tokenFile, "--tls-server-name", "other.test"},
		"no token":                 {"--ca-file", caFile},
		"the apiserver's audience": {"--ca-file", caFile, "--token-file", writeFile(t, dir, "cluster-token", clusterToken)},
	} {
		if _, errOut, code := metasync(t, append(append([]string{"get", "--server", base}, args...), "model-to-app", "model1")...); code == 0 {
			t.Errorf("get with %s: exit 0, want a failure (%s)", name, errOut)
		}
	}
	if _, errOut, code := metasync(t, "get", "--server", "http://"+addr, "--ca-file", caFile, "model-to-app", "model1"); code != 2 || !strings.Contains(errOut, "need an https:// --server") {
		t.Errorf("--ca-file with http://: exit %d %s, want 2", code, errOut)
	}
}

// tlsRevokedWatch: a watch whose token is revoked; the daemon d ends its
// stream (401 at a re-check), and the CLI reconnects with the token file's
// new token and goes on.
func tlsRevokedWatch(t *testing.T, d *daemon, base, dir, caFile string) {
	revocable := readerToken(t, tlsAudience, "first-token")
	watchToken := writeFile(t, dir, "watch-token", revocable)
	lines := followCLI(t, "--server", base, "--ca-file", caFile, "--token-file", watchToken, "model-to-app", "model1")
	testenv.Eventually(t, "the watch over TLS prints the snapshot", func() string {
		if l := lines(); len(l) == 0 || !strings.Contains(l[0], `"type":"snapshot"`) || !strings.Contains(l[0], `"values":["base"]`) {
			return fmt.Sprint(l)
		}
		return ""
	})
	writeFile(t, dir, "watch-token", readerToken(t, tlsAudience, ""))
	if err := env.Kube.CoreV1().Secrets(tlsNS).Delete(context.Background(), "first-token", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the daemon ends the stream of the revoked token", func() string {
		if !strings.Contains(d.stderr.String(), "stream ended: the caller is no longer authorized") {
			return "not yet"
		}
		return ""
	})
	apply := func(manifest string) {
		t.Helper()
		path := writeFile(t, t.TempDir(), "objects.yaml", manifest)
		if err := kubeapply.Files(context.Background(), env.Config, path); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { // the e2e namespace as the other tests know it
		_ = env.Dynamic.Resource(tlsAppModels).Namespace("e2e").Delete(context.Background(), "also", metav1.DeleteOptions{})
	})
	apply(`
apiVersion: iidp.com/v1
kind: AppModel
metadata: {name: also, namespace: e2e, labels: {iidp: iidp}}
spec: {type: model, version: "1", models: [model1]}
`)
	testenv.Eventually(t, "the watch goes on with the new token", func() string {
		l := lines()
		if len(l) < 2 || !strings.Contains(l[len(l)-1], `"values":["also","base"]`) {
			return fmt.Sprint(l)
		}
		return ""
	})
}

// tlsRotation: the certificate of d, at addr, rotates in place: new
// connections get the new one. A pair that does not match is logged and
// the last good one stays; a good pair after it is served.
func tlsRotation(t *testing.T, d *daemon, addr string, pool *x509.CertPool, ca *testenv.CA, vol *testenv.SecretVolume, serial1 *big.Int) {
	served := func() *big.Int {
		s, err := testenv.ServedSerial(addr, "127.0.0.1", pool)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if s := served(); s.Cmp(serial1) != 0 {
		t.Fatalf("served serial %v, want %v", s, serial1)
	}
	certPEM, keyPEM, serial2 := ca.Issue(t, "metasync.test", "127.0.0.1")
	vol.Update(t, certPEM, keyPEM)
	testenv.Eventually(t, "the rotated certificate is served", func() string {
		if s := served(); s.Cmp(serial2) != 0 {
			return "serial " + s.String()
		}
		return ""
	})
	// A pair that does not match: the last good one stays.
	badCert, _, _ := ca.Issue(t, "metasync.test", "127.0.0.1")
	_, otherKey, _ := ca.Issue(t, "metasync.test", "127.0.0.1")
	vol.Update(t, badCert, otherKey)
	testenv.Eventually(t, "the broken pair is logged", func() string {
		_ = served()
		if !strings.Contains(d.stderr.String(), "TLS certificate not reloaded: serving the last good one") {
			return "not yet"
		}
		return ""
	})
	for range 5 {
		if s := served(); s.Cmp(serial2) != 0 {
			t.Fatalf("after a broken pair: serial %v, want the last good %v", s, serial2)
		}
		time.Sleep(300 * time.Millisecond)
	}
	certPEM, keyPEM, serial3 := ca.Issue(t, "metasync.test", "127.0.0.1")
	vol.Update(t, certPEM, keyPEM)
	testenv.Eventually(t, "a good pair after the broken one is served", func() string {
		if s := served(); s.Cmp(serial3) != 0 {
			return "serial " + s.String()
		}
		return ""
	})
	// The log line is copied from the daemon's stderr by a goroutine of
	// this process: it may arrive just after the handshake that served
	// the new certificate.
	testenv.Eventually(t, "2 reloads logged", func() string {
		if n := strings.Count(d.stderr.String(), "TLS certificate reloaded"); n != 2 {
			return fmt.Sprintf("%d reloads logged", n)
		}
		return ""
	})
}

// TestServeRefusesPlaintextAuthBeyondLoopback: --auth=tokenreview beyond
// loopback needs TLS or --insecure-plaintext-auth; the refusal names the
// flags; contradictory or half flags are refused too.
func TestServeRefusesPlaintextAuthBeyondLoopback(t *testing.T) {
	testenv.Need(t, env)
	kubeconfig := env.WriteKubeconfig(t, "")
	// A port free on every address: one free on 127.0.0.1 may be bound
	// on another (a test's listener on this machine's own address).
	anyAddr := func() string {
		ln, err := net.Listen("tcp", "0.0.0.0:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return "0.0.0.0:" + port(ln.Addr().String())
	}
	dir := t.TempDir()
	ca := testenv.NewCA(t, "metasync-test-ca")
	certPEM, keyPEM, _ := ca.Issue(t, "127.0.0.1")
	certFile, keyFile := writeFile(t, dir, "tls.crt", string(certPEM)), writeFile(t, dir, "tls.key", string(keyPEM))

	_, errOut, code := metasync(t, "serve", "--config", writeConfig(t, anyAddr()), "--kubeconfig", kubeconfig, "--auth", "tokenreview")
	if code != 1 || !strings.Contains(errOut, "--auth=tokenreview beyond loopback needs TLS (--tls-cert-file and --tls-private-key-file), or --insecure-plaintext-auth") {
		t.Fatalf("tokenreview beyond loopback over plain HTTP: exit %d\n%s", code, errOut)
	}
	for name, c := range map[string]struct {
		args []string
		code int
		want string
	}{
		"a certificate without its key":       {[]string{"--auth", "tokenreview", "--tls-cert-file", certFile}, 2, "--tls-cert-file and --tls-private-key-file go together"},
		"TLS and the plaintext opt-out":       {[]string{"--auth", "tokenreview", "--tls-cert-file", certFile, "--tls-private-key-file", keyFile, "--insecure-plaintext-auth"}, 1, "choose one"},
		"an audience without tokenreview":     {[]string{"--auth", "none", "--auth-audience", "x"}, 1, "go with --auth=tokenreview"},
		"a key that is not the certificate's": {[]string{"--auth", "tokenreview", "--tls-cert-file", certFile, "--tls-private-key-file", writeFile(t, dir, "other.key", string(otherKey(t, ca)))}, 2, "private key does not match public key"},
	} {
		_, errOut, code := metasync(t, append([]string{"serve", "--config", writeConfig(t, anyAddr()), "--kubeconfig", kubeconfig}, c.args...)...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: exit %d, want %d with %q\n%s", name, code, c.code, c.want, errOut)
		}
	}

	// The opt-out, and TLS: both start.
	addr := anyAddr()
	d := start(t, nil, "--config", writeConfig(t, addr), "--kubeconfig", kubeconfig, "--auth", "tokenreview", "--insecure-plaintext-auth")
	waitHTTP(t, d, "127.0.0.1:"+port(addr))
	if !strings.Contains(d.stderr.String(), "cross the network in cleartext") {
		t.Errorf("the opt-out is not logged as a warning:\n%s", d.stderr)
	}
	addr = anyAddr()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM)
	d = start(t, nil, "--config", writeConfig(t, addr), "--kubeconfig", kubeconfig, "--auth", "tokenreview", "--tls-cert-file", certFile, "--tls-private-key-file", keyFile)
	waitHTTPS(t, d, "127.0.0.1:"+port(addr), httpsClient(pool))
}

// otherKey is a private key that belongs to no certificate in use.
func otherKey(t *testing.T, ca *testenv.CA) []byte {
	_, key, _ := ca.Issue(t, "127.0.0.1")
	return key
}

// port is the port of a host:port address.
func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// writeFile writes content into dir/name and returns its path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// stateRecorder is the gRPC side of a resolver under test: it keeps the
// last addresses and error the resolver reported.
type stateRecorder struct {
	resolver.ClientConn // nothing else is called
	mu                  gosync.Mutex
	addrs               []string
	err                 error
}

func (s *stateRecorder) UpdateState(st resolver.State) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addrs = s.addrs[:0]
	for _, a := range st.Addresses {
		s.addrs = append(s.addrs, a.Addr)
	}
	slices.Sort(s.addrs)
	return nil
}

func (s *stateRecorder) ReportError(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
}

func (s *stateRecorder) addresses() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.addrs)
}

func (s *stateRecorder) lastError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}
