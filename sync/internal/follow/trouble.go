package follow

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// verifyAfterTrouble checks the cluster before a watch opens at rv, when
// the watcher had trouble since the last check (see above). It returns
// errClusterChanged when the cluster changed, the error of a check that
// could not be made (recorded by the caller), else nil.
func (w *Watcher) verifyAfterTrouble(ctx context.Context, rv string) error {
	if !w.troubled.Load() || w.Identity == nil || rv == "" || rv == "0" || w.Identity.Changing() {
		return nil
	}
	// Bounded: an apiserver that does not answer must fail the watch soon
	// enough to be marked stale in time.
	ctx, cancel := context.WithTimeout(ctx, min(max(w.StaleAfter/2, time.Second), 5*time.Second))
	defer cancel()
	was, now, err := w.Identity.Reread(ctx, rereadEvery)
	if err != nil {
		return fmt.Errorf("read the cluster's identity: %w", err)
	}
	why := ""
	if was != now {
		why = IdentityWhy(was, now)
	} else {
		current, err := w.currentVersion(ctx)
		switch {
		case errors.Is(err, errNoProbe):
			// The apiserver cannot tell: the identity is all there is.
		case err != nil:
			return err
		case newer(rv, current):
			why = fmt.Sprintf("its resourceVersion went back: the watch was at %s, the apiserver is at %s (etcd restored from a backup?)", rv, current)
		}
	}
	w.troubled.Store(false)
	if why == "" {
		return nil
	}
	w.Changed(ctx, why)
	return errClusterChanged
}

// wentBack tells of another history when rv, of an event or a bookmark,
// is older than what the source is as of: a watch's come in order.
func (w *Watcher) wentBack(rv string) {
	last := w.ResourceVersion()
	if !newer(last, rv) || w.Rebuilt.Load() || w.Changed == nil {
		return
	}
	why := fmt.Sprintf("its resourceVersion went back within a watch: %s after %s (etcd replaced or restored under a running apiserver?)", rv, last)
	ctx := context.Background()
	if p := w.runCtx.Load(); p != nil {
		ctx = *p // its requests end with the watcher's run
	}
	go w.Changed(ctx, why)
}

// ListFromScratch makes the watcher list again at once, asking for the
// current state; its answers stay stale (rebuilt) until that list is
// done.
func (w *Watcher) ListFromScratch() {
	w.Rebuilt.Store(true)
	w.listFresh.Store(true)
	w.troubled.Store(false)
	w.RV.Store(nil)
	w.NoteFresh()
	if f := w.RelistNow.Load(); f != nil {
		(*f)()
	}
}

// answeredAgain wakes the cluster's other resources (see recovered) the
// first time the watcher is answered in an outage.
func (w *Watcher) answeredAgain() {
	if w.Recovered != nil && w.LastError() != nil && !w.kicked.Swap(true) {
		go w.Recovered()
	}
}

// Probe lists one object of w's resource through client, as w's lists
// do (its namespace, with its selectors), then opens a watch of it (of
// one made-up name, ended at once), and reports why either could not be
// done: a reader that may list but not watch would leave the cluster's
// part stale for good.
func (w *Watcher) Probe(ctx context.Context, client rest.Interface) error {
	opts := metav1.ListOptions{Limit: 1, LabelSelector: w.Plan.LabelSelector, FieldSelector: w.Plan.FieldSelector}
	req := client.Get().MaxRetries(0).Resource(w.Plan.GVR.Resource).VersionedParams(&opts, metav1.ParameterCodec)
	if w.Plan.Namespace != "" {
		req = req.Namespace(w.Plan.Namespace)
	}
	_, err := req.DoRaw(ctx)
	if err == nil {
		timeout := int64(1)
		wopts := metav1.ListOptions{Watch: true, FieldSelector: "metadata.name=" + probeName, TimeoutSeconds: &timeout}
		wreq := client.Get().MaxRetries(0).Resource(w.Plan.GVR.Resource).VersionedParams(&wopts, metav1.ParameterCodec)
		if w.Plan.Namespace != "" {
			wreq = wreq.Namespace(w.Plan.Namespace)
		}
		var wi watch.Interface
		if wi, err = wreq.Watch(ctx); err == nil {
			wi.Stop()
		} else {
			err = fmt.Errorf("watch: %w", err)
		}
	}
	if apierrors.IsNotFound(err) {
		return nil // answered: the resource is not served there, as may be
	}
	var st apierrors.APIStatus
	if errors.As(err, &st) && st.Status().Code != 0 {
		code := int(st.Status().Code)
		return fmt.Errorf("HTTP %d %s: %w", code, http.StatusText(code), err)
	}
	return err
}
