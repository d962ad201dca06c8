package xds

import (
	"errors"
	"net/http"
	"time"
)

// verdict is what the Authorizer said of one target, kept for
// verdictTTL: a push to many clients asks it once a second per client
// and target, not once per resource type and push.
type verdict struct {
	code  int
	msg   string
	until time.Time
}

const verdictTTL = time.Second

// pruneAccess keeps the verdicts and denials of the targets that some
// type's names still ask for, and forgets the others.
func (c *client) pruneAccess() {
	if len(c.verdicts) == 0 && len(c.denied) == 0 {
		return
	}
	asked := map[string]bool{}
	for _, st := range c.types {
		for _, name := range st.names {
			if t, ok := parseTarget(name); ok {
				asked[t.access()] = true
			}
		}
	}
	for thing := range c.verdicts {
		if !asked[thing] {
			delete(c.verdicts, thing)
		}
	}
	for thing := range c.denied {
		if !asked[thing] {
			delete(c.denied, thing)
			c.deniedChanged = true
		}
	}
}

// errUnsure says that a target's access could not be told now (a review
// failed, or too many were in flight): its resources wait.
var errUnsure = errors.New("access not told now")

// retryLater pushes what changed again in a second: access that could
// not be told is asked again.
func (c *client) retryLater() {
	if c.retry != nil {
		c.retry.Reset(time.Second)
		return
	}
	c.retry = time.AfterFunc(time.Second, func() { c.st.Wake(wakeAgain) })
}

// may tells whether the client may read t: always without an
// Authorizer; errUnsure when it cannot be told now; a statusError that
// ends the stream when the client's token is no longer valid. A denial
// is logged (at most three times a minute) and shown by the status
// route.
func (c *client) may(t target) (bool, error) {
	if c.s.authorize == nil {
		return true, nil
	}
	thing := t.access()
	now := time.Now()
	v, ok := c.verdicts[thing]
	if !ok || now.After(v.until) {
		_, code, msg := c.s.authorize(c.req, thing)
		v = verdict{code: code, msg: msg, until: now.Add(verdictTTL)}
		if code == 0 || code == http.StatusForbidden {
			if c.verdicts == nil {
				c.verdicts = map[string]verdict{}
			}
			c.verdicts[thing] = v
		}
	}
	code, msg := v.code, v.msg
	switch code {
	case 0:
		if c.denied[thing] {
			delete(c.denied, thing)
			c.deniedChanged = true
		}
		return true, nil
	case http.StatusForbidden:
		if !c.denied[thing] {
			if c.denied == nil {
				c.denied = map[string]bool{}
			}
			c.denied[thing] = true
			c.deniedChanged = true
			c.s.deniedLog.Do(func() {
				c.s.log.Warn("xDS client may not read a target: its Listener does not exist for it",
					"client", c.node, "user", c.user, "access", thing, "error", msg)
			})
		}
		return false, nil
	case http.StatusUnauthorized:
		return false, &statusError{codeUnauthenticated, msg}
	}
	c.s.unsureLog.Do(func() {
		c.s.log.Warn("xDS: a client's access could not be told: it keeps the resources it holds, not updated, until a review answers",
			"client", c.node, "user", c.user, "access", thing, "status", code, "error", msg)
	})
	return false, errUnsure
}
