// Command xdspeer is the xDS server a user would build instead of
// `metasync serve --xds-listen`, for hack/xdsload to measure beside it:
// go-control-plane's state-of-the-world server (pkg/server/v3) over
// grpc-go, with one LinearCache per resource type behind a MuxCache, fed
// by plain client-go informers of the reference setup's resources
// (examples/appmodel/config.yaml): AppModels (label iidp=iidp) and the
// EndpointSlices of their apps (label kubernetes.io/service-name), in
// one namespace.
//
// For each model M that an AppModel claims (the oldest AppModel when two
// claim it), it serves what metasync serves for the target
// chains/model-to-endpoints/M, in the same shapes: the Listener of that
// name (an API listener whose HTTP connection manager, with the router
// filter, takes its routes from the RouteConfiguration of the same name
// over ADS), the RouteConfiguration (one virtual host "*" routing
// everything to the Cluster of the same name), the Cluster (EDS over
// ADS, round robin) and its ClusterLoadAssignment: the ready endpoints
// (conditions.ready true or unset; when none is, the serving terminating
// ones) of the app's slices, each address once with the port named
// -port, weight 1, healthy, one locality.
//
// It serves xDS once the informers have synced. On -listen it answers
// GET /readyz (200 once serving) and GET /metrics: the Go runtime's and
// the process's metrics, xdspeer_xds_clients (ADS streams open) and
// xdspeer_xds_pushes_total{type} (responses sent: listener, route,
// cluster, endpoint).
//
//	go run ./hack/xdspeer -kubeconfig KUBECONFIG -namespace NS -listen 127.0.0.1:8081 -xds-listen 127.0.0.1:18001
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// chain is the target prefix of the resources served, as metasync names
// them.
const chain = "chains/model-to-endpoints/"

// serviceLabel names an EndpointSlice's Service: the app.
const serviceLabel = "kubernetes.io/service-name"

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	namespace := flag.String("namespace", "", "namespace of the AppModels and EndpointSlices (default: all)")
	listen := flag.String("listen", "127.0.0.1:8081", "HTTP address of /readyz and /metrics")
	xdsListen := flag.String("xds-listen", "127.0.0.1:18001", "xDS (ADS) address")
	port := flag.String("port", "http", "the EndpointSlice port whose number the endpoints take")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, log, *kubeconfig, *namespace, *listen, *xdsListen, *port); err != nil {
		fmt.Fprintln(os.Stderr, "xdspeer:", err)
		os.Exit(1)
	}
}

// The four resource types.
var typeURLs = []string{resourcev3.ListenerType, resourcev3.RouteType, resourcev3.ClusterType, resourcev3.EndpointType}

// shortType names a type URL in metrics.
var shortType = map[string]string{
	resourcev3.ListenerType: "listener",
	resourcev3.RouteType:    "route",
	resourcev3.ClusterType:  "cluster",
	resourcev3.EndpointType: "endpoint",
}

