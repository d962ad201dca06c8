package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	compiled "github.com/iidp/metasync/internal/plan"

	"github.com/iidp/metasync/schema"
	"github.com/iidp/metasync/schema/cluster"
)

// validate checks a config file: every problem on its own line and exit 1,
// or a one-line summary and exit 0. CRD files listed under crds: are read
// and every path is checked against their schemas; --cluster also checks
// the cluster (served resources, RBAC, schemas of installed CRDs).
func validate(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("validate", stderr)
	config := fs.String("config", "", "config file (required)")
	diff := fs.String("diff", "", "an older config: print what a reload from it to this one does (resources that start, stop, restart, stay)")
	checkCluster := fs.Bool("cluster", false, "also check against the cluster: resources served, list/watch allowed, paths in CRD schemas")
	kube := addKubeFlags(fs, "kubeconfig file, with --cluster", "kubeconfig context, with --cluster")
	if err := fs.Parse(args); err != nil {
		return exitError{2}
	}
	// The file may come as an argument instead of --config (flags may
	// follow it).
	if fs.NArg() > 0 && *config == "" {
		file := fs.Arg(0)
		if err := fs.Parse(fs.Args()[1:]); err != nil {
			return exitError{2}
		}
		if *config != "" {
			fmt.Fprintln(stderr, "metasync validate: give the config file once: --config FILE or FILE")
			return exitError{2}
		}
		_ = fs.Set("config", file)
	}
	if err := envForFlags(fs, stderr); err != nil {
		return err
	}
	if *config == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "metasync validate: one config file is required (--config FILE, or FILE), and nothing else")
		return exitError{2}
	}
	plan, err := schema.LoadPlan(*config, schema.LoadOptions{Environ: os.Environ(), CheckAll: true})
	if err != nil && plan == nil {
		printProblems(stderr, err)
		return exitError{1}
	}
	// A plan with problems of policy only is checked on: every problem
	// is reported in one run.
	problems := schema.Problems(err)
	var notes []string
	var crds []*cluster.CRD
	if len(plan.CRDs()) > 0 {
		var err error
		crds, err = cluster.ReadCRDs(plan.CRDs())
		problems = append(problems, schema.Problems(err)...)
		n, err := cluster.CheckPaths(plan, crds)
		notes = append(notes, n...)
		problems = append(problems, schema.Problems(err)...)
	}
	// Each cluster's kubeconfig file must be there and name a cluster.
	clusterConfigs, errs := clusterKubeconfigs(plan)
	problems = append(problems, errs...)
	// What the clusters say of each resource's scope: the shape of an
	// index's default values (the object key) for the chain warnings.
	var scopes cluster.Scopes
	if *checkCluster {
		own, _, err := kube.restConfig()
		if err != nil {
			fmt.Fprintln(stderr, "metasync validate --cluster:", err)
			return exitError{1}
		}
		scopes = cluster.Scopes{}
		n, errs := checkClusters(plan, own, clusterConfigs, crds, scopes)
		notes, problems = append(notes, n...), append(problems, errs...)
	}
	unchecked := 0
	if !*checkCluster {
		n := cluster.UncheckedPaths(plan, crds)
		unchecked = len(n)
		notes = append(notes, n...)
	}
	warnings, chainNotes := cluster.Advise(plan, crds, scopes)
	for _, n := range append(notes, chainNotes...) {
		fmt.Fprintln(stdout, "note:", n)
	}
	for _, w := range warnings {
		fmt.Fprintln(stdout, "warning:", w)
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(stderr, p)
		}
		return exitError{1}
	}
	if *diff != "" {
		old, err := schema.LoadPlan(*diff, schema.LoadOptions{Environ: os.Environ()})
		if err != nil {
			fmt.Fprintf(stderr, "metasync validate --diff %s: the old config is invalid:\n", *diff)
			printProblems(stderr, err)
			return exitError{1}
		}
		printChanges(stdout, schema.Compare(old, plan))
	}
	where := ""
	switch {
	case *checkCluster:
		where = " (checked against the cluster)"
	case unchecked > 0:
		where = fmt.Sprintf(" (paths of %s not checked: see the note; --cluster checks them)", plural(unchecked, "resource", "resources"))
	}
	fmt.Fprintf(stdout, "%s: valid: %s%s\n", *config, counts(plan), where)
	return nil
}

