package testenv

import (
	"context"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// StartRestartable starts a control plane whose kube-apiserver and etcd can
// be stopped and started again: their certificates and data live in dir,
// and each keeps its address. Extra apiserver flags may be given as
// "--name=value".
func StartRestartable(dir string, apiserverFlags ...string) (*Env, error) {
	if !Available() {
		return nil, fmt.Errorf("KUBEBUILDER_ASSETS is not set: run `make test`, which builds the control plane")
	}
	certs, data := filepath.Join(dir, "certs"), filepath.Join(dir, "etcd")
	for _, d := range []string{certs, data} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	// kube-apiserver drains its watches slowly on SIGTERM; after 3 s the
	// harness kills it, which is a fault worth having too.
	env := &envtest.Environment{
		ControlPlaneStartTimeout: 60 * time.Second,
		ControlPlaneStopTimeout:  3 * time.Second,
	}
	env.ControlPlane.Etcd = &envtest.Etcd{DataDir: data}
	env.ControlPlane.APIServer = &envtest.APIServer{CertDir: certs}
	for _, f := range apiserverFlags {
		name, value := splitFlag(f)
		env.ControlPlane.APIServer.Configure().Set(name, value)
	}
	return start(env)
}

func splitFlag(f string) (string, string) {
	for len(f) > 0 && f[0] == '-' {
		f = f[1:]
	}
	for i := range len(f) {
		if f[i] == '=' {
			return f[:i], f[i+1:]
		}
	}
	return f, "true"
}

// APIServerAddr is the apiserver's host:port.
func (e *Env) APIServerAddr() string {
	u, err := url.Parse(e.Config.Host)
	if err != nil {
		return e.Config.Host
	}
	return u.Host
}

// RestartAPIServer stops kube-apiserver and starts it again on the same
// address, with the same certificates; it returns once it is healthy.
func (e *Env) RestartAPIServer() error {
	if err := e.StopAPIServer(); err != nil {
		return err
	}
	return e.StartAPIServer()
}

// StopAPIServer stops kube-apiserver: SIGTERM, then SIGKILL after 3 s.
func (e *Env) StopAPIServer() error {
	if err := e.env.ControlPlane.APIServer.Stop(); err != nil && !strings.Contains(err.Error(), "timeout waiting for process") {
		return fmt.Errorf("stop kube-apiserver: %w", err)
	}
	return nil
}

// StartAPIServer starts a stopped kube-apiserver again.
func (e *Env) StartAPIServer() error { return e.env.ControlPlane.APIServer.Start() }

// RestartEtcd stops etcd and starts it again with the same data and
// address; kube-apiserver reconnects by itself.
func (e *Env) RestartEtcd() error {
	etcd := e.env.ControlPlane.Etcd
	if err := etcd.Stop(); err != nil && !strings.Contains(err.Error(), "timeout waiting for process") {
		return fmt.Errorf("stop etcd: %w", err)
	}
	if err := etcd.Start(); err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	return nil
}

// Compact compacts etcd's history up to its current revision, so that a
// watch or list from an older resource version gets 410 Gone. It returns
// the revision.
func (e *Env) Compact(ctx context.Context) (int64, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{e.env.ControlPlane.Etcd.URL.String()},
		DialTimeout: 5 * time.Second,
		Logger:      nil,
	})
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := cli.Status(ctx, e.env.ControlPlane.Etcd.URL.String())
	if err != nil {
		return 0, fmt.Errorf("etcd status: %w", err)
	}
	rev := st.Header.Revision
	if _, err := cli.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		return 0, fmt.Errorf("compact at %d: %w", rev, err)
	}
	return rev, nil
}

// ReplaceEtcdData stops etcd, replaces its data folder with what fill
// puts in the emptied folder (nothing: a cluster rebuilt from scratch; a
// copy made by BackupEtcdData: etcd restored from a backup), and starts it
// again on the same address. With restartAPIServer, kube-apiserver is
// stopped first and started again after, and it returns once that is
// healthy; else kube-apiserver reconnects to the new etcd by itself.
// Clients of the old cluster go on talking to the new one, as to a
// cluster rebuilt behind its address.
func (e *Env) ReplaceEtcdData(fill func(dataDir string) error, restartAPIServer bool) error {
	if restartAPIServer {
		if err := e.StopAPIServer(); err != nil {
			return err
		}
	}
	etcd := e.env.ControlPlane.Etcd
	if err := etcd.Stop(); err != nil && !strings.Contains(err.Error(), "timeout waiting for process") {
		return fmt.Errorf("stop etcd: %w", err)
	}
	if err := os.RemoveAll(etcd.DataDir); err != nil {
		return err
	}
	if err := os.MkdirAll(etcd.DataDir, 0o700); err != nil {
		return err
	}
	if fill != nil {
		if err := fill(etcd.DataDir); err != nil {
			return err
		}
	}
	if err := etcd.Start(); err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	if !restartAPIServer {
		return nil
	}
	return e.StartAPIServer()
}

// BackupEtcdData copies etcd's data folder into dst while etcd is
// stopped for a moment (a cold backup; kube-apiserver reconnects by
// itself), and returns a function that copies it back into a data folder,
// for ReplaceEtcdData.
func (e *Env) BackupEtcdData(dst string) (restore func(dataDir string) error, err error) {
	etcd := e.env.ControlPlane.Etcd
	if err := etcd.Stop(); err != nil && !strings.Contains(err.Error(), "timeout waiting for process") {
		return nil, fmt.Errorf("stop etcd: %w", err)
	}
	copyErr := os.CopyFS(dst, os.DirFS(etcd.DataDir))
	if err := etcd.Start(); err != nil {
		return nil, fmt.Errorf("start etcd: %w", err)
	}
	if copyErr != nil {
		return nil, copyErr
	}
	return func(dataDir string) error {
		if err := os.CopyFS(dataDir, os.DirFS(dst)); err != nil {
			return err
		}
		// etcd wants its folders its own alone.
		return filepath.WalkDir(dataDir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return err
			}
			return os.Chmod(path, 0o700)
		})
	}, nil
}
