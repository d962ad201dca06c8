package sync

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/iidp/metasync/sync/internal/follow"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	compiled "github.com/iidp/metasync/internal/plan"
)

// clientFor gives w the client of its cluster's current connection.
func (cs *connections) clientFor(w *follow.Watcher) error {
	cs.mu.Lock()
	c := cs.byName[w.ClusterName]
	cs.mu.Unlock()
	if c == nil {
		return fmt.Errorf("resource %s: no connection to cluster %q", w.Plan.Name, w.ClusterName)
	}
	client, err := c.forWatcher(w)
	if err != nil {
		return err
	}
	w.SetClient(client)
	return nil
}

// fetchID reads the identity of a cluster through its current
// connection.
func (cs *connections) fetchID(ctx context.Context, cluster string, cached bool) (string, error) {
	cs.mu.Lock()
	c := cs.byName[cluster]
	cs.mu.Unlock()
	if c == nil || c.core == nil {
		return "", fmt.Errorf("no connection to cluster %q", cluster)
	}
	return follow.FetchClusterID(c.core)(ctx, cached)
}

// followKubeconfigs reads the clusters' kubeconfig files again every
// conns.every until ctx ends, and takes each that changed (see
// takeKubeconfig).
func (e *Engine) followKubeconfigs(ctx context.Context) {
	t := time.NewTicker(e.conns.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		e.conns.mu.Lock()
		var files []*connection
		for _, c := range e.conns.byName {
			if c.file != "" {
				files = append(files, c)
			}
		}
		e.conns.mu.Unlock()
		for _, c := range files {
			e.takeKubeconfig(ctx, c)
		}
	}
}

// takeKubeconfig reads c's kubeconfig file and, when it changed, takes
// it: the new connection must answer first (a list of one object of each
// of the cluster's resources, with its credentials, which proves the
// reader's rights too), then each watcher of the cluster switches to it
// and lists again through it (nothing leaves the answers meanwhile).
// A file that cannot be read, parsed or used keeps the last good
// connection, logged and counted. A file that cannot be parsed is tried
// again when it changes; one whose apiserver did not answer (it may be
// away for a while, or the file was read mid-write) is tried again,
// changed or not, after a back-off (c.retry, doubling up to a minute).
func (e *Engine) takeKubeconfig(ctx context.Context, c *connection) {
	body, err := os.ReadFile(c.file)
	e.conns.mu.Lock()
	same := err == nil && bytes.Equal(body, c.read)
	retry := same && c.retryAt != (time.Time{}) && !time.Now().Before(c.retryAt)
	if err == nil {
		c.read = body
	}
	e.conns.mu.Unlock()
	if same && !retry {
		return
	}
	log := e.log.With("cluster", c.name, "kubeconfig", c.file)
	if err == nil && bytes.Equal(body, c.inUse) {
		e.backToInUse(c, log)
		return
	}
	refuse := func(err error, again bool) {
		e.conns.mu.Lock()
		c.errors++
		c.lastErr = err.Error()
		if again {
			c.backoff = min(max(2*c.backoff, e.conns.every), time.Minute)
			c.retryAt = time.Now().Add(c.backoff)
		} else {
			c.backoff, c.retryAt = 0, time.Time{}
		}
		e.conns.mu.Unlock()
		if again {
			log.Warn("kubeconfig not taken: the last good connection stays; trying again", "error", err.Error(), "in", c.backoff.String())
			return
		}
		log.Warn("kubeconfig not taken: the last good connection stays", "error", err.Error())
	}
	if err != nil {
		// Unreadable: try again at the next look, whatever it reads; the
		// same refusal is counted and logged once.
		e.conns.mu.Lock()
		c.read = nil
		again := c.lastErr == err.Error()
		e.conns.mu.Unlock()
		if !again {
			refuse(err, false)
		}
		return
	}
	cfg, err := kubeconfigOf(c.file, body, c.context)
	if err != nil {
		refuse(err, false)
		return
	}
	forWatcher, core, err := clientsOf(cfg)
	if err != nil {
		refuse(err, false)
		return
	}
	// Each of the cluster's resources must list through the new
	// connection before any switches; the probes run outside e.mu (a
	// reload is not held up by an apiserver that is slow to answer), and
	// a reload meanwhile makes the file be taken again at the next look.
	v, _ := e.view()
	var parts []*follow.Watcher
	for _, w := range v.watchers {
		if w.ClusterName == c.name {
			parts = append(parts, w)
		}
	}
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	clients := make([]rest.Interface, len(parts))
	for i, w := range parts {
		client, err := forWatcher(w)
		if err != nil {
			refuse(err, false)
			return
		}
		if err := w.Probe(pctx, client); err != nil {
			refuse(fmt.Errorf("the new connection cannot list and watch %s: %w", w.Plan.Name, err), true)
			return
		}
		clients[i] = client
	}
	e.mu.Lock() // no reload builds watchers meanwhile
	defer e.mu.Unlock()
	e.conns.mu.Lock()
	current := e.conns.byName[c.name] == c
	e.conns.mu.Unlock()
	if !current {
		return // a reload replaced the cluster's connection meanwhile
	}
	if now, _ := e.view(); !slices.Equal(parts, slices.DeleteFunc(slices.Clone(now.watchers), func(w *follow.Watcher) bool { return w.ClusterName != c.name })) {
		e.conns.mu.Lock()
		c.read = nil // a reload changed the cluster's resources: look again
		e.conns.mu.Unlock()
		return
	}
	e.conns.mu.Lock()
	c.forWatcher, c.core = forWatcher, core
	c.inUse = body
	c.rotations++
	c.lastErr = ""
	c.backoff, c.retryAt = 0, time.Time{}
	e.conns.mu.Unlock()
	// The new connection may reach another cluster: its identity is read
	// again, and, until each resource has listed through it, a snapshot
	// marks the cluster's part to be listed, not resumed.
	e.identOf(c.name).Forget()
	for i, w := range parts {
		w.Rotate(clients[i])
	}
	log.Info("kubeconfig taken: the cluster's resources list again through the new connection", "server", cfg.Host, "resources", len(parts))
}

