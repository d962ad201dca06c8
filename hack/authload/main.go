// Command authload measures `metasync serve --auth=tokenreview` under a
// flood of made-up tokens. It starts a control plane (the pinned binaries
// of the tests: KUBEBUILDER_ASSETS), a ServiceAccount allowed /v1/*, and
// the given metasync binary. First a new token of that account looks up
// 50 keys of one index, one after the other; then, for -duration,
// -flooders goroutines send made-up tokens while one authorized caller
// looks up 50 keys of one index in turn. It prints the requests answered,
// the authorized caller's status codes, the warnings metasync logged, and
// the TokenReviews and SubjectAccessReviews that reached the apiserver
// (its own apiserver_request_total). Not part of `make test`:
//
//	go build -o /tmp/metasync ./cmd/metasync
//	KUBEBUILDER_ASSETS=$(bash hack/envtest-assets.sh) go run ./hack/authload -bin /tmp/metasync
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/iidp/metasync/test/testenv"
)

func main() {
	bin := flag.String("bin", "", "the metasync binary to measure (required)")
	duration := flag.Duration("duration", 6*time.Second, "how long the flood lasts")
	flooders := flag.Int("flooders", 64, "goroutines sending made-up tokens")
	flag.Parse()
	if *bin == "" {
		fmt.Fprintln(os.Stderr, "authload: -bin is required")
		os.Exit(2)
	}
	if err := run(*bin, *duration, *flooders); err != nil {
		fmt.Fprintln(os.Stderr, "authload:", err)
		os.Exit(1)
	}
}

func run(bin string, duration time.Duration, flooders int) error {
	env, err := testenv.Start()
	if err != nil {
		return err
	}
	defer env.Stop()
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "authload-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	// A reader allowed /v1/*.
	const ns = "authload"
	kube := env.Kube
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "reader"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := kube.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "authload-reader"},
		Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{"/v1/*", "/metrics"}, Verbs: []string{"get"}}},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "authload-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "authload-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "reader", Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	tr, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "reader", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	token := tr.Status.Token

	// metasync serve with --auth=tokenreview.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := ln.Addr().String()
	ln.Close()
	config := filepath.Join(dir, "config.yaml")
	kubeconfig := filepath.Join(dir, "kubeconfig")
	cfg := fmt.Sprintf(`server: {listen: %q}
resources:
  - name: endpointslices
    group: discovery.k8s.io
    version: v1
    resource: endpointslices
    namespace: %s
    indexes:
      - name: service-to-addresses
        key: 'metadata.labels.kubernetes\.io/service-name'
`, addr, ns)
	if err := os.WriteFile(config, []byte(cfg), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(kubeconfig, env.KubeConfig, 0o600); err != nil {
		return err
	}
	logs := &testenv.Buffer{}
	cmd := exec.Command(bin, "serve", "--config", config, "--kubeconfig", kubeconfig, "--auth", "tokenreview")
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: flooders + 8}, Timeout: 30 * time.Second}
	get := func(path, tok string) int {
		req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := client.Do(req)
		if err != nil {
			return 0
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	// Until the reader is let in (the daemon up, RBAC propagated).
	deadline := time.Now().Add(60 * time.Second)
	for get("/v1/indexes/service-to-addresses/keys/warm-up", token) != 200 {
		if time.Now().After(deadline) {
			return fmt.Errorf("the reader is not let in after 60 s:\n%s", logs)
		}
		time.Sleep(200 * time.Millisecond)
	}

	reviews := func() (tokens, access float64, err error) {
		raw, err := kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
		if err != nil {
			return 0, 0, err
		}
		sc := bufio.NewScanner(bytes.NewReader(raw))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if !strings.HasPrefix(line, "apiserver_request_total{") || !strings.Contains(line, `verb="POST"`) {
				continue
			}
			v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			switch {
			case strings.Contains(line, `resource="tokenreviews"`):
				tokens += v
			case strings.Contains(line, `resource="subjectaccessreviews"`):
				access += v
			}
		}
		return tokens, access, sc.Err()
	}

	// Cold: a fresh token of the reader looks up 50 keys of one index.
	tr, err = kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "reader", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	coldTokens0, coldAccess0, err := reviews()
	if err != nil {
		return err
	}
	coldCodes := map[int]int{}
	start := time.Now()
	for i := range 50 {
		coldCodes[get(fmt.Sprintf("/v1/indexes/service-to-addresses/keys/cold-%d", i), tr.Status.Token)]++
	}
	took := time.Since(start)
	coldTokens1, coldAccess1, err := reviews()
	if err != nil {
		return err
	}
	fmt.Printf("binary: %s\ncold: a new token, 50 keys of one index one after the other: %s in %s; %.0f TokenReviews, %.0f SubjectAccessReviews\n",
		bin, codes(coldCodes), took.Round(time.Millisecond), coldTokens1-coldTokens0, coldAccess1-coldAccess0)

	tokens0, access0, err := reviews()
	if err != nil {
		return err
	}
	warns0 := strings.Count(logs.String(), `"level":"WARN"`)

	var flood atomic.Int64
	floodCodes := make([]map[int]int, flooders)
	stop := time.Now().Add(duration)
	var wg sync.WaitGroup
	for i := range flooders {
		floodCodes[i] = map[int]int{}
		wg.Go(func() {
			b := make([]byte, 16)
			for n := 0; time.Now().Before(stop); n++ {
				_, _ = rand.Read(b)
				floodCodes[i][get(fmt.Sprintf("/v1/indexes/service-to-addresses/keys/k%d", n%50), hex.EncodeToString(b))]++
				flood.Add(1)
			}
		})
	}
	callerCodes := map[int]int{}
	caller := 0
	for ; time.Now().Before(stop); caller++ {
		callerCodes[get(fmt.Sprintf("/v1/indexes/service-to-addresses/keys/key-%d", caller%50), token)]++
	}
	wg.Wait()
	tokens1, access1, err := reviews()
	if err != nil {
		return err
	}
	floodTotal := map[int]int{}
	for _, m := range floodCodes {
		for c, n := range m {
			floodTotal[c] += n
		}
	}
	fmt.Printf("flood: %d goroutines of made-up tokens for %s, plus one authorized caller cycling through 50 keys of one index\n", flooders, duration)
	fmt.Printf("requests answered: %d (flood %d %s, authorized caller %d)\n", flood.Load()+int64(caller), flood.Load(), codes(floodTotal), caller)
	fmt.Printf("authorized caller's status codes: %s\n", codes(callerCodes))
	fmt.Printf("warnings logged by metasync: %d\n", strings.Count(logs.String(), `"level":"WARN"`)-warns0)
	fmt.Printf("reviews reaching the apiserver: %.0f TokenReviews, %.0f SubjectAccessReviews\n", tokens1-tokens0, access1-access0)
	return nil
}

// codes prints status codes and their counts; 0 is a transport error.
func codes(m map[int]int) string {
	var ks []int
	for k := range m {
		ks = append(ks, k)
	}
	sort.Ints(ks)
	var parts []string
	for _, k := range ks {
		parts = append(parts, fmt.Sprintf("%d×%d", m[k], k))
	}
	return strings.Join(parts, ", ")
}
