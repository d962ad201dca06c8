package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/iidp/metasync/internal/kubeapply"
)

// The files of the two-cluster setup (make run CLUSTERS=2).
const (
	clustersConfig = "examples/clusters/config.yaml"
	// remoteReader is the remote cluster's reader: metasync reads west
	// with its rights.
	remoteReader = "examples/clusters/remote-reader.yaml"
	// westObjects are west's workloads, to apply while it runs.
	westObjects = "examples/clusters/west.yaml"
	// mountedKubeconfig is where the example's config finds west's
	// kubeconfig in a deployment; the copy points at the reader's.
	mountedKubeconfig = "/etc/metasync/clusters/west/kubeconfig"
	// readerUser is the ServiceAccount of remoteReader, as the
	// apiserver names it: a client certificate with this name has its
	// rights.
	readerUser = "system:serviceaccount:metasync:metasync-reader"
	// defaultControl is where make run's devcluster listens for
	// `devcluster apiserver stop|start`.
	defaultControl = "bin/devcluster.sock"
	// apiserverStop bounds a stop of a kube-apiserver asked for by
	// `devcluster apiserver stop`; it is killed after.
	apiserverStop = 5 * time.Second
)

// plane is a control plane that devcluster runs: east (the first, the
// daemon's own connection) or west.
type plane struct {
	name string
	env  *envtest.Environment
	cfg  *rest.Config
	// kubeconfig is its admin's kubeconfig file (metasync's own for east,
	// `devcluster apply`'s); kubeconfigOut the copy at --kubeconfig-out
	// ("" without), removed at the stop; reader (west) the kubeconfig
	// of its reader, with the context the example names, which metasync
	// reads it through.
	kubeconfig, kubeconfigOut, reader string
	several                           bool // one of two: messages name it

	mu      sync.Mutex
	stopped bool // its kube-apiserver was stopped by `devcluster apiserver stop`
}

// of is " of NAME" for a plane of several, "" for the only one.
func (p *plane) of() string {
	if p.several {
		return " of " + p.name
	}
	return ""
}

// planes are the control planes of a run, east first.
type planes struct {
	list []*plane
}

// startPlanes starts o.clusters control planes, each able to stop and
// start its kube-apiserver again (its certificates and data in dir), and
// the reader of west. What it started is in the planes, also on an error
// (stop stops it).
func startPlanes(ctx context.Context, dir string, o *options, say func(string, ...any), stderr io.Writer) (*planes, error) {
	ps := &planes{}
	for i, name := range []string{"east", "west"}[:o.clusters] {
		p := &plane{name: name, several: o.clusters > 1}
		pdir := filepath.Join(dir, name)
		certs, data := filepath.Join(pdir, "certs"), filepath.Join(pdir, "etcd")
		for _, d := range []string{certs, data} {
			if err := os.MkdirAll(d, 0o700); err != nil {
				return ps, err
			}
		}
		p.env = &envtest.Environment{ControlPlaneStopTimeout: controlPlaneStop}
		p.env.ControlPlane.APIServer = &envtest.APIServer{CertDir: certs}
		// A stop (devcluster apiserver stop) ends the watches at once,
		// as the end of the process would: kube-apiserver otherwise
		// keeps serving them until it is killed.
		p.env.ControlPlane.APIServer.Configure().Set("shutdown-watch-termination-grace-period", "1s")
		p.env.ControlPlane.Etcd = &envtest.Etcd{DataDir: data}
		if i == 0 {
			p.env.CRDInstallOptions = envtest.CRDInstallOptions{Paths: []string{"examples/appmodel/crd.yaml"}, ErrorIfPathMissing: true}
		}
		if err := backstop(p.env, pdir); err != nil {
			return ps, err
		}
		ps.list = append(ps.list, p)
		if p.several {
			say("==> starting kube-apiserver and etcd of %s", name)
		} else {
			say("==> starting kube-apiserver and etcd")
		}
		var err error
		if p.cfg, err = p.env.Start(); err != nil {
			return ps, fmt.Errorf("start control plane%s: %w", p.of(), err)
		}
		if err := p.writeKubeconfigs(pdir, o.kubeconfigOut); err != nil {
			return ps, err
		}
		say("==> control plane%s at %s, kubeconfig %s", p.of(), p.cfg.Host, p.kubeconfig)
		if ctx.Err() != nil {
			return ps, nil
		}
		if i == 1 {
			if err := p.addReader(ctx, pdir); err != nil {
				return ps, err
			}
			say("==> metasync reads %s through the ServiceAccount of %s (kubeconfig %s, context west-reader)", name, remoteReader, p.reader)
		}
	}
	return ps, nil
}

