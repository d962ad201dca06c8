package schema

import (
	"slices"
	"testing"

	"github.com/iidp/metasync/internal/plan"
)

func TestClustersProblems(t *testing.T) {
	wantProblems(t, "testdata/clusters.bad.yaml", []string{
		`clusters[1].name: "East_1": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')`,
		`clusters[2].kubeconfig: required: only one cluster is the daemon's own connection (the one without kubeconfig)`,
		`clusters[3].dropAfter: -1m0s is negative; omit it for never`,
		`clusters[4].name: cluster "south" declared twice (first at clusters[3])`,
		`resources[0].clusters[1]: unknown cluster "wset" (known: east, south, west)`,
	})
}

func TestClustersCompile(t *testing.T) {
	p, err := LoadPlan("testdata/clusters.good.yaml", LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cp := plan.Of(p)
	want := []plan.Cluster{
		{Name: "east", Required: true, Home: true},
		{Name: "west", Kubeconfig: "/etc/metasync/clusters/west/kubeconfig", Context: "west-reader"},
	}
	if !slices.Equal(cp.Clusters, want) {
		t.Fatalf("clusters %+v, want %+v", cp.Clusters, want)
	}
	if got := cp.ClustersOf(cp.Resources[0]); !slices.Equal(got, []string{"west"}) {
		t.Fatalf("the entry's clusters: %q", got)
	}
}