func run(ctx context.Context, log *slog.Logger, kubeconfig, namespace, listen, xdsListen, port string) error {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	clients := prometheus.NewGauge(prometheus.GaugeOpts{Name: "xdspeer_xds_clients", Help: "ADS streams open."})
	pushes := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "xdspeer_xds_pushes_total", Help: "xDS responses sent, by resource type."}, []string{"type"})
	reg.MustRegister(clients, pushes)
	for _, t := range typeURLs {
		pushes.WithLabelValues(shortType[t])
	}

	caches := map[string]cachev3.Cache{}
	linear := map[string]*cachev3.LinearCache{}
	for _, t := range typeURLs {
		linear[t] = cachev3.NewLinearCache(t)
		caches[t] = linear[t]
	}
	mux := &cachev3.MuxCache{
		Classify:      func(r *cachev3.Request) string { return r.GetTypeUrl() },
		ClassifyDelta: func(r *cachev3.DeltaRequest) string { return r.GetTypeUrl() },
		Caches:        caches,
	}
	st := &state{log: log, port: port, caches: linear, served: map[string]*endpointv3.ClusterLoadAssignment{}}

	apps := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, namespace, func(o *metav1.ListOptions) {
		o.LabelSelector = "iidp=iidp"
	}).ForResource(schema.GroupVersionResource{Group: "iidp.com", Version: "v1", Resource: "appmodels"}).Informer()
	if err := apps.AddIndexers(cache.Indexers{"model": func(obj any) ([]string, error) {
		return modelsOf(obj), nil
	}}); err != nil {
		return err
	}
	slicesFactory := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = serviceLabel }))
	eps := slicesFactory.Discovery().V1().EndpointSlices().Informer()
	if err := eps.AddIndexers(cache.Indexers{"service": func(obj any) ([]string, error) {
		if s, ok := obj.(*discoveryv1.EndpointSlice); ok {
			return []string{s.Labels[serviceLabel]}, nil
		}
		return nil, nil
	}}); err != nil {
		return err
	}
	st.apps, st.slices = apps.GetIndexer(), eps.GetIndexer()

	// The handlers compute what an event changes once both informers
	// have synced; before, the first full pass does.
	if _, err := apps.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { st.modelsChanged(modelsOf(obj)) },
		UpdateFunc: func(old, obj any) { st.modelsChanged(append(modelsOf(old), modelsOf(obj)...)) },
		DeleteFunc: func(obj any) { st.modelsChanged(modelsOf(obj)) },
	}); err != nil {
		return err
	}
	if _, err := eps.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { st.serviceChanged(obj) },
		UpdateFunc: func(old, obj any) { st.serviceChanged(old); st.serviceChanged(obj) },
		DeleteFunc: func(obj any) { st.serviceChanged(obj) },
	}); err != nil {
		return err
	}
	go apps.Run(ctx.Done())
	slicesFactory.Start(ctx.Done())

	var ready atomic.Bool
	mux2 := http.NewServeMux()
	mux2.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux2.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "informers not synced", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	httpLn, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	httpSrv := &http.Server{Handler: mux2, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = httpSrv.Serve(httpLn) }()
	defer httpSrv.Close()

	if !cache.WaitForCacheSync(ctx.Done(), apps.HasSynced, eps.HasSynced) {
		return errors.New("informers did not sync")
	}
	st.syncAll()

	callbacks := serverv3.CallbackFuncs{
		StreamOpenFunc:   func(context.Context, int64, string) error { clients.Inc(); return nil },
		StreamClosedFunc: func(int64, *corev3.Node) { clients.Dec() },
		StreamResponseFunc: func(_ context.Context, _ int64, _ *discoverygrpc.DiscoveryRequest, r *discoverygrpc.DiscoveryResponse) {
			pushes.WithLabelValues(shortType[r.GetTypeUrl()]).Inc()
		},
	}
	xds := serverv3.NewServer(ctx, mux, callbacks)
	// The options of go-control-plane's example server.
	grpcSrv := grpc.NewServer(
		grpc.MaxConcurrentStreams(1000000),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 5 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 30 * time.Second, PermitWithoutStream: true}),
	)
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(grpcSrv, xds)
	xdsLn, err := net.Listen("tcp", xdsListen)
	if err != nil {
		return err
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- grpcSrv.Serve(xdsLn) }()
	ready.Store(true)
	log.Warn("serving xDS", "address", xdsLn.Addr().String(), "http", httpLn.Addr().String())
	select {
	case <-ctx.Done():
		grpcSrv.Stop()
		return nil
	case err := <-serveErr:
		return err
	}
}

// modelsOf is spec.models of an AppModel.
func modelsOf(obj any) []string {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil
	}
	models, _, _ := unstructured.NestedStringSlice(u.Object, "spec", "models")
	return models
}

// state turns the informers' objects into the caches' resources.
type state struct {
	log    *slog.Logger
	port   string
	caches map[string]*cachev3.LinearCache
	apps   cache.Indexer
	slices cache.Indexer

	mu     sync.Mutex
	synced bool
	// served is the assignment in the cache of each model served: a
	// model has its four resources while it is in served.
	served map[string]*endpointv3.ClusterLoadAssignment
}

// syncAll serves every model claimed once the informers have synced.
func (s *state) syncAll() {
	var models []string
	for _, obj := range s.apps.List() {
		models = append(models, modelsOf(obj)...)
	}
	s.mu.Lock()
	s.synced = true
	s.mu.Unlock()
	s.modelsChanged(models)
}

// serviceChanged updates the models of the app whose slice obj is.
func (s *state) serviceChanged(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	slice, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return
	}
	// The app is the AppModel of the Service's name, in the slice's
	// namespace.
	obj, ok, _ = s.apps.GetByKey(slice.Namespace + "/" + slice.Labels[serviceLabel])
	if ok {
		s.modelsChanged(modelsOf(obj))
	}
}

