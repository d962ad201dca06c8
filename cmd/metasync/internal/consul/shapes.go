package consul

import (
	"net"
	"slices"
	"strconv"
)

// What Consul's clients read, in Consul's own field names. Fields that
// metasync has nothing for are left out where hashicorp/consul/api reads
// them as optional, and empty where it expects them.

// node is a Consul node: metasync makes one per instance host.
type node struct {
	ID              string
	Node            string
	Address         string
	Datacenter      string
	TaggedAddresses map[string]string
	Meta            map[string]string
	CreateIndex     uint64
	ModifyIndex     uint64
}

// weights are a service's weights in DNS answers.
type weights struct {
	Passing, Warning int
}

// agentService is the Service of a health answer.
type agentService struct {
	Kind              string
	ID                string
	Service           string
	Tags              []string
	Meta              map[string]string
	Port              int
	Address           string
	TaggedAddresses   map[string]any
	Weights           weights
	EnableTagOverride bool
	CreateIndex       uint64
	ModifyIndex       uint64
}

// healthCheck is the one check of an instance: passing, since metasync
// answers only what Kubernetes says is ready (or serving, while it
// terminates).
type healthCheck struct {
	Node        string
	CheckID     string
	Name        string
	Status      string
	Notes       string
	Output      string
	ServiceID   string
	ServiceName string
	ServiceTags []string
	Type        string
	CreateIndex uint64
	ModifyIndex uint64
}

// serviceEntry is one element of GET /v1/health/service/{name}.
type serviceEntry struct {
	Node    node
	Service agentService
	Checks  []healthCheck
}

// catalogService is one element of GET /v1/catalog/service/{name}.
type catalogService struct {
	ID                       string
	Node                     string
	Address                  string
	Datacenter               string
	TaggedAddresses          map[string]string
	NodeMeta                 map[string]string
	ServiceKind              string
	ServiceID                string
	ServiceName              string
	ServiceTags              []string
	ServiceAddress           string
	ServiceTaggedAddresses   map[string]any
	ServiceWeights           weights
	ServiceMeta              map[string]string
	ServicePort              int
	ServiceEnableTagOverride bool
	CreateIndex              uint64
	ModifyIndex              uint64
}

// instance is one host:port value of a service, and the source that
// gave it.
type instance struct {
	host   string
	port   int
	source string
}

// hostPort reads a value as host:port: ok when it has a host and a port
// from 1 to 65535. An IP address is spelled one way.
func hostPort(v string) (host string, port int, ok bool) {
	h, p, err := net.SplitHostPort(v)
	if err != nil || h == "" {
		return "", 0, false
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || n == 0 {
		return "", 0, false
	}
	if ip := net.ParseIP(h); ip != nil {
		h = ip.String()
	}
	return h, int(n), true
}

// instances returns the host:port values of values, each once, sorted,
// as instances of source.
func instances(values []string, source string) []instance {
	var out []instance
	for _, v := range values {
		if h, p, ok := hostPort(v); ok {
			out = append(out, instance{h, p, source})
		}
	}
	slices.SortFunc(out, compareInstances)
	return slices.CompactFunc(out, func(a, b instance) bool { return a.host == b.host && a.port == b.port })
}

func compareInstances(a, b instance) int {
	if a.host != b.host {
		if a.host < b.host {
			return -1
		}
		return 1
	}
	return a.port - b.port
}

// id is the instance's service ID: unique per instance of a node, as
// Consul wants it.
func (in instance) id(service string) string {
	return service + ":" + net.JoinHostPort(in.host, strconv.Itoa(in.port))
}

// health is the instance as GET /v1/health/service answers it.
func (in instance) health(service string, index uint64) serviceEntry {
	id := in.id(service)
	return serviceEntry{
		Node: node{Node: in.host, Address: in.host, Datacenter: Datacenter,
			TaggedAddresses: map[string]string{"lan": in.host}, Meta: map[string]string{}, CreateIndex: index, ModifyIndex: index},
		Service: agentService{ID: id, Service: service, Tags: []string{}, Meta: map[string]string{"metasync_source": in.source},
			Port: in.port, Address: in.host, TaggedAddresses: map[string]any{}, Weights: weights{1, 1}, CreateIndex: index, ModifyIndex: index},
		Checks: []healthCheck{{Node: in.host, CheckID: "metasync:" + id, Name: "Kubernetes readiness", Status: "passing",
			Output: "ready (or serving while terminating) in its EndpointSlice, as metasync answers it", ServiceID: id,
			ServiceName: service, ServiceTags: []string{}, CreateIndex: index, ModifyIndex: index}},
	}
}

// catalog is the instance as GET /v1/catalog/service answers it.
func (in instance) catalog(service string, index uint64) catalogService {
	return catalogService{Node: in.host, Address: in.host, Datacenter: Datacenter,
		TaggedAddresses: map[string]string{"lan": in.host}, NodeMeta: map[string]string{},
		ServiceID: in.id(service), ServiceName: service, ServiceTags: []string{}, ServiceAddress: in.host,
		ServiceTaggedAddresses: map[string]any{}, ServiceWeights: weights{1, 1},
		ServiceMeta: map[string]string{"metasync_source": in.source}, ServicePort: in.port,
		CreateIndex: index, ModifyIndex: index}
}
