package deploy_test

import (
	"net/url"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/iidp/metasync/test/testenv"
)

// find returns the rendered object of kind and name, failing t if there
// is none.
func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %s", kind, name)
	return nil
}

// flagValue is the value that follows flag in args, or "".
func flagValue(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

// podSpec is a workload's pod template spec and its first container.
func podSpec(t *testing.T, o *unstructured.Unstructured) (spec, container map[string]any) {
	t.Helper()
	spec, _, _ = unstructured.NestedMap(o.Object, "spec", "template", "spec")
	containers, _, _ := unstructured.NestedSlice(spec, "containers")
	if len(containers) == 0 {
		t.Fatalf("%s %s: no container", o.GetKind(), o.GetName())
	}
	return spec, containers[0].(map[string]any)
}

// TestManifestsTakeNoClusterCredentials: every shipped daemon serves TLS
// from the Secret that the cert-manager kustomization issues for the
// Service's name, with probes over HTTPS, and reviews tokens for one
// audience; the shipped caller holds no token for the apiserver, only a
// projected token for that audience and the CA, and asks a name that the
// certificate holds. The caller and the cert-manager objects pass a
// server-side dry run (cert-manager's kinds installed as loose CRDs).
func TestManifestsTakeNoClusterCredentials(t *testing.T) {
	certs := render(t, "cert-manager")
	serving := find(t, certs, "Certificate", "metasync-tls")
	secret, _, _ := unstructured.NestedString(serving.Object, "spec", "secretName")
	dnsNames, _, _ := unstructured.NestedStringSlice(serving.Object, "spec", "dnsNames")
	if serving.GetNamespace() != "metasync" || secret == "" {
		t.Fatalf("the serving Certificate: namespace %q, secret %q", serving.GetNamespace(), secret)
	}

	var audience string
	for dir, kind := range map[string]string{"base": "Deployment", "overlays/daemonset": "DaemonSet"} {
		w := find(t, render(t, dir), kind, "metasync")
		spec, c := podSpec(t, w)
		args, _, _ := unstructured.NestedStringSlice(c, "args")
		if flagValue(args, "--auth") != "tokenreview" {
			t.Errorf("%s: --auth %q", dir, flagValue(args, "--auth"))
		}
		aud := flagValue(args, "--auth-audience")
		if aud == "" || (audience != "" && aud != audience) {
			t.Errorf("%s: --auth-audience %q (other workloads: %q)", dir, aud, audience)
		}
		audience = aud
		// The certificate and key come from the Secret cert-manager writes.
		mounts, _, _ := unstructured.NestedSlice(c, "volumeMounts")
		volumes, _, _ := unstructured.NestedSlice(spec, "volumes")
		for _, f := range []string{"--tls-cert-file", "--tls-private-key-file"} {
			path := flagValue(args, f)
			var vol string
			for _, m := range mounts {
				m := m.(map[string]any)
				if mp, _ := m["mountPath"].(string); mp != "" && len(path) > len(mp) && path[:len(mp)+1] == mp+"/" {
					vol, _ = m["name"].(string)
				}
			}
			var from string
			for _, v := range volumes {
				v := v.(map[string]any)
				if v["name"] == vol {
					from, _, _ = unstructured.NestedString(v, "secret", "secretName")
				}
			}
			if path == "" || from != secret {
				t.Errorf("%s: %s %q is not in a volume of Secret %s (volume %q of %q)", dir, f, path, secret, vol, from)
			}
		}
		for _, probe := range []string{"readinessProbe", "livenessProbe"} {
			if s, _, _ := unstructured.NestedString(c, probe, "httpGet", "scheme"); s != "HTTPS" {
				t.Errorf("%s: %s scheme %q, want HTTPS", dir, probe, s)
			}
		}
	}

	callers := render(t, "caller")
	caller := find(t, callers, "Deployment", "metasync-caller")
	spec, c := podSpec(t, caller)
	if v, ok, _ := unstructured.NestedBool(spec, "automountServiceAccountToken"); !ok || v {
		t.Errorf("the caller's pod mounts the ServiceAccount token of the apiserver (automountServiceAccountToken %v, set %v)", v, ok)
	}
	args, _, _ := unstructured.NestedStringSlice(c, "args")
	server, err := url.Parse(flagValue(args, "--server"))
	if err != nil || server.Scheme != "https" || !slices.Contains(dnsNames, server.Hostname()) {
		t.Errorf("the caller asks %q: want https:// and one of the certificate's names %v", flagValue(args, "--server"), dnsNames)
	}
	volumes, _, _ := unstructured.NestedSlice(spec, "volumes")
	var tokenAudience string
	for _, v := range volumes {
		sources, _, _ := unstructured.NestedSlice(v.(map[string]any), "projected", "sources")
		for _, s := range sources {
			if a, ok, _ := unstructured.NestedString(s.(map[string]any), "serviceAccountToken", "audience"); ok {
				tokenAudience = a
			}
		}
	}
	if tokenAudience != audience {
		t.Errorf("the caller's projected token is for audience %q, the daemons accept %q", tokenAudience, audience)
	}
	if flagValue(args, "--token-file") == "" || flagValue(args, "--ca-file") == "" {
		t.Errorf("the caller sends no token file or checks no CA: %v", args)
	}

	testenv.Need(t, env)
	env.Namespace(t, "meta-test")
	env.Namespace(t, "metasync")
	env.InstallCRD(t, testenv.LooseCRD("cert-manager.io", "Certificate", "certificates"))
	env.InstallCRD(t, testenv.LooseCRD("cert-manager.io", "Issuer", "issuers"))
	apply(t, env.Config, certs, true)
	apply(t, env.Config, callers, true)
}
