// Package kubejson is a small JSON client of the Kubernetes API, for the
// few calls of the daemon that are not watches: token and access reviews,
// CRD installation, discovery of one group version. It is client-go's
// REST client (rate limits, retries, TLS, auth plugins, the apiserver's
// Status errors as *errors.StatusError) without the generated clientsets:
// importing k8s.io/client-go/kubernetes alone links every API group of
// Kubernetes and registers it at init, about 10 MiB resident in a program
// that never calls it (BENCHMARKS.md, "Resident memory").
package kubejson

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// Client sends JSON requests to absolute API paths.
type Client struct {
	rc *rest.RESTClient
}

// New builds a Client of cfg: its host, credentials, user agent and rate
// limits (QPS, Burst or RateLimiter).
func New(cfg *rest.Config) (*Client, error) {
	c := rest.CopyConfig(cfg)
	c.APIPath = ""
	c.GroupVersion = &schema.GroupVersion{}
	c.ContentType = "application/json"
	c.AcceptContentTypes = "application/json"
	c.NegotiatedSerializer = statusCodec{}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, err
	}
	return &Client{rc: rc}, nil
}

// Get reads path (such as "/apis/iidp.com/v1") into out.
func (c *Client) Get(ctx context.Context, path string, out any) error {
	return do(ctx, c.rc.Get().AbsPath(path), out)
}

// Create posts in, as JSON, to path (a collection, such as
// "/apis/authentication.k8s.io/v1/tokenreviews") and reads the answer into
// out.
func (c *Client) Create(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return do(ctx, c.rc.Post().AbsPath(path).Body(body), out)
}

// Apply server-side applies body (a JSON or YAML object) at path as
// fieldManager, forcing conflicts, and reads the answer into out (nil:
// discarded).
func (c *Client) Apply(ctx context.Context, path, fieldManager string, body []byte, out any) error {
	req := c.rc.Patch(types.ApplyYAMLPatchType).AbsPath(path).Body(body).
		Param("fieldManager", fieldManager).Param("force", "true")
	return do(ctx, req, out)
}

// do sends req and decodes the answer into out (nil: discarded). An
// answer that is not 2xx is the error; when it is a Status, that error is
// an *errors.StatusError, so that errors.IsNotFound and its kin work.
func do(ctx context.Context, req *rest.Request, out any) error {
	res := req.Do(ctx)
	if err := res.Error(); err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	body, err := res.Raw()
	if err != nil {
		return err
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("decode the answer: %w", err)
	}
	return nil
}

// Path joins an API path's segments: groups, versions, resources and
// names, which Kubernetes restricts to DNS names (no escaping needed; the
// REST client escapes the path it is given). A segment that is empty,
// holds a '/', or is "." or ".." would name another path: Path leaves
// it out of the path as "_", which names nothing the apiserver serves.
func Path(segments ...string) string {
	var b strings.Builder
	for _, s := range segments {
		if s == "" || s == "." || s == ".." || strings.Contains(s, "/") {
			s = "_"
		}
		b.WriteByte('/')
		b.WriteString(s)
	}
	return b.String()
}

// statusCodec is the serializer the REST client needs to turn an error
// answer into a StatusError: it decodes metav1.Status and nothing else
// (answers themselves are read raw, as JSON).
type statusCodec struct{}

var _ runtime.NegotiatedSerializer = statusCodec{}

func (statusCodec) SupportedMediaTypes() []runtime.SerializerInfo {
	return []runtime.SerializerInfo{{
		MediaType:        "application/json",
		MediaTypeType:    "application",
		MediaTypeSubType: "json",
		EncodesAsText:    true,
		Serializer:       statusCodec{},
	}}
}

func (statusCodec) EncoderForVersion(e runtime.Encoder, _ runtime.GroupVersioner) runtime.Encoder {
	return e
}

func (statusCodec) DecoderToVersion(d runtime.Decoder, _ runtime.GroupVersioner) runtime.Decoder {
	return d
}

func (statusCodec) Decode(data []byte, _ *schema.GroupVersionKind, _ runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	var head struct {
		Kind string `json:"kind"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, nil, err
	}
	if head.Kind != "Status" {
		return nil, nil, fmt.Errorf("not a Status: kind %q", head.Kind)
	}
	st := &metav1.Status{}
	if err := json.Unmarshal(data, st); err != nil {
		return nil, nil, err
	}
	return st, nil, nil
}

func (statusCodec) Encode(runtime.Object, io.Writer) error {
	return errors.New("kubejson sends its bodies as bytes")
}

func (statusCodec) Identifier() runtime.Identifier { return "metasync-kubejson-status" }
