// Command appmodel walks through the reference setup with the library:
//
//  1. an app registers its models in an AppModel with server-side apply and
//     a field manager, the seed's write path, and another writer that
//     claims the same field without force gets a conflict;
//  2. an engine built from config.yaml resolves model -> app -> pod IPs
//     from memory, with typed access to each app's fields;
//  3. a subscription follows a model's addresses while a pod of its app
//     comes and goes.
//
// Run it against a cluster that has crd.yaml and routing.yaml applied:
//
//	go run ./examples/appmodel --kubeconfig ~/.kube/config
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	mschema "github.com/iidp/metasync/schema"
	msync "github.com/iidp/metasync/sync"
)

// AppModel is the typed view of the fields that config.yaml projects.
type AppModel struct {
	Name    string   `json:"name"`
	Type    string   `json:"type"`
	Version string   `json:"version"`
	Models  []string `json:"models"`
}

var appModelGVR = schema.GroupVersionResource{Group: "iidp.com", Version: "v1", Resource: "appmodels"}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "appmodel:", err)
		os.Exit(1)
	}
}

func run() error {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file")
	config := flag.String("config", "examples/appmodel/config.yaml", "metasync config")
	namespace := flag.String("namespace", "meta-test", "namespace of the AppModels (as in the config)")
	models := flag.String("models", "iiot_dataservice,model1", "models to resolve, comma-separated")
	follow := flag.String("follow", "iiot_dataservice", "model whose addresses to follow while a pod comes and goes (\"\": none)")
	flag.Parse()

	restCfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	client, err := dynamic.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	appModels := client.Resource(appModelGVR).Namespace(*namespace)

	// 1. The app registers its models: server-side apply, its own field
	// manager, and force, so that it owns spec.models whatever was there.
	iiot := appModel("iiot", "2.8.2", "iiot_dataservice", "iiot_edge_project", "iiot_data_query")
	if _, err := appModels.Apply(ctx, "iiot", iiot, metav1.ApplyOptions{FieldManager: "iiot-registrar", Force: true}); err != nil {
		return fmt.Errorf("register iiot: %w", err)
	}
	fmt.Println("registered app iiot: models iiot_dataservice, iiot_edge_project, iiot_data_query (field manager iiot-registrar)")

	// Another writer claims the same field without force: the apiserver
	// refuses with a conflict that names the owner, and changes nothing.
	intruder := appModel("iiot", "9.9", "stolen_model")
	_, err = appModels.Apply(ctx, "iiot", intruder, metav1.ApplyOptions{FieldManager: "another-team"})
	switch {
	case apierrors.IsConflict(err):
		fmt.Printf("another-team without force: conflict, nothing changed (%v)\n", err)
	case err != nil:
		return err
	default:
		return fmt.Errorf("another-team took spec.models without force")
	}

	// 2. Resolve from memory with the library.
	plan, err := mschema.LoadPlan(*config, mschema.LoadOptions{Environ: os.Environ()})
	if err != nil {
		return err
	}
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	engine, err := msync.New(plan, restCfg, msync.Options{Logger: quiet})
	if err != nil {
		return err
	}
	engineCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = engine.Start(engineCtx); close(done) }()
	defer func() { stop(); <-done }()
	if err := engine.WaitForSync(ctx); err != nil {
		return err
	}

	// Typed access: each app that serves the model, with its own fields
	// and its ready pod IPs.
	for _, model := range strings.Split(*models, ",") {
		rs, err := routes(engine, model)
		if err != nil {
			return err
		}
		for _, r := range rs {
			fmt.Printf("model %s -> app %s (type %s, version %s)\n", model, r.App.Name, r.App.Type, r.App.Version)
			fmt.Printf("app %s -> %s\n", r.App.Name, strings.Join(r.Addresses, ", "))
		}
		fmt.Printf("chain model-to-addresses: %s -> %s\n", model, strings.Join(engine.Resolve("model-to-addresses", model), ", "))
	}
	if *follow != "" {
		return followModel(ctx, engine, client, *namespace, *follow)
	}
	return nil
}

// followModel subscribes to a model's addresses (the chain follows every
// step: the model's apps and their pods), then starts a pod of its first
// app (an EndpointSlice with one ready address) and stops it, printing
// each answer as it comes.
func followModel(ctx context.Context, engine *msync.Engine, client dynamic.Interface, namespace, model string) error {
	sub, err := engine.Subscribe(ctx, msync.ChainOf("model-to-addresses", model))
	if err != nil {
		return err
	}
	defer sub.Close()
	next := func(what string) error {
		ev, err := sub.Next(ctx)
		if err != nil {
			return fmt.Errorf("follow %s: %w", model, err)
		}
		fmt.Printf("%s: %s -> %s\n", what, model, strings.Join(ev.Values, ", "))
		return nil
	}
	if err := next("follow"); err != nil {
		return err
	}
	rs, err := routes(engine, model)
	if err != nil || len(rs) == 0 {
		return fmt.Errorf("no app serves %s (%v)", model, err)
	}
	app := rs[0].App.Name
	endpointSlices := client.Resource(endpointSliceGVR).Namespace(namespace)
	pod := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
		"metadata":    map[string]any{"name": app + "-follow", "labels": map[string]any{"kubernetes.io/service-name": app}},
		"addressType": "IPv4",
		"endpoints":   []any{map[string]any{"addresses": []any{"10.0.99.1"}, "conditions": map[string]any{"ready": true}}},
	}}
	if _, err := endpointSlices.Apply(ctx, app+"-follow", pod, metav1.ApplyOptions{FieldManager: "appmodel-example", Force: true}); err != nil {
		return fmt.Errorf("start a pod of %s: %w", app, err)
	}
	if err := next("a pod of " + app + " is ready"); err != nil {
		return err
	}
	if err := endpointSlices.Delete(ctx, app+"-follow", metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("stop the pod of %s: %w", app, err)
	}
	return next("the pod of " + app + " is gone")
}

var endpointSliceGVR = schema.GroupVersionResource{Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"}

// Route is where a call for a model can go: an app that serves the model,
// and the ready pod IPs of the app's Service.
type Route struct {
	App       AppModel
	Addresses []string
}

// routes answers, for a model, each app that serves it (ordered by
// namespace/name) with its fields and its addresses. It reads through
// msync.Reader, so that a unit test can give it a metasynctest.Fake
// (routes_test.go) where the program gives it the engine.
func routes(r msync.Reader, model string) ([]Route, error) {
	apps, err := msync.Objects[AppModel](r, "model-to-app", model)
	if err != nil {
		return nil, err
	}
	out := make([]Route, 0, len(apps))
	for _, app := range apps {
		// The app's name is also its Service's name.
		out = append(out, Route{App: app, Addresses: r.Lookup("service-to-addresses", app.Name)})
	}
	return out, nil
}

func appModel(name, version string, models ...string) *unstructured.Unstructured {
	ms := make([]any, len(models))
	for i, m := range models {
		ms[i] = m
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "iidp.com/v1",
		"kind":       "AppModel",
		"metadata":   map[string]any{"name": name, "labels": map[string]any{"iidp": "iidp"}},
		"spec":       map[string]any{"type": "model", "version": version, "models": ms},
	}}
}