// backToInUse takes a kubeconfig file written back to the content of
// the connection in use (after a write caught half-way, say): no
// rotation, and no refusal left to tell.
func (e *Engine) backToInUse(c *connection, log *slog.Logger) {
	e.conns.mu.Lock()
	hadErr := c.lastErr != ""
	c.lastErr = ""
	c.backoff, c.retryAt = 0, time.Time{}
	e.conns.mu.Unlock()
	if hadErr {
		log.Info("kubeconfig back to the one in use: nothing to take")
	}
}

// reconnect prepares the connections of a reload from old's clusters to
// next's: it builds those of the clusters that next adds or changes
// (kubeconfig, context), and returns which clusters are unchanged and
// the function that installs the new connections. A cluster that cannot
// be connected to fails the reload, before anything changed.
func (cs *connections) reconnect(old, next *compiled.Plan) (unchanged map[string]bool, install func(), err error) {
	was := map[string]compiled.Cluster{}
	for _, c := range old.Clusters {
		was[c.Name] = c
	}
	unchanged = map[string]bool{}
	built := map[string]*connection{}
	for _, c := range next.Clusters {
		if w, ok := was[c.Name]; ok && w == c {
			unchanged[c.Name] = true
			continue
		}
		cfg := cs.given[c.Name]
		var read []byte
		switch {
		case cfg != nil:
		case c.Kubeconfig == "":
			cfg = cs.own
		default:
			if cfg, read, err = loadKubeconfig(c.Kubeconfig, c.Context); err != nil {
				return nil, nil, fmt.Errorf("cluster %s: kubeconfig %s: %w", c.Name, c.Kubeconfig, err)
			}
		}
		forWatcher, core, err := clientsOf(cfg)
		if err != nil {
			return nil, nil, fmt.Errorf("cluster %s: %w", c.Name, err)
		}
		if _, had := was[c.Name]; had {
			// A cluster's new kubeconfig or context must list and watch
			// each of its resources before it replaces the one that works,
			// as a rotated file must.
			if err := probeAll(next, c.Name, forWatcher); err != nil {
				return nil, nil, fmt.Errorf("cluster %s: %w", c.Name, err)
			}
		}
		conn := &connection{name: c.Name, forWatcher: forWatcher, core: core, read: read, inUse: read}
		if cs.given[c.Name] == nil && c.Kubeconfig != "" {
			conn.file, conn.context = c.Kubeconfig, c.Context
		}
		cs.mu.Lock()
		if prev := cs.byName[c.Name]; prev != nil {
			// The counters are totals: a reload does not set them back.
			conn.rotations, conn.errors = prev.rotations, prev.errors
		}
		cs.mu.Unlock()
		built[c.Name] = conn
	}
	return unchanged, func() {
		cs.mu.Lock()
		defer cs.mu.Unlock()
		for name, c := range built {
			cs.byName[name] = c
		}
		for name := range cs.byName {
			if !slices.ContainsFunc(next.Clusters, func(c compiled.Cluster) bool { return c.Name == name }) {
				delete(cs.byName, name)
			}
		}
	}, nil
}

