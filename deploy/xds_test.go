package deploy_test

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/iidp/metasync/schema"
	"github.com/iidp/metasync/test/testenv"
)

// TestXDSClientOfTheDaemonSet: the DaemonSet overlay serves xDS on its
// hostPort and through the node-local Service metasync-xds, with TLS and
// tokens; the example client's bootstrap (its environment expanded as
// the kubelet expands it) names that Service and port, a name the
// serving certificate holds, TLS with the CA its volume mounts, and its
// projected token of the daemon's audience as call credentials; the
// example passes a server-side dry run.
func TestXDSClientOfTheDaemonSet(t *testing.T) {
	objs := render(t, "overlays/daemonset")
	ds := find(t, objs, "DaemonSet", "metasync")
	_, c := podSpec(t, ds)
	args, _, _ := unstructured.NestedStringSlice(c, "args")
	_, xdsPort, err := net.SplitHostPort(flagValue(args, "--xds-listen"))
	if err != nil || flagValue(args, "--auth") != "tokenreview" || flagValue(args, "--tls-cert-file") == "" {
		t.Fatalf("the DaemonSet's args %v: want --xds-listen, --auth tokenreview and TLS", args)
	}
	audience := flagValue(args, "--auth-audience")
	svc := find(t, objs, "Service", "metasync-xds")
	if p, _, _ := unstructured.NestedString(svc.Object, "spec", "internalTrafficPolicy"); p != "Local" {
		t.Errorf("metasync-xds: internalTrafficPolicy %q, want Local (the node's own daemon)", p)
	}
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	svcPort := number(ports[0].(map[string]any)["port"])
	containerPorts, _, _ := unstructured.NestedSlice(c, "ports")
	var hostPort int64
	for _, p := range containerPorts {
		if name, _, _ := unstructured.NestedString(p.(map[string]any), "name"); name == "xds" {
			hostPort = number(p.(map[string]any)["hostPort"])
		}
	}
	if want := xdsPort; want != itoa(svcPort) || want != itoa(hostPort) {
		t.Errorf("xDS on port %s, the Service's %d, hostPort %d: want one port", xdsPort, svcPort, hostPort)
	}

	b, err := os.ReadFile(filepath.Join("overlays", "daemonset", "xds-client.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	app := &unstructured.Unstructured{}
	if err := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096).Decode(&app.Object); err != nil {
		t.Fatal(err)
	}
	spec, ac := podSpec(t, app)
	envVars, _, _ := unstructured.NestedSlice(ac, "env")
	vars := map[string]string{}
	var bootstrap string
	for _, e := range envVars {
		m := e.(map[string]any)
		name, _, _ := unstructured.NestedString(m, "name")
		value, _, _ := unstructured.NestedString(m, "value")
		if _, ok := m["valueFrom"]; ok {
			value = "from-the-downward-api"
		}
		// $(VAR) of a variable defined before, as the kubelet expands it.
		value = regexp.MustCompile(`\$\(([A-Z_]+)\)`).ReplaceAllStringFunc(value, func(s string) string { return vars[s[2:len(s)-1]] })
		vars[name] = value
		if name == "GRPC_XDS_BOOTSTRAP_CONFIG" {
			bootstrap = value
		}
	}
	if vars["GRPC_EXPERIMENTAL_XDS_BOOTSTRAP_CALL_CREDS"] != "true" {
		t.Error("the example client does not turn grpc-go's bootstrap call credentials on")
	}
	var boot struct {
		Servers []struct {
			URI          string `json:"server_uri"`
			ChannelCreds []struct {
				Type   string            `json:"type"`
				Config map[string]string `json:"config"`
			} `json:"channel_creds"`
			CallCreds []struct {
				Type   string            `json:"type"`
				Config map[string]string `json:"config"`
			} `json:"call_creds"`
		} `json:"xds_servers"`
		Node struct {
			ID string `json:"id"`
		} `json:"node"`
	}
	if err := json.Unmarshal([]byte(bootstrap), &boot); err != nil || len(boot.Servers) != 1 {
		t.Fatalf("the example's bootstrap %q: %v", bootstrap, err)
	}
	server := boot.Servers[0]
	host, port, _ := net.SplitHostPort(server.URI)
	if host != svc.GetName()+"."+svc.GetNamespace()+".svc" || port != xdsPort {
		t.Errorf("the bootstrap dials %s, want %s.%s.svc:%s", server.URI, svc.GetName(), svc.GetNamespace(), xdsPort)
	}
	serving := find(t, render(t, "cert-manager"), "Certificate", "metasync-tls")
	dnsNames, _, _ := unstructured.NestedStringSlice(serving.Object, "spec", "dnsNames")
	if !slices.Contains(dnsNames, host) {
		t.Errorf("the serving certificate names %v, not %s that the bootstrap's TLS checks", dnsNames, host)
	}
	if len(server.ChannelCreds) != 1 || server.ChannelCreds[0].Type != "tls" || len(server.CallCreds) != 1 || server.CallCreds[0].Type != "jwt_token_file" {
		t.Fatalf("the bootstrap's credentials: %+v %+v, want tls and jwt_token_file", server.ChannelCreds, server.CallCreds)
	}
	mounts, _, _ := unstructured.NestedSlice(ac, "volumeMounts")
	mount, _, _ := unstructured.NestedString(mounts[0].(map[string]any), "mountPath")
	volumes, _, _ := unstructured.NestedSlice(spec, "volumes")
	sources, _, _ := unstructured.NestedSlice(volumes[0].(map[string]any), "projected", "sources")
	files := map[string]string{} // path in the volume → what it is
	for _, s := range sources {
		m := s.(map[string]any)
		if aud, ok, _ := unstructured.NestedString(m, "serviceAccountToken", "audience"); ok {
			p, _, _ := unstructured.NestedString(m, "serviceAccountToken", "path")
			files[filepath.Join(mount, p)] = "token for " + aud
		}
		if items, ok, _ := unstructured.NestedSlice(m, "configMap", "items"); ok {
			name, _, _ := unstructured.NestedString(m, "configMap", "name")
			p, _, _ := unstructured.NestedString(items[0].(map[string]any), "path")
			files[filepath.Join(mount, p)] = "configmap " + name
		}
	}
	if got := files[server.ChannelCreds[0].Config["ca_certificate_file"]]; got != "configmap metasync-ca" {
		t.Errorf("the bootstrap's CA file is %q, want the ConfigMap metasync-ca", got)
	}
	if got := files[server.CallCreds[0].Config["jwt_token_file"]]; got != "token for "+audience {
		t.Errorf("the bootstrap's token file is %q, want a token for %q", got, audience)
	}
	if boot.Node.ID == "" {
		t.Error("the bootstrap names no node id")
	}

	testenv.Need(t, env)
	env.Namespace(t, "meta-test")
	apply(t, env.Config, []*unstructured.Unstructured{app}, true)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// number is a decoded YAML number (float64 through JSON, or int64).
func number(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case float64:
		return int64(n)
	}
	return -1
}

// TestXDSNodeClientWithASidecar: the Node example (grpc-js-xds has no
// bootstrap call credentials) runs metasync as a sidecar serving xDS on
// the pod's loopback, without --auth, and its bootstrap names that
// address with insecure channel credentials and no call credentials; the
// sidecar's config is valid and has the chain the app dials; its
// ServiceAccount is bound to the base's Role metasync-read; the objects
// pass a server-side dry run.
func TestXDSNodeClientWithASidecar(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("overlays", "daemonset", "xds-client-node.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		o := &unstructured.Unstructured{}
		if err := dec.Decode(&o.Object); err != nil {
			break
		}
		if len(o.Object) > 0 {
			objs = append(objs, o)
		}
	}
	app := find(t, objs, "Deployment", "grpc-node-app")
	spec, ac := podSpec(t, app)
	inits, _, _ := unstructured.NestedSlice(spec, "initContainers")
	if len(inits) != 1 {
		t.Fatalf("want one sidecar, got %d init containers", len(inits))
	}
	sidecar := inits[0].(map[string]any)
	if rp, _, _ := unstructured.NestedString(sidecar, "restartPolicy"); rp != "Always" {
		t.Errorf("the sidecar's restartPolicy is %q, want Always (a native sidecar)", rp)
	}
	args, _, _ := unstructured.NestedStringSlice(sidecar, "args")
	xdsAddr := flagValue(args, "--xds-listen")
	if host, _, err := net.SplitHostPort(xdsAddr); err != nil || !net.ParseIP(host).IsLoopback() || flagValue(args, "--auth") != "" {
		t.Fatalf("the sidecar's args %v: want --xds-listen on loopback, no --auth", args)
	}
	var bootstrap string
	envVars, _, _ := unstructured.NestedSlice(ac, "env")
	for _, e := range envVars {
		if name, _, _ := unstructured.NestedString(e.(map[string]any), "name"); name == "GRPC_XDS_BOOTSTRAP_CONFIG" {
			bootstrap, _, _ = unstructured.NestedString(e.(map[string]any), "value")
		}
	}
	var boot struct {
		Servers []struct {
			URI          string           `json:"server_uri"`
			ChannelCreds []map[string]any `json:"channel_creds"`
			CallCreds    []map[string]any `json:"call_creds"`
		} `json:"xds_servers"`
		Node struct {
			Locality map[string]string `json:"locality"`
		} `json:"node"`
	}
	if err := json.Unmarshal([]byte(bootstrap), &boot); err != nil || len(boot.Servers) != 1 {
		t.Fatalf("the app's bootstrap %q: %v", bootstrap, err)
	}
	s := boot.Servers[0]
	if s.URI != xdsAddr || len(s.ChannelCreds) != 1 || s.ChannelCreds[0]["type"] != "insecure" || len(s.CallCreds) != 0 {
		t.Errorf("the bootstrap's server %+v: want %s, insecure, no call credentials", s, xdsAddr)
	}
	if boot.Node.Locality == nil {
		t.Error("the bootstrap has no node.locality, which grpc-js-xds needs")
	}
	cm := find(t, objs, "ConfigMap", "grpc-node-app-metasync")
	config, _, _ := unstructured.NestedString(cm.Object, "data", "config.yaml")
	path := filepath.Join(t.TempDir(), "config.yaml")
	_ = os.WriteFile(path, []byte(config), 0o600)
	if _, err := schema.Load(path, schema.LoadOptions{}); err != nil {
		t.Fatalf("the sidecar's config: %v", err)
	}
	if !strings.Contains(config, "chains:\n  - name: model-to-endpoints\n") {
		t.Errorf("the sidecar's config has no chain model-to-endpoints")
	}
	rb := find(t, objs, "RoleBinding", "grpc-node-app-metasync-read")
	role, _, _ := unstructured.NestedString(rb.Object, "roleRef", "name")
	if r := find(t, render(t, "base"), "Role", role); r.GetNamespace() != rb.GetNamespace() {
		t.Errorf("the Role %s is in %s, the binding in %s", role, r.GetNamespace(), rb.GetNamespace())
	}

	testenv.Need(t, env)
	env.Namespace(t, "meta-test")
	apply(t, env.Config, objs, true)
}