// writeKubeconfigs writes the plane's admin kubeconfig in dir, and at
// out (east) or out-NAME when out is set.
func (p *plane) writeKubeconfigs(dir, out string) error {
	p.kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(p.kubeconfig, p.env.KubeConfig, 0o600); err != nil {
		return err
	}
	if out == "" {
		return nil
	}
	if p.name != "east" {
		out += "-" + p.name
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(out, p.env.KubeConfig, 0o600); err != nil {
		return err
	}
	p.kubeconfig, p.kubeconfigOut = out, out
	return nil
}

// addReader applies remoteReader (in its namespace metasync, with the
// namespace meta-test that the example's objects go to) and writes, in
// dir, a kubeconfig with a client certificate of its ServiceAccount,
// under the context the example's config names.
func (p *plane) addReader(ctx context.Context, dir string) error {
	var objs []*unstructured.Unstructured
	for _, ns := range []string{"metasync", "meta-test"} {
		objs = append(objs, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns},
		}})
	}
	reader, err := kubeapply.Objects(remoteReader)
	if err != nil {
		return err
	}
	applyCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := kubeapply.Apply(applyCtx, p.cfg, append(objs, reader...)...); err != nil {
		return fmt.Errorf("%s: apply %s: %w", p.name, remoteReader, err)
	}
	u, err := p.env.AddUser(envtest.User{Name: readerUser, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:metasync"}}, nil)
	if err != nil {
		return fmt.Errorf("%s: the reader's certificate: %w", p.name, err)
	}
	raw, err := u.KubeConfig()
	if err != nil {
		return err
	}
	kc, err := clientcmd.Load(raw)
	if err != nil {
		return err
	}
	kc.Contexts["west-reader"] = kc.Contexts[kc.CurrentContext]
	delete(kc.Contexts, kc.CurrentContext)
	kc.CurrentContext = "west-reader"
	p.reader = filepath.Join(dir, "reader.kubeconfig")
	return clientcmd.WriteToFile(*kc, p.reader)
}

// stop stops every control plane, the last first, and removes the
// kubeconfigs left for `devcluster apply`.
func (ps *planes) stop(say func(string, ...any), stderr io.Writer) {
	for i := len(ps.list) - 1; i >= 0; i-- {
		p := ps.list[i]
		say("==> stopping the control plane%s", p.of())
		if err := p.env.Stop(); err != nil {
			fmt.Fprintf(stderr, "devcluster: stop the control plane%s: %v\n", p.of(), err)
		}
		if p.kubeconfigOut != "" {
			os.Remove(p.kubeconfigOut)
		}
	}
}

// copyConfig writes, at path, the config that make run serves: a copy of
// exampleConfig for one control plane; of clustersConfig for two, west's
// kubeconfig its reader's.
func (ps *planes) copyConfig(path string) error {
	if len(ps.list) == 1 {
		return copyConfig(exampleConfig, path)
	}
	if err := copyConfig(clustersConfig, path); err != nil {
		return err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	const line = "kubeconfig: " + mountedKubeconfig + "\n"
	if !strings.Contains(string(b), line) {
		return fmt.Errorf("%s has no line %q to point at west's kubeconfig", clustersConfig, strings.TrimSpace(line))
	}
	b = []byte(strings.Replace(string(b), line, "kubeconfig: "+ps.list[1].reader+"\n", 1))
	return os.WriteFile(path, b, 0o644)
}

// find returns the plane named name, or nil.
func (ps *planes) find(name string) *plane {
	for _, p := range ps.list {
		if p.name == name {
			return p
		}
	}
	return nil
}

// apiserver stops or starts the plane's kube-apiserver (on its address,
// with its certificates: every kubeconfig stays good), and says what it
// did.
func (p *plane) apiserver(verb string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	api := p.env.ControlPlane.APIServer
	switch {
	case verb == "stop" && p.stopped:
		return fmt.Sprintf("the kube-apiserver of %s is stopped already", p.name), nil
	case verb == "start" && !p.stopped:
		return fmt.Sprintf("the kube-apiserver of %s runs already", p.name), nil
	case verb == "stop":
		api.StopTimeout = apiserverStop
		if err := api.Stop(); err != nil && !strings.Contains(err.Error(), "timeout waiting for process") {
			return "", err
		}
		p.stopped = true
		return fmt.Sprintf("stopped the kube-apiserver of %s (%s)", p.name, p.cfg.Host), nil
	case verb == "start":
		if err := api.Start(); err != nil {
			return "", err
		}
		p.stopped = false
		return fmt.Sprintf("started the kube-apiserver of %s again (%s)", p.name, p.cfg.Host), nil
	}
	return "", fmt.Errorf("%q: stop or start", verb)
}

// serveControl listens on the Unix socket path for `devcluster
// apiserver`: POST /apiserver/{stop,start}/{cluster}. close stops it and
// removes the socket.
func serveControl(path string, ps *planes, say func(string, ...any)) (closeControl func(), err error) {
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return nil, fmt.Errorf("%s is in use: is another `make run` running?", path)
	}
	_ = os.Remove(path) // a socket left by a devcluster that was killed
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /apiserver/{verb}/{cluster}", func(w http.ResponseWriter, r *http.Request) {
		p := ps.find(r.PathValue("cluster"))
		if p == nil {
			var names []string
			for _, p := range ps.list {
				names = append(names, p.name)
			}
			http.Error(w, fmt.Sprintf("no cluster %q (running: %s)", r.PathValue("cluster"), strings.Join(names, ", ")), http.StatusNotFound)
			return
		}
		msg, err := p.apiserver(r.PathValue("verb"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		say("==> %s", msg)
		fmt.Fprintln(w, msg)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return func() { _ = srv.Close(); _ = os.Remove(path) }, nil
}

// apiserverCmd is `devcluster apiserver stop|start CLUSTER`: it asks the
// running devcluster (make run) to stop or start that cluster's
// kube-apiserver.
func apiserverCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("devcluster apiserver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	control := fs.String("control", defaultControl, "the control socket of the running devcluster (make run's)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() != 2 || (fs.Arg(0) != "stop" && fs.Arg(0) != "start") {
		return errors.New("apiserver: stop CLUSTER or start CLUSTER (make stop-apiserver CLUSTER=west)")
	}
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", *control)
		},
	}}
	resp, err := client.Post("http://devcluster/apiserver/"+fs.Arg(0)+"/"+fs.Arg(1), "text/plain", nil)
	if err != nil {
		return fmt.Errorf("apiserver: %v: is `make run` running?", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("apiserver %s %s: %s", fs.Arg(0), fs.Arg(1), strings.TrimSpace(string(body)))
	}
	fmt.Fprint(stdout, string(body))
	return nil
}
