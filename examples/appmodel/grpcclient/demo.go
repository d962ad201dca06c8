package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sschema "k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/internal/kubeapply"
)

// The demo's names: an app that serves one model, in the namespace of the
// example's config.
const (
	demoNamespace = "meta-test"
	demoApp       = "grpc-demo"
	demoModel     = "grpc-demo-model"
)

// startDemo runs two gRPC health servers on this machine's first
// non-loopback IPv4 address (an EndpointSlice may not hold a loopback
// address) and writes
// what points at them: an AppModel that serves demoModel and, as the
// EndpointSlice controller would, a Service with one slice per backend,
// each with its port named http. It returns when they are written;
// cleanup stops the servers and deletes the objects. It writes to the
// cluster of cfg: meant for `make run`'s.
func startDemo(ctx context.Context, cfg *rest.Config, out io.Writer) (cleanup func(), err error) {
	var servers []*grpc.Server
	var addrs []string
	objs := []*unstructured.Unstructured{
		obj("iidp.com/v1", "AppModel", demoApp, map[string]any{"iidp": "iidp"},
			map[string]any{"spec": map[string]any{"type": "model", "version": "1", "models": []any{demoModel}}}),
		obj("v1", "Service", demoApp, nil,
			map[string]any{"spec": map[string]any{"ports": []any{map[string]any{"name": "http", "port": int64(80)}}}}),
	}
	stop := func() {
		for _, s := range servers {
			s.Stop()
		}
	}
	ip, err := localIPv4()
	if err != nil {
		return nil, err
	}
	for i := 0; i < 2; i++ {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			stop()
			return nil, err
		}
		s := grpc.NewServer()
		healthpb.RegisterHealthServer(s, health.NewServer())
		go func() { _ = s.Serve(ln) }()
		servers = append(servers, s)
		addrs = append(addrs, ln.Addr().String())
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		n, _ := strconv.ParseInt(port, 10, 64)
		objs = append(objs, obj("discovery.k8s.io/v1", "EndpointSlice", fmt.Sprintf("%s-%d", demoApp, i),
			map[string]any{"kubernetes.io/service-name": demoApp},
			map[string]any{
				"addressType": "IPv4",
				"ports":       []any{map[string]any{"name": "http", "port": n}},
				"endpoints":   []any{map[string]any{"addresses": []any{ip}, "conditions": map[string]any{"ready": true}}},
			}))
	}
	applyCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// Never over another's objects: the demo writes only names that are
	// free, and deletes only what it wrote.
	if taken, err := existing(applyCtx, cfg, objs); err != nil || taken != "" {
		stop()
		if err == nil {
			err = fmt.Errorf("%s exists already; the demo does not touch it (delete it, or run the demo on make run's cluster)", taken)
		}
		return nil, fmt.Errorf("demo: %w", err)
	}
	if err := kubeapply.Apply(applyCtx, cfg, objs...); err != nil {
		stop()
		_ = deleteAll(cfg, objs)
		return nil, fmt.Errorf("demo: write its AppModel, Service and slices (is this make run's cluster, with the AppModel CRD?): %w", err)
	}
	fmt.Fprintf(out, "demo: backends %v serve model %s (AppModel, Service and EndpointSlices %s in %s)\n", addrs, demoModel, demoApp, demoNamespace)
	return func() {
		stop()
		if err := deleteAll(cfg, objs); err != nil {
			fmt.Fprintf(out, "demo: delete its objects: %v\n", err)
		}
	}, nil
}

// obj is an object of the demo, in demoNamespace.
func obj(apiVersion, kind, name string, labels map[string]any, fields map[string]any) *unstructured.Unstructured {
	meta := map[string]any{"name": name, "namespace": demoNamespace}
	if labels != nil {
		meta["labels"] = labels
	}
	o := map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": meta}
	for k, v := range fields {
		o[k] = v
	}
	return &unstructured.Unstructured{Object: o}
}

// demoResources are the resources of the demo's kinds.
var demoResources = map[string]k8sschema.GroupVersionResource{
	"AppModel":      {Group: "iidp.com", Version: "v1", Resource: "appmodels"},
	"Service":       {Version: "v1", Resource: "services"},
	"EndpointSlice": {Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"},
}

// existing names the first of objs that exists already ("" if none).
func existing(ctx context.Context, cfg *rest.Config, objs []*unstructured.Unstructured) (string, error) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	for _, o := range objs {
		_, err := dyn.Resource(demoResources[o.GetKind()]).Namespace(demoNamespace).Get(ctx, o.GetName(), metav1.GetOptions{})
		switch {
		case err == nil:
			return fmt.Sprintf("%s %s/%s", o.GetKind(), demoNamespace, o.GetName()), nil
		case !apierrors.IsNotFound(err):
			return "", err
		}
	}
	return "", nil
}

// deleteAll deletes the demo's objects, each it can: one already gone is
// no error.
func deleteAll(cfg *rest.Config, objs []*unstructured.Unstructured) error {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs []error
	for _, o := range objs {
		err := dyn.Resource(demoResources[o.GetKind()]).Namespace(demoNamespace).Delete(ctx, o.GetName(), metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// localIPv4 is this machine's first IPv4 address that an EndpointSlice
// may hold: not loopback, not link-local.
func localIPv4() (string, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", err
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip := n.IP.To4(); ip != nil && !ip.IsLoopback() && !ip.IsLinkLocalUnicast() {
				return ip.String(), nil
			}
		}
	}
	return "", fmt.Errorf("demo: no IPv4 address but loopback to serve on (an EndpointSlice may not point at 127.0.0.1)")
}
