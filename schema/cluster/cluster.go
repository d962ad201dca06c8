// Package cluster holds the config checks and setup that talk to a
// cluster: installing the CRD files a config lists, and checking a plan
// against what the cluster serves and allows.
package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	mplan "github.com/iidp/metasync/internal/plan"
	plist "github.com/iidp/metasync/schema/internal/problems"

	authorizationv1 "k8s.io/api/authorization/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	"github.com/iidp/metasync/internal/kubejson"
	"github.com/iidp/metasync/schema"
)

// crdPath is the API path of the CRD called name.
func crdPath(name string) string {
	return kubejson.Path("apis", "apiextensions.k8s.io", "v1", "customresourcedefinitions", name)
}

// InstallCRDs creates or updates the CRDs (server-side apply, field manager
// "metasync") and waits until each is Established, or timeout passes.
func InstallCRDs(ctx context.Context, cfg *rest.Config, crds []*CRD, timeout time.Duration) error {
	client, err := kubejson.New(cfg)
	if err != nil {
		return err
	}
	for _, crd := range crds {
		body, err := json.Marshal(struct {
			APIVersion string                                       `json:"apiVersion"`
			Kind       string                                       `json:"kind"`
			Metadata   map[string]any                               `json:"metadata"`
			Spec       apiextensionsv1.CustomResourceDefinitionSpec `json:"spec"`
		}{"apiextensions.k8s.io/v1", "CustomResourceDefinition", map[string]any{"name": crd.Name}, crd.Spec})
		if err != nil {
			return err
		}
		if err := client.Apply(ctx, crdPath(crd.Name), "metasync", body, nil); err != nil {
			return fmt.Errorf("install CRD %s: %w", crd.Name, err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for _, crd := range crds {
		err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			got := &apiextensionsv1.CustomResourceDefinition{}
			if err := client.Get(ctx, crdPath(crd.Name), got); err != nil {
				return false, nil
			}
			for _, c := range got.Status.Conditions {
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not established after %s", crd.Name, timeout)
		}
	}
	return nil
}

// CheckCluster checks the plan against a cluster: each resource's group,
// version and resource are served and can be listed and watched; the
// caller may list and watch each (SelfSubjectAccessReview); and each path
// fits the CRD's schema where a CRD defines the resource. It reports every
// problem at once; notes are things it could not check.
//
// files are the CRDs of the config's crds: list, which serve installs
// before it watches: a resource one of them defines need not be served
// yet (a note says it is not), its paths are checked against the file
// (CheckPaths, by the caller), not against the cluster's copy, and the
// caller must be allowed to apply CRDs.
func CheckCluster(ctx context.Context, plan *schema.Plan, cfg *rest.Config, files []*CRD) (notes []string, err error) {
	return CheckClusterNamed(ctx, plan, "", cfg, files)
}

// CheckClusterNamed is CheckCluster for the cluster of the plan's
// clusters: list named name, reached through cfg: the resource entries
// not read in it (an entry's own clusters: that leaves it out) are not
// checked there. name "" checks every entry.
func CheckClusterNamed(ctx context.Context, plan *schema.Plan, name string, cfg *rest.Config, files []*CRD) (notes []string, err error) {
	return CheckClusterScopes(ctx, plan, name, cfg, files, nil)
}

// CheckClusterScopes is CheckClusterNamed that also records in scopes
// (when not nil) whether each resource that the cluster serves to the
// plan's entries is namespaced, as its discovery says: what Advise needs
// to tell the shape of an index's default values (the object key).
func CheckClusterScopes(ctx context.Context, plan *schema.Plan, name string, cfg *rest.Config, files []*CRD, scopes Scopes) (notes []string, err error) {
	kube, err := kubejson.New(cfg)
	if err != nil {
		return nil, err
	}
	var p problems
	mp := mplan.Of(plan)
	reads := func(i int) bool { return name == "" || slices.Contains(mp.ClustersOf(mp.Resources[i]), name) }
	for i, r := range mp.Resources {
		if !reads(i) {
			continue // not read in this cluster
		}
		at := fmt.Sprintf("resources[%d]", i)
		gv := r.GVR.GroupVersion().String()
		apiPath := kubejson.Path("apis", r.GVR.Group, r.GVR.Version)
		if r.GVR.Group == "" {
			apiPath = kubejson.Path("api", r.GVR.Version)
		}
		list := &metav1.APIResourceList{}
		err := kube.Get(ctx, apiPath, list)
		file := CRDOf(files, r.GVR.Group, r.GVR.Resource)
		switch {
		case file != nil && (apierrors.IsNotFound(err) || err == nil && !servesResource(list, r.GVR.Resource)):
			notes = append(notes, fmt.Sprintf("%s: %s is not served by the cluster yet: serve installs CRD %s from the crds: list first; its paths are checked against that file", at, r.GVR.Resource, file.Name))
		case apierrors.IsNotFound(err):
			p.add(at, "%s is not served by the cluster: no API %s", r.GVR.Resource, gv)
		case err != nil:
			p.add(at, "discovery of %s: %v", gv, err)
		default:
			var served []string
			found := false
			for _, res := range list.APIResources {
				if strings.Contains(res.Name, "/") {
					continue
				}
				served = append(served, res.Name)
				if res.Name != r.GVR.Resource {
					continue
				}
				found = true
				if scopes != nil {
					scopes[r.GVR.Group+"/"+r.GVR.Resource] = res.Namespaced
				}
				for _, verb := range []string{"list", "watch"} {
					if !slices.Contains(res.Verbs, verb) {
						p.add(at+".resource", "%s in %s does not support %s", res.Name, gv, verb)
					}
				}
				if r.Namespace != "" && !res.Namespaced {
					p.add(at+".namespace", "%s is cluster-scoped: remove the namespace", res.Name)
				}
			}
			if !found {
				sort.Strings(served)
				p.add(at+".resource", "%q is not served in %s (served: %s)", r.GVR.Resource, gv, strings.Join(served, ", "))
			}
		}
		for _, verb := range []string{"list", "watch"} {
			allowed, reason, err := selfAllowed(ctx, kube, authorizationv1.ResourceAttributes{
				Namespace: r.Namespace, Verb: verb, Group: r.GVR.Group, Version: r.GVR.Version, Resource: r.GVR.Resource,
			})
			switch {
			case err != nil:
				p.add(at, "access review of %s %s: %v", verb, r.GVR.Resource, err)
			case !allowed:
				scope := "in all namespaces"
				if r.Namespace != "" {
					scope = "in namespace " + r.Namespace
				}
				p.add(at, "RBAC denies %s on %s %s: %s", verb, r.GVR.GroupResource(), scope, reason)
			}
		}
	}
	crds, crdNotes := installedCRDs(ctx, kube, plan, files, reads)
	notes = append(notes, crdNotes...)
	if len(files) > 0 {
		for _, verb := range []string{"get", "create", "patch"} {
			allowed, reason, err := selfAllowed(ctx, kube, authorizationv1.ResourceAttributes{Verb: verb, Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"})
			switch {
			case err != nil:
				p.add("crds", "access review of %s customresourcedefinitions: %v", verb, err)
			case !allowed:
				p.add("crds", "RBAC denies %s on customresourcedefinitions.apiextensions.k8s.io (%s), which serve needs to install the crds: files; or install them beforehand and drop crds:", verb, reason)
			}
		}
	}
	pathNotes, pathErr := checkPaths(plan, crds, reads)
	notes = append(notes, pathNotes...)
	for _, e := range schema.Problems(pathErr) {
		p.list.Add(e)
	}
	return notes, p.result()
}

// CheckInstalledPaths checks the paths of the plan's resources against
// the schemas of their CRDs as installed in the cluster, for the
// resources that no CRD of files (the config's crds: list, checked
// against the files) defines: the path check of CheckCluster, alone, for
// a daemon that starts or reloads a config. A path through a field that
// the schema lacks is a problem, with its field path; notes are what it
// could not check (a CRD that cannot be read, a path past a gjson
// query). A resource whose CRD is not installed is not checked: it is
// not served either, which the engine reports.
func CheckInstalledPaths(ctx context.Context, plan *schema.Plan, cfg *rest.Config, files []*CRD) (notes []string, err error) {
	kube, err := kubejson.New(cfg)
	if err != nil {
		return nil, err
	}
	crds, notes := installedCRDs(ctx, kube, plan, files, func(int) bool { return true })
	pathNotes, err := CheckPaths(plan, crds)
	return append(notes, pathNotes...), err
}

// installedCRDs reads, from the cluster, the CRD of each of the plan's
// resources whose group may be a CRD's (it has a dot) and that no CRD of
// files defines. A CRD that is not installed is left out; one that cannot
// be read yields a note.
func installedCRDs(ctx context.Context, kube *kubejson.Client, plan *schema.Plan, files []*CRD, reads func(i int) bool) (crds []*CRD, notes []string) {
	for i, r := range mplan.Of(plan).Resources {
		if !reads(i) || r.GVR.Group == "" || !strings.Contains(r.GVR.Group, ".") || CRDOf(files, r.GVR.Group, r.GVR.Resource) != nil {
			continue
		}
		if CRDOf(crds, r.GVR.Group, r.GVR.Resource) != nil {
			continue // two entries of one resource: read once
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		err := kube.Get(ctx, crdPath(r.GVR.Resource+"."+r.GVR.Group), crd)
		switch {
		case err == nil:
			crds = append(crds, crd)
		case apierrors.IsNotFound(err):
		case apierrors.IsForbidden(err):
			notes = append(notes, fmt.Sprintf("resources[%d]: paths not checked: RBAC denies get on CRD %s.%s (grant get on customresourcedefinitions, resourceNames [%s.%s], to have them checked)",
				i, r.GVR.Resource, r.GVR.Group, r.GVR.Resource, r.GVR.Group))
		default:
			notes = append(notes, fmt.Sprintf("resources[%d]: cannot read CRD %s.%s to check paths: %v", i, r.GVR.Resource, r.GVR.Group, err))
		}
	}
	return crds, notes
}

// problems collects schema.FieldErrors, printed one per line after a
// count and where they were found ("with the cluster" when where is "").
type problems struct {
	list  plist.List
	where string
}

func (p *problems) add(path, format string, args ...any) {
	p.list.Add(&schema.FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

func (p *problems) result() error {
	if p.where == "" {
		return p.list.Err("with the cluster")
	}
	return p.list.Err(p.where)
}

// servesResource reports whether a discovery list holds resource.
func servesResource(list *metav1.APIResourceList, resource string) bool {
	for _, res := range list.APIResources {
		if res.Name == resource {
			return true
		}
	}
	return false
}

// selfAllowed asks the apiserver whether the caller may do what attrs
// say (a SelfSubjectAccessReview); reason is why not, when it is not.
func selfAllowed(ctx context.Context, kube *kubejson.Client, attrs authorizationv1.ResourceAttributes) (allowed bool, reason string, err error) {
	review := &authorizationv1.SelfSubjectAccessReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "authorization.k8s.io/v1", Kind: "SelfSubjectAccessReview"},
		Spec:     authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &attrs},
	}
	got := &authorizationv1.SelfSubjectAccessReview{}
	if err := kube.Create(ctx, "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review, got); err != nil {
		return false, "", err
	}
	reason = got.Status.Reason
	if reason == "" {
		reason = "no RBAC rule allows it"
	}
	return got.Status.Allowed, reason, nil
}
