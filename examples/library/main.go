// Command library is the program of docs/library.md ("Use it as a library"): it
// keeps the indexes of a metasync config in memory, answers a lookup, a
// chain and typed fields for one model, then keeps the indexes up to date
// until Ctrl-C or SIGTERM.
//
// The cluster is found as kubectl finds it: --kubeconfig, else the files
// in KUBECONFIG, else ~/.kube/config, else the pod's service account.
//
//	go run ./examples/library --config examples/appmodel/config.yaml --model model1
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

// AppModel is the typed view of the fields that the config projects
// (fields: type, version, models).
type AppModel struct {
	Type    string   `json:"type"`
	Version string   `json:"version"`
	Models  []string `json:"models"`
}

func main() {
	// Ctrl-C or SIGTERM cancels ctx: the engine stops and run returns.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "library:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	flags := flag.NewFlagSet("library", flag.ContinueOnError)
	kubeconfig := flags.String("kubeconfig", "", "kubeconfig file (default: KUBECONFIG, ~/.kube/config, in-cluster)")
	kubecontext := flags.String("context", "", "kubeconfig context (default: the current one)")
	config := flags.String("config", "examples/appmodel/config.yaml", "metasync config file")
	model := flags.String("model", "iiot_dataservice", "model to resolve")
	if err := flags.Parse(args); err != nil {
		return err
	}

	// The *rest.Config, from client-go's default loading rules; they fall
	// back to the in-cluster config when no kubeconfig file is found.
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = *kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: *kubecontext}
	restConfig, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}

	// The plan: the config file, validated and compiled. Without a file:
	// schema.Compile(&schema.Config{...}).
	plan, err := schema.LoadPlan(*config, schema.LoadOptions{Environ: os.Environ()})
	if err != nil {
		return err
	}
	engine, err := msync.New(plan, restConfig, msync.Options{Logger: slog.Default()})
	if err != nil {
		return err
	}

	// Start runs one watch per resource until ctx ends; wait for it to
	// return before returning.
	ctx, cancel := context.WithCancel(ctx)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		_ = engine.Start(ctx) // fails only when started twice
	}()
	defer func() { cancel(); <-stopped }()

	// Every resource listed once: every object written before Start is
	// now visible.
	syncCtx, syncDone := context.WithTimeout(ctx, time.Minute)
	defer syncDone()
	if err := engine.WaitForSync(syncCtx); err != nil {
		return err
	}

	// From memory, without locks: the apps that serve the model, and the
	// addresses at the end of the chain model -> app -> addresses.
	apps := engine.Lookup("model-to-app", *model)
	addresses := engine.Resolve("model-to-addresses", *model)
	fmt.Fprintf(out, "model %s: apps %s; addresses %s\n", *model, strings.Join(apps, ", "), strings.Join(addresses, ", "))

	// Typed: the projected fields of every AppModel behind the model,
	// ordered by object key (namespace/name), not in the order of apps.
	objs, err := msync.Objects[AppModel](engine, "model-to-app", *model)
	if err != nil {
		return err
	}
	for _, o := range objs {
		fmt.Fprintf(out, "model %s: AppModel type %s, version %s, models %s\n", *model, o.Type, o.Version, strings.Join(o.Models, ", "))
	}

	// The indexes follow the cluster until Ctrl-C or SIGTERM.
	slog.Info("synced; watching until Ctrl-C")
	<-ctx.Done()
	return nil
}
