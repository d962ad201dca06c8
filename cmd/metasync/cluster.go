package main

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// kubeFlags are the --kubeconfig and --context flags of a command that
// talks to a cluster (serve, validate --cluster).
type kubeFlags struct {
	kubeconfig, context *string
}

// addKubeFlags defines --kubeconfig and --context on fs, with the help
// each command gives them.
func addKubeFlags(fs *flag.FlagSet, kubeconfigHelp, contextHelp string) kubeFlags {
	return kubeFlags{
		kubeconfig: fs.String("kubeconfig", "", kubeconfigHelp),
		context:    fs.String("context", "", contextHelp),
	}
}

// restConfig is the cluster the flags name, and where its config came
// from: see the function restConfig.
func (k kubeFlags) restConfig() (*rest.Config, string, error) {
	return restConfig(*k.kubeconfig, *k.context)
}

// restConfig finds the cluster: --kubeconfig, then $KUBECONFIG, then
// in-cluster, then ~/.kube/config. It returns where the config came from.
func restConfig(path, context string) (*rest.Config, string, error) {
	overrides := &clientcmd.ConfigOverrides{CurrentContext: context}
	load := func(rules *clientcmd.ClientConfigLoadingRules) (*rest.Config, error) {
		return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	}
	switch {
	case path != "":
		cfg, err := load(&clientcmd.ClientConfigLoadingRules{ExplicitPath: path})
		return cfg, path, err
	case os.Getenv("KUBECONFIG") != "":
		files := filepath.SplitList(os.Getenv("KUBECONFIG"))
		cfg, err := load(&clientcmd.ClientConfigLoadingRules{Precedence: files})
		return cfg, strings.Join(files, string(filepath.ListSeparator)) + " (from KUBECONFIG)", err
	}
	if context == "" {
		if cfg, err := rest.InClusterConfig(); err == nil {
			return cfg, "in-cluster", nil
		}
	}
	home := clientcmd.RecommendedHomeFile
	if _, err := os.Stat(home); err != nil {
		return nil, "", errors.New("no kubeconfig: give --kubeconfig, set KUBECONFIG, run in a pod, or create " + home)
	}
	cfg, err := load(&clientcmd.ClientConfigLoadingRules{ExplicitPath: home})
	return cfg, home, err
}
