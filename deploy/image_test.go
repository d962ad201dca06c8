package deploy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/iidp/metasync/internal/kubeapply"
	"github.com/iidp/metasync/test/testenv"
)

// TestImageNameAgrees: the image that `make image` builds by default is
// the one the manifests run.
func TestImageNameAgrees(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join(testenv.Root(), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^IMAGE \?= (\S+)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("no IMAGE ?= in the Makefile")
	}
	for _, f := range []string{"base/app/deployment.yaml", "overlays/daemonset/daemonset.yaml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "image: "+string(m[1])+"\n") {
			t.Errorf("%s does not run image %s", f, m[1])
		}
	}
}

// podman runs podman with a containers.conf that drops the default
// ulimits, which a container in a container may not set.
func podman(t *testing.T, conf string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("podman", args...)
	cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+conf)
	return cmd
}

// TestImage builds the image (hack/image.sh, as `make image` does) and
// runs it as the manifests do: read-only root filesystem, user 65532, no
// capabilities, no privilege escalation, the config in a ConfigMap-style
// folder, against the test control plane over the host network. It
// checks `version`, /readyz, a lookup and /metrics, and a clean exit on
// SIGTERM within the manifests' grace period (30 s), with their
// --shutdown-delay 5s. No tmpfs either: like readOnlyRootFilesystem,
// nothing in the container is writable. It needs podman (Debian's
// package, with its recommended ones), which .ci/run installs, and an OCI
// runtime that can run a container here: podman's default (crun with
// Debian's packages), else runc (see pickRuntime).
func TestImage(t *testing.T) {
	testenv.Need(t, env)
	if _, err := exec.LookPath("podman"); err != nil {
		t.Skip("podman is not installed: the image test needs podman (Debian: apt-get install podman, which brings buildah and crun; where crun cannot run, on hybrid cgroups, runc too); .ci/run installs them")
	}
	conf := filepath.Join(t.TempDir(), "containers.conf")
	if err := os.WriteFile(conf, []byte("[containers]\ndefault_ulimits = []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	image := buildImage(t, conf)

	// The cluster: the AppModel CRD and one AppModel.
	env.InstallCRDFile(t, filepath.Join(testenv.Root(), "examples", "appmodel", "crd.yaml"))
	const ns = "image-e2e"
	env.Namespace(t, ns)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	objects := filepath.Join(dir, "objects.yaml")
	_ = os.WriteFile(objects, []byte(`
apiVersion: iidp.com/v1
kind: AppModel
metadata: {name: base, namespace: image-e2e, labels: {iidp: iidp}}
spec: {type: model, version: "1.7", models: [model1]}
`), 0o644)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kubeapply.Files(ctx, env.Config, objects); err != nil {
		t.Fatal(err)
	}

	// The config as the kubelet mounts a ConfigMap, readable by 65532, the
	// kubeconfig, and the snapshot folder.
	addr := testenv.FreeAddr(t)
	cm, kube, snaps := imageMounts(t, dir, addr, ns)

	name := fmt.Sprintf("metasync-test-%d", time.Now().UnixNano())
	run := podman(t, conf, "run", "--rm", "--name", name, "--network", "host",
		"--read-only", "--read-only-tmpfs=false", "--user", "65532:65532", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
		"-v", cm+":/etc/metasync:ro", "-v", kube+":/kube:ro", "-v", snaps+":/var/lib/metasync",
		image, "serve", "--config", "/etc/metasync/config.yaml", "--kubeconfig", "/kube/kubeconfig", "--shutdown-delay", "5s",
		"--snapshot-dir", "/var/lib/metasync")
	logs := &testenv.Buffer{}
	run.Stdout, run.Stderr = logs, logs
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- run.Wait() }()
	t.Cleanup(func() {
		_ = podman(t, conf, "rm", "-f", name).Run()
		if t.Failed() {
			t.Logf("container output:\n%s", logs)
		}
	})

	client := &http.Client{Timeout: 5 * time.Second}
	get := func(path string) (int, string) {
		resp, err := client.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if code, _ := get("/readyz"); code == 200 {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("the container exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			code, body := get("/readyz?verbose")
			t.Fatalf("/readyz not 200 after 60 s: %d %s", code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, body := get("/v1/indexes/model-to-app/keys/model1"); code != 200 || !strings.Contains(body, `"values":["base"]`) {
		t.Errorf("lookup: %d %s", code, body)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, `metasync_resource_synced{resource="appmodels"} 1`) {
		t.Errorf("/metrics: %d, synced metric missing", code)
	}

	// SIGTERM, as the kubelet stops a pod: a clean exit within 30 s.
	stopped := time.Now()
	if out, err := podman(t, conf, "kill", "--signal", "TERM", name).CombinedOutput(); err != nil {
		t.Fatalf("podman kill: %v %s", err, out)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v", err)
		}
		t.Logf("exited %v after SIGTERM", time.Since(stopped).Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		t.Fatal("still running 30 s after SIGTERM")
	}
	if !strings.Contains(logs.String(), `"msg":"stopped"`) {
		t.Errorf("no clean stop in the logs")
	}
	if fi, err := os.Stat(filepath.Join(snaps, "snapshot")); err != nil || fi.Size() == 0 {
		t.Errorf("no snapshot written by user 65532 at the stop: %v", err)
	}
}

// buildImage builds the image (hack/image.sh, as `make image` does) with
// podman's containers.conf conf, removed when t ends, and checks that it
// runs here (see pickRuntime); it returns the image's name.
func buildImage(t *testing.T, conf string) string {
	image := fmt.Sprintf("localhost/metasync:test-%d", time.Now().UnixNano())
	build := exec.Command(filepath.Join(testenv.Root(), "hack", "image.sh"))
	build.Dir = testenv.Root()
	build.Env = append(os.Environ(), "IMAGE="+image, "VERSION=image-test", "CONTAINER_ENGINE=podman", "CONTAINERS_CONF="+conf)
	out, err := build.CombinedOutput()
	if err != nil {
		t.Fatalf("hack/image.sh: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "binary:") {
			t.Log(line)
		}
	}
	t.Cleanup(func() { _ = podman(t, conf, "rmi", "-f", image).Run() })
	if out, err := podman(t, conf, "image", "inspect", "--format", "{{.Size}} {{.Config.User}}", image).Output(); err == nil {
		t.Logf("image %s: size (bytes) and user: %s", image, strings.TrimSpace(string(out)))
	}
	// The OCI runtime that can run a container here (runc where podman's
	// default, crun, cannot: hybrid cgroups), trying the image's version.
	if out := pickRuntime(t, conf, image); !strings.Contains(out, "image-test") {
		t.Fatalf("podman run IMAGE version: %q", out)
	}
	return image
}

// imageMounts writes, in dir, the folders that the container mounts: the
// config serving on addr as the kubelet mounts a ConfigMap, readable by
// 65532; the kubeconfig of the test control plane; the snapshot folder,
// an emptyDir in the manifests, writable by all.
func imageMounts(t *testing.T, dir, addr, ns string) (cm, kube, snaps string) {
	cm = filepath.Join(dir, "config")
	version := filepath.Join(cm, "..2026_11_30_00")
	if err := os.MkdirAll(version, 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.WriteFile(filepath.Join(version, "config.yaml"), []byte(fmt.Sprintf(`
server: {listen: "%s"}
resources:
  - name: appmodels
    group: iidp.com
    version: v1
    resource: appmodels
    namespace: %s
    labelSelector: iidp=iidp
    indexes:
      - {name: model-to-app, key: spec.models, value: metadata.name}
`, addr, ns)), 0o644)
	for _, l := range [][2]string{{"..2026_11_30_00", "..data"}, {"..data/config.yaml", "config.yaml"}} {
		if err := os.Symlink(l[0], filepath.Join(cm, l[1])); err != nil {
			t.Fatal(err)
		}
	}
	kube = filepath.Join(dir, "kube")
	_ = os.Mkdir(kube, 0o755)
	kc, err := os.ReadFile(env.WriteKubeconfig(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	_ = os.WriteFile(filepath.Join(kube, "kubeconfig"), kc, 0o644)

	// The snapshot folder, an emptyDir in the manifests: writable by all.
	snaps = filepath.Join(dir, "snapshots")
	if err := os.Mkdir(snaps, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(snaps, 0o777); err != nil { // whatever the umask
		t.Fatal(err)
	}
	return cm, kube, snaps
}