// modelsChanged builds the resources of models again, and updates the
// caches with those that changed.
func (s *state) modelsChanged(models []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.synced {
		return
	}
	slices.Sort(models)
	for _, model := range slices.Compact(models) {
		name := chain + url.PathEscape(model)
		app, ok := s.appOf(model)
		old, served := s.served[model]
		if !ok {
			if served {
				for _, t := range typeURLs {
					_ = s.caches[t].DeleteResource(name)
				}
				delete(s.served, model)
			}
			continue
		}
		cla := s.assignment(name, app)
		if !served {
			_ = s.caches[resourcev3.ListenerType].UpdateResource(name, listenerOf(name))
			_ = s.caches[resourcev3.RouteType].UpdateResource(name, routeOf(name))
			_ = s.caches[resourcev3.ClusterType].UpdateResource(name, clusterOf(name))
		}
		if served && proto.Equal(old, cla) {
			continue
		}
		s.served[model] = cla
		if err := s.caches[resourcev3.EndpointType].UpdateResource(name, cla); err != nil {
			s.log.Warn("updating an assignment", "model", model, "error", err.Error())
		}
	}
}

// appOf is the app of the oldest AppModel that claims model.
func (s *state) appOf(model string) (string, bool) {
	objs, _ := s.apps.ByIndex("model", model)
	var best *unstructured.Unstructured
	for _, obj := range objs {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		if best == nil {
			best = u
			continue
		}
		t, bt := u.GetCreationTimestamp().Time, best.GetCreationTimestamp().Time
		if t.Before(bt) || t.Equal(bt) && u.GetName() < best.GetName() {
			best = u
		}
	}
	if best == nil {
		return "", false
	}
	return best.GetName(), true
}

// assignment is the ClusterLoadAssignment of app's slices.
func (s *state) assignment(name, app string) *endpointv3.ClusterLoadAssignment {
	objs, _ := s.slices.ByIndex("service", app)
	var ready, terminating []string
	for _, obj := range objs {
		slice, ok := obj.(*discoveryv1.EndpointSlice)
		if !ok {
			continue
		}
		var port int32
		for _, p := range slice.Ports {
			if p.Name != nil && *p.Name == s.port && p.Port != nil {
				port = *p.Port
			}
		}
		if port == 0 {
			continue
		}
		for _, e := range slice.Endpoints {
			c := e.Conditions
			for _, a := range e.Addresses {
				addr := net.JoinHostPort(a, strconv.Itoa(int(port)))
				switch {
				case c.Ready == nil || *c.Ready:
					ready = append(ready, addr)
				case c.Serving != nil && *c.Serving && c.Terminating != nil && *c.Terminating:
					terminating = append(terminating, addr)
				}
			}
		}
	}
	addrs := ready
	if len(addrs) == 0 {
		addrs = terminating
	}
	slices.Sort(addrs)
	addrs = slices.Compact(addrs)
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	if len(addrs) == 0 {
		return cla
	}
	l := &endpointv3.LocalityLbEndpoints{Locality: &corev3.Locality{}, LoadBalancingWeight: wrapperspb.UInt32(1)}
	for _, a := range addrs {
		host, p, _ := net.SplitHostPort(a)
		n, _ := strconv.ParseUint(p, 10, 32)
		l.LbEndpoints = append(l.LbEndpoints, &endpointv3.LbEndpoint{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: &corev3.Address{
				Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(n)}}},
			}}},
			HealthStatus:        corev3.HealthStatus_HEALTHY,
			LoadBalancingWeight: wrapperspb.UInt32(1),
		})
	}
	cla.Endpoints = []*endpointv3.LocalityLbEndpoints{l}
	return cla
}

// ads is a ConfigSource naming the ADS stream, API v3.
func ads() *corev3.ConfigSource {
	return &corev3.ConfigSource{
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
		ResourceApiVersion:    corev3.ApiVersion_V3,
	}
}

// listenerOf is the API listener name: an HTTP connection manager with
// the router filter, its routes the RouteConfiguration name over ADS.
func listenerOf(name string) types.Resource {
	router, _ := anypb.New(&routerv3.Router{})
	hcm, _ := anypb.New(&hcmv3.HttpConnectionManager{
		StatPrefix: "xdspeer",
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			ConfigSource:    ads(),
			RouteConfigName: name,
		}},
		HttpFilters: []*hcmv3.HttpFilter{{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}}},
	})
	return &listenerv3.Listener{Name: name, ApiListener: &listenerv3.ApiListener{ApiListener: hcm}}
}

// routeOf is the RouteConfiguration name: one virtual host for every
// domain, everything routed to the Cluster name.
func routeOf(name string) types.Resource {
	return &routev3.RouteConfiguration{Name: name, VirtualHosts: []*routev3.VirtualHost{{
		Name:    name,
		Domains: []string{"*"},
		Routes: []*routev3.Route{{
			Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: ""}},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: name}}},
		}},
	}}}
}

// clusterOf is the EDS Cluster name, round robin, its assignment of the
// same name over ADS.
func clusterOf(name string) types.Resource {
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: ads(), ServiceName: name},
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
	}
}
