package follow

import (
	"context"
	"errors"
	"fmt"
	gosync "sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/tidwall/gjson"
	"k8s.io/client-go/rest"
)

// clusterVerdict is how a snapshot's cluster compares with the
// apiserver's.
type Verdict int

// Identity is the engine's knowledge of its cluster.
type Identity struct {
	// Fetch reads the cluster's identity, from etcd, or, cached, as the
	// apiserver's cache has it (see sync/rebuilt.go); nil for an engine
	// without a cluster.
	Fetch func(ctx context.Context, cached bool) (string, error)

	Mu gosync.Mutex
	// Snapshot: the identity recorded in the snapshot the engine was
	// restored from ("" for none or an unknown one).
	Snapshot string
	// Known: id was read from the apiserver; unreadable: it cannot be
	// (an answer that no retry changes), with why.
	Known      bool
	ID         string
	Unreadable error
	Verdict    *Verdict // once decided
	// RereadAt: when reread last read it (see sync/rebuilt.go); started,
	// landed: the sequence of the readings begun, and of the last one
	// taken (an older one that lands later is dropped).
	RereadAt        time.Time
	Started, Landed uint64
	// Pending: the cluster changed behind its address, and its
	// resources have not listed from scratch yet; toldStale: its
	// apiserver's cache serving the old one was logged; settling is
	// held by the one look at a time at the cache (see settleChange).
	Pending, ToldStale atomic.Bool
	Settling           gosync.Mutex
}

// Forget makes the identity be read again: the cluster's connection
// changed, and may reach another cluster. What was decided of the
// snapshot stays.
func (id *Identity) Forget() {
	id.Mu.Lock()
	defer id.Mu.Unlock()
	id.Known, id.ID, id.Unreadable = false, "", nil
	id.Started++
	id.Landed = id.Started // a reading under way went through the old connection
}

// ClusterIDNamespace is the namespace whose UID names a cluster.
const ClusterIDNamespace = "kube-system"

// FetchClusterID returns a function that reads the UID of the
// kube-system namespace with client, a client of the core API group:
// from etcd (a GET without resourceVersion), or, cached, from the
// apiserver's cache (resourceVersion=0).
func FetchClusterID(client rest.Interface) func(ctx context.Context, cached bool) (string, error) {
	return func(ctx context.Context, cached bool) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		req := client.Get().AbsPath("/api/v1/namespaces", ClusterIDNamespace)
		if cached {
			req = req.Param("resourceVersion", "0")
		}
		body, err := req.DoRaw(ctx)
		if err != nil {
			return "", err
		}
		uid := gjson.GetBytes(body, "metadata.uid").Str
		if uid == "" {
			return "", fmt.Errorf("namespace %s: %w", ClusterIDNamespace, errNoUID)
		}
		return uid, nil
	}
}

// Permanent reports an answer to the identity's GET that no retry
// changes: forbidden, unauthorized for it, or no such namespace.
func Permanent(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsNotFound(err) || apierrors.IsUnauthorized(err) ||
		errors.Is(err, errNoUID)
}

var errNoUID = errors.New("no metadata.uid")

// Read reads the identity once it is known or known to be unreadable;
// under id.mu.
func (id *Identity) Read(ctx context.Context) error {
	if id.Known || id.Unreadable != nil || id.Fetch == nil {
		return nil
	}
	got, err := id.Fetch(ctx, false)
	switch {
	case err == nil:
		id.Known, id.ID = true, got
	case Permanent(err):
		id.Unreadable = err
	default:
		return err
	}
	return nil
}

// errClusterChanged: the watch was not opened because the cluster behind
// the address changed (see above).
var errClusterChanged = errors.New("the cluster behind the address changed: listing from scratch")

// rereadEvery is how long one reading of a cluster's identity serves
// every resource of the cluster that checks it.
const rereadEvery = 2 * time.Second

// Reread reads the identity of the cluster from etcd again, unless it was
// read less than maxAge ago, and returns the one read before (was) and now; the
// same when it did not change or cannot be told (RBAC forbids the read).
// The first reading only records the identity. kube-system gone where it
// was known reads as "".
func (id *Identity) Reread(ctx context.Context, maxAge time.Duration) (was, now string, err error) {
	id.Mu.Lock()
	fetch := id.Fetch
	// One that RBAC forbids is tried again a minute later (a credential
	// rotated meanwhile may read it).
	refused := id.Unreadable != nil && !apierrors.IsNotFound(id.Unreadable) && time.Since(id.RereadAt) < time.Minute
	cached := id.Known && time.Since(id.RereadAt) < maxAge
	if fetch == nil || refused || cached {
		defer id.Mu.Unlock()
		return id.ID, id.ID, nil
	}
	id.Started++
	seq := id.Started
	id.Mu.Unlock()
	// Not under id.mu: the apiserver may take long to answer, and
	// answers, snapshots and reloads read the identity meanwhile.
	got, err := fetch(ctx, false)
	id.Mu.Lock()
	defer id.Mu.Unlock()
	if seq < id.Landed {
		return id.ID, id.ID, nil // a reading begun later was taken: it wins
	}
	id.Landed = seq
	switch {
	case err == nil:
	case apierrors.IsNotFound(err) && id.Known:
		got = "" // the namespace is gone: not the cluster it was
	case Permanent(err):
		id.Unreadable, id.RereadAt = err, time.Now()
		return id.ID, id.ID, nil
	default:
		return "", "", err
	}
	was = id.ID
	if !id.Known {
		was = got
	}
	id.Known, id.ID, id.Unreadable, id.RereadAt = got != "", got, nil, time.Now()
	return was, got, nil
}

// Changing reports a cluster that changed behind its address and whose
// resources have not listed from scratch yet (its apiserver's cache
// still served the old one at the last look): its answers are stale.
func (id *Identity) Changing() bool { return id != nil && id.Pending.Load() }

// IdentityWhy says what changed of a cluster's identity.
func IdentityWhy(was, now string) string {
	return fmt.Sprintf("its identity changed: the UID of namespace %s was %q, is %q (a cluster rebuilt behind the same address?)", ClusterIDNamespace, was, now)
}

// BothReadings reads the cluster's identity from etcd and from the
// apiserver's cache; a namespace not found reads as "". An error says
// neither can be compared (permanent: never, see permanent).
func (id *Identity) BothReadings(ctx context.Context) (inEtcd, cached string, err error) {
	id.Mu.Lock()
	fetch := id.Fetch
	id.Mu.Unlock()
	if fetch == nil {
		return "", "", fmt.Errorf("namespace %s: %w", ClusterIDNamespace, errNoUID)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for i, cache := range []bool{false, true} {
		got, err := fetch(ctx, cache)
		if err != nil && !apierrors.IsNotFound(err) {
			return "", "", err
		}
		if i == 0 {
			inEtcd = got
		} else {
			cached = got
		}
	}
	return inEtcd, cached, nil
}

const (
	ClusterSame    Verdict = iota // resume
	ClusterUnknown                // list, keeping the data meanwhile
	ClusterOther                  // the data was dropped: list
)
