package auth

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
)

// The caches of TokenAuth: verdicts by key, the gates that bound the
// reviews of callers not known, and the single flight of identical
// reviews.

// identityKey hashes the whole identity (name, UID, groups, extra).
func identityKey(u authenticationv1.UserInfo) [32]byte {
	groups := slices.Clone(u.Groups)
	slices.Sort(groups)
	extra := make([][]string, 0, len(u.Extra))
	for k, v := range u.Extra {
		extra = append(extra, append([]string{k}, v...))
	}
	slices.SortFunc(extra, func(x, y []string) int { return strings.Compare(x[0], y[0]) })
	b, _ := json.Marshal([]any{u.Username, u.UID, groups, extra})
	return sha256.Sum256(append([]byte("identity\x00"), b...))
}

// accessKey is the cache key of an access decision: the identity and the
// thing accessed.
func accessKey(id [32]byte, thing string) [32]byte {
	return sha256.Sum256(append(append([]byte("access\x00"), id[:]...), thing...))
}

// gate bounds the reviews of keys never seen allowed, in total and per
// owner (an identity). It is guarded by TokenAuth.mu.
type gate struct {
	max, perOwner int
	inFlight      int
	owners        map[[32]byte]int
	busy          string // the answer when full
}

func (g *gate) enter(owner [32]byte) bool {
	if g.inFlight >= g.max || (g.perOwner > 0 && g.owners[owner] >= g.perOwner) {
		return false
	}
	g.inFlight++
	if g.perOwner > 0 {
		g.owners[owner]++
	}
	return true
}

func (g *gate) leave(owner [32]byte) {
	g.inFlight--
	if g.perOwner > 0 {
		if g.owners[owner]--; g.owners[owner] <= 0 {
			delete(g.owners, owner)
		}
	}
}

// flight is one review in progress; every request asking the same shares it.
type flight struct {
	done       chan struct{}
	background bool // the refresh of a positive verdict
	v          verdict
	err        error
}

// decide answers from the caches, or from a review that runs once for
// every request waiting on the same key. A positive verdict past half its
// life is refreshed in the background while it keeps answering; past its
// expiry it keeps answering for a grace period while its refresh fails or
// is still on its way. A key never seen allowed needs a place in g (for
// owner): when there is none, the answer is 503 at once.
func (a *TokenAuth) decide(ctx context.Context, key [32]byte, g *gate, owner [32]byte, pos, neg *lru, review func(context.Context) (verdict, error)) verdict {
	now := time.Now()
	a.mu.Lock()
	known := false
	if e, ok := pos.get(key); ok {
		f := a.flights[key]
		late := f != nil && f.background // a refresh started in time, still on its way
		if now.Before(e.expires) || (now.Before(e.stale) && (e.failing || late)) {
			if now.After(e.refresh) && f == nil {
				a.start(key, nil, true, pos, neg, review)
			}
			a.mu.Unlock()
			return e.v
		}
		known = true // expired, yet this token or access was good: no slot needed
	}
	if e, ok := neg.get(key); ok && now.Before(e.expires) {
		a.mu.Unlock()
		return e.v
	}
	f := a.flights[key]
	if f == nil {
		var slot *gate
		if !known {
			if !g.enter(owner) {
				a.mu.Unlock()
				a.busy.Inc()
				a.turnedAway.Add(1)
				a.busyLog.Do(func() {
					a.log.Warn("too many reviews: turning requests not known away", "turned_away", a.turnedAway.Swap(0))
				})
				return verdict{code: http.StatusServiceUnavailable, msg: g.busy}
			}
			slot = g
		}
		f = a.start(key, func() {
			if slot != nil {
				slot.leave(owner)
			}
		}, false, pos, neg, review)
	}
	a.mu.Unlock()
	select {
	case <-f.done:
	case <-ctx.Done():
		return verdict{code: http.StatusServiceUnavailable, msg: "request ended before the review"}
	}
	if f.err != nil {
		return verdict{code: http.StatusServiceUnavailable, msg: f.err.Error()}
	}
	return f.v
}

// start runs a review in its own goroutine, detached from any request,
// and records its verdict. A failed review is not recorded, except that a
// positive verdict it was to refresh is marked failing (it keeps
// answering until its stale time) and retried no sooner than retryFailed.
// done, if not nil, runs with a.mu held when the review ends. a.mu is held.
func (a *TokenAuth) start(key [32]byte, done func(), background bool, pos, neg *lru, review func(context.Context) (verdict, error)) *flight {
	f := &flight{done: make(chan struct{}), background: background}
	a.flights[key] = f
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
		v, err := review(ctx)
		cancel()
		now := time.Now()
		a.mu.Lock()
		delete(a.flights, key)
		switch {
		case err != nil: // never cached: the next request asks again
			if e, ok := pos.peek(key); ok {
				e.failing = true
				e.refresh = now.Add(retryFailed)
				pos.update(key, e)
			}
		case v.code == 0:
			neg.remove(key)
			expires := now.Add(a.ttl)
			pos.put(key, entry{v: v, expires: expires, refresh: now.Add(a.ttl / 2), stale: expires.Add(a.grace)})
		default:
			pos.remove(key)
			neg.put(key, entry{v: v, expires: now.Add(a.negativeTTL)})
		}
		if done != nil {
			done()
		}
		a.mu.Unlock()
		f.v, f.err = v, err
		close(f.done)
	}()
	return f
}

// entry is a cached verdict. A positive one answers until expires, or
// until stale while its refresh fails (failing) or is late.
type entry struct {
	v                       verdict
	expires, refresh, stale time.Time
	failing                 bool
}

// lru is a bounded cache that drops its least recently used entry when
// full. It is not safe for concurrent use.
type lru struct {
	max   int
	order *list.List // of *lruItem, most recent first
	items map[[32]byte]*list.Element
}

type lruItem struct {
	key [32]byte
	e   entry
}

func newLRU(max int) *lru {
	return &lru{max: max, order: list.New(), items: map[[32]byte]*list.Element{}}
}

func (c *lru) get(k [32]byte) (entry, bool) {
	el, ok := c.items[k]
	if !ok {
		return entry{}, false
	}
	c.order.MoveToFront(el)
	return el.Value.(*lruItem).e, true
}

// peek is get without making k the most recent.
func (c *lru) peek(k [32]byte) (entry, bool) {
	el, ok := c.items[k]
	if !ok {
		return entry{}, false
	}
	return el.Value.(*lruItem).e, true
}

// update replaces k's entry, if still there, without making it the most
// recent.
func (c *lru) update(k [32]byte, e entry) {
	if el, ok := c.items[k]; ok {
		el.Value.(*lruItem).e = e
	}
}

func (c *lru) put(k [32]byte, e entry) {
	if el, ok := c.items[k]; ok {
		el.Value.(*lruItem).e = e
		c.order.MoveToFront(el)
		return
	}
	c.items[k] = c.order.PushFront(&lruItem{key: k, e: e})
	if c.order.Len() > c.max {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.items, last.Value.(*lruItem).key)
	}
}

func (c *lru) remove(k [32]byte) {
	if el, ok := c.items[k]; ok {
		c.order.Remove(el)
		delete(c.items, k)
	}
}