// probeAll probes (see watcher.probe) each resource of p that cluster
// reads, through the clients that forWatcher makes, within 15 s.
func probeAll(p *compiled.Plan, cluster string, forWatcher func(w *follow.Watcher) (rest.Interface, error)) error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for _, r := range p.Resources {
		if !slices.Contains(p.ClustersOf(r), cluster) {
			continue
		}
		w := &follow.Watcher{Plan: r}
		client, err := forWatcher(w)
		if err != nil {
			return err
		}
		if err := w.Probe(ctx, client); err != nil {
			return fmt.Errorf("the new connection cannot list and watch %s: %w", r.Name, err)
		}
	}
	return nil
}

// loadKubeconfig reads the kubeconfig file path and returns its REST
// config at context ("" for its current one), with the bytes it read.
// It is the one loader of a cluster's kubeconfig, at start, on a
// rotation and on a reload.
func loadKubeconfig(path, context string) (*rest.Config, []byte, error) {
	body, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	cfg, err := kubeconfigOf(path, body, context)
	return cfg, body, err
}

// kubeconfigOf reads body, the content of the kubeconfig file path, at
// context ("" for its current one). As client-go's loader does, the
// paths it holds (certificate authority, client certificate and key,
// token file) are relative to the file's folder: a kubeconfig made from
// a Secret volume names its files so.
func kubeconfigOf(path string, body []byte, context string) (*rest.Config, error) {
	raw, err := clientcmd.Load(body)
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	for _, c := range raw.Clusters {
		c.LocationOfOrigin = abs
	}
	for _, a := range raw.AuthInfos {
		a.LocationOfOrigin = abs
	}
	if err := clientcmd.ResolveLocalPaths(raw); err != nil {
		return nil, err
	}
	return clientcmd.NewNonInteractiveClientConfig(*raw, context, &clientcmd.ConfigOverrides{}, nil).ClientConfig()
}

// kubeconfigState returns the rotations and refusals of the cluster's
// kubeconfig file, with the latest refusal since the last one taken.
func (cs *connections) kubeconfigState(cluster string) (rotations, errors int64, lastErr string) {
	if cs == nil {
		return 0, 0, ""
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if c := cs.byName[cluster]; c != nil {
		return c.rotations, c.errors, c.lastErr
	}
	return 0, 0, ""
}

// clientsOf builds, for one cluster's config, the function that gives a
// watcher its REST client and a client of the core API group; the
// clients of one cluster share one HTTP client.
func clientsOf(cfg *rest.Config) (func(w *follow.Watcher) (rest.Interface, error), rest.Interface, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.AcceptContentTypes = "application/json"
	cfg.ContentType = "application/json"
	if cfg.UserAgent == "" {
		cfg.UserAgent = "metasync"
	}
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("build HTTP client: %w", err)
	}
	clientFor := func(w *follow.Watcher) (rest.Interface, error) {
		r := w.Plan
		rc := rest.CopyConfig(cfg)
		gv := schema.GroupVersion{Group: r.GVR.Group, Version: r.GVR.Version}
		rc.GroupVersion = &gv
		rc.APIPath = "/apis"
		if gv.Group == "" {
			rc.APIPath = "/api"
		}
		rc.NegotiatedSerializer = &follow.Codec{Project: w.Project}
		client, err := rest.RESTClientForConfigAndClient(rc, httpClient)
		if err != nil {
			return nil, fmt.Errorf("resource %s: %w", r.Name, err)
		}
		return client, nil
	}
	core := rest.CopyConfig(cfg)
	core.GroupVersion, core.APIPath = &schema.GroupVersion{Version: "v1"}, "/api"
	core.NegotiatedSerializer = &follow.Codec{Project: func(string) *follow.Projected { return &follow.Projected{} }}
	coreClient, err := rest.RESTClientForConfigAndClient(core, httpClient)
	if err != nil {
		return nil, nil, fmt.Errorf("build the core API client: %w", err)
	}
	return clientFor, coreClient, nil
}