// counts says how many resources, indexes and chains plan has.
func counts(plan *schema.Plan) string {
	indexes := 0
	for _, r := range compiled.Of(plan).Resources {
		for _, ix := range r.Indexes {
			if !ix.Hidden() {
				indexes++
			}
		}
	}
	return fmt.Sprintf("%s, %s, %s", plural(len(compiled.Of(plan).Resources), "resource", "resources"),
		plural(indexes, "index", "indexes"), plural(len(compiled.Of(plan).Chains), "chain", "chains"))
}

// clusterKubeconfigs reads the kubeconfig of each cluster that names one:
// the REST config of each, and a problem for each that cannot be read.
func clusterKubeconfigs(plan *schema.Plan) (map[string]*rest.Config, []error) {
	configs := map[string]*rest.Config{}
	var problems []error
	for i, c := range compiled.Of(plan).Clusters {
		if c.Kubeconfig == "" {
			continue
		}
		cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: c.Kubeconfig},
			&clientcmd.ConfigOverrides{CurrentContext: c.Context}).ClientConfig()
		if err != nil {
			problems = append(problems, fmt.Errorf("clusters[%d].kubeconfig: %s: %v", i, c.Kubeconfig, err))
			continue
		}
		configs[c.Name] = cfg
	}
	return configs, problems
}

// checkClusters checks plan against each cluster it reads (own, without
// clusters:), each through its kubeconfig (configs) or own: what each
// cluster's notes and problems are, prefixed by its name. It records in
// scopes whether each resource is namespaced, as the clusters serve it.
func checkClusters(plan *schema.Plan, own *rest.Config, configs map[string]*rest.Config, crds []*cluster.CRD, scopes cluster.Scopes) (notes []string, problems []error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type check struct {
		name string
		cfg  *rest.Config
	}
	checks := []check{{"", own}}
	if cs := compiled.Of(plan).Clusters; len(cs) > 0 {
		checks = nil
		for _, c := range cs {
			cfg := own
			if c.Kubeconfig != "" {
				if cfg = configs[c.Name]; cfg == nil {
					continue // its kubeconfig is a problem already
				}
			}
			checks = append(checks, check{c.Name, cfg})
		}
	}
	for _, c := range checks {
		n, err := cluster.CheckClusterScopes(ctx, plan, c.name, c.cfg, crds, scopes)
		if c.name != "" {
			for i := range n {
				n[i] = "cluster " + c.name + ": " + n[i]
			}
			for _, p := range schema.Problems(err) {
				problems = append(problems, fmt.Errorf("cluster %s: %w", c.name, p))
			}
		} else {
			problems = append(problems, schema.Problems(err)...)
		}
		notes = append(notes, n...)
	}
	return notes, problems
}

// printChanges prints what a reload does, one line per kind of change.
func printChanges(w io.Writer, c schema.Changes) {
	line := func(what string, names []string) {
		if len(names) > 0 {
			fmt.Fprintf(w, "%-15s %s\n", what+":", strings.Join(names, ", "))
		}
	}
	line("start", c.Start)
	line("stop", c.Stop)
	line("restart", c.Restart)
	line("keep", c.Keep)
	line("chains added", c.ChainsAdded)
	line("chains removed", c.ChainsRemoved)
	line("chains changed", c.ChainsChanged)
	line("unique changed", c.Unique)
	if c.CRDs {
		fmt.Fprintln(w, "crds:           the list changed; a reload applies the new files")
	}
	for _, s := range c.NotLive {
		fmt.Fprintf(w, "needs restart:  %s (a reload keeps the running value)\n", s)
	}
	if c.None() && !c.CRDs && len(c.NotLive) == 0 {
		fmt.Fprintln(w, "no change: a reload keeps every watch and index")
	}
}
