package xds

import (
	"errors"
	"net/http"
	"slices"
	"strconv"
	gosync "sync"
	"time"
)

// client is the ADS state of one stream, and its Handler: the stream's
// transport calls it one call at a time, so no lock guards it, and the
// one lock that the status route and the metrics take (statusMu) guards
// a copy of it and is never held across a write.
type client struct {
	s     *Server
	since time.Time
	st    Stream
	// release gives back the stream's place in the caller's limits;
	// first ends a stream without a request within
	// Limits.FirstRequest, unless gotRequest.
	release    func()
	first      *time.Timer
	gotRequest bool
	// req stands for the stream's request, for the Authorizer (nil
	// without one); user is who the client is; caller whom its limits
	// count.
	req    *http.Request
	user   string
	caller string
	// nextCheck is when the Authorizer is asked again (under s.mu).
	nextCheck time.Time

	node, zone string // from its first request
	types      map[string]*typeState
	follows    map[string]*entry // the assignments followed, by name
	names      int               // names of every type, counted for the caller
	verdicts   map[string]verdict
	denied     map[string]bool // the targets it may not read, by access URL
	// deniedChanged: denied changed since the status copy was made.
	deniedChanged bool
	// unknown: the names asked for that no index or chain answers, and
	// why; logged: the indexes and chains (kind/name) logged as unknown
	// for this client, once each.
	unknown        map[string]string
	logged         map[string]bool
	unknownChanged bool
	retry          *time.Timer // a push again, after an access not told

	// pending holds the assignments whose entry published a new state
	// since the stream last looked (under pendMu).
	pendMu  gosync.Mutex
	pending map[string]struct{}

	statusMu gosync.Mutex
	status   ClientStatus // a copy of what Clients shows
}

// typeState is what one client holds of one type.
type typeState struct {
	// names are the names subscribed, sorted; replaced, never changed in
	// place (the status copy shares them).
	names   []string
	version int    // of the last response sent
	nonce   string // of the last response sent
	acked   string // the last version the client acknowledged
	nacked  string // the last version it rejected, and why
	why     string
	// owed: a new subscription is to be answered, held back while
	// access could not be told.
	owed bool
	// sent is what the last responses held, by resource name: an
	// assignment's state (compared by pointer), or fixed for the other
	// types (their encoding depends on the name alone). A response the
	// client rejected is not sent again until something in it changes.
	sent map[string]*assignment
}

// fixed stands for a Listener, RouteConfiguration or Cluster sent.
var fixed = &assignment{}

// newClient makes the ADS state of the stream st, and counts it as
// connected: r stands for its request (with an Authorizer), user is who
// it is, caller whom its limits count.
func (s *Server) newClient(st Stream, r *http.Request, user, caller string) *client {
	c := &client{
		s:       s,
		since:   time.Now(),
		st:      st,
		req:     r,
		user:    user,
		caller:  caller,
		types:   map[string]*typeState{},
		follows: map[string]*entry{},
	}
	c.status = ClientStatus{User: user, Connected: c.since}
	c.nextCheck = c.since.Add(recheckEvery)
	s.clients.Inc()
	s.mu.Lock()
	if s.connected == nil {
		s.connected = map[*client]struct{}{}
	}
	s.connected[c] = struct{}{}
	s.mu.Unlock()
	return c
}

// Close lets go of what the client holds (Handler): its timer, its
// entries, its names, its place among the connected and in the
// caller's limits.
func (c *client) Close() {
	if c.first != nil {
		c.first.Stop()
	}
	c.stopAll()
	c.s.mu.Lock()
	delete(c.s.connected, c)
	c.s.mu.Unlock()
	c.s.clients.Dec()
	if c.release != nil {
		c.release()
	}
}

// Request handles one DiscoveryRequest, encoded (Handler).
func (c *client) Request(msg []byte) error {
	if c.first != nil {
		c.first.Stop()
		c.first = nil
	}
	c.gotRequest = true
	req, err := decodeRequest(msg)
	if err != nil {
		return &statusError{codeInvalid, err.Error()}
	}
	return c.request(req)
}

// Wake handles a turn the client asked for (Handler).
func (c *client) Wake(w Wakeup) error {
	switch w {
	case wakeFirst:
		if !c.gotRequest {
			msg := "no DiscoveryRequest within " + c.s.limits.FirstRequest.String() + " of the stream's start"
			c.s.refuse(refusedFirstRequest, c.caller, msg)
			return &statusError{codeDeadlineExceeded, msg}
		}
	case wakeChanged:
		return c.pushPending()
	case wakeRecheck:
		// The token may have gone, access may have been taken away (or
		// granted): answers are built again, and what changed is sent.
		if _, code, msg := c.s.authorize(c.req, ""); code == http.StatusUnauthorized {
			return &statusError{codeUnauthenticated, msg}
		}
		return c.pushChanged()
	case wakeAgain, wakeReload:
		// Access asked again; or targets a reload added or brought
		// back: Listeners and Clusters are answered anew (the cache
		// restarted their entries).
		return c.pushChanged()
	}
	return nil
}

func (c *client) state(typeURL string) *typeState {
	st := c.types[typeURL]
	if st == nil {
		st = &typeState{sent: map[string]*assignment{}}
		c.types[typeURL] = st
	}
	return st
}

// request handles one DiscoveryRequest: an ACK, a NACK, or new names.
func (c *client) request(req request) error {
	defer c.publishStatus()
	if c.node == "" && c.zone == "" {
		c.node, c.zone = req.nodeID, req.zone
	}
	typeURL := req.typeURL
	short, known := typeNames[typeURL]
	if !known {
		return nil // a type this server does not serve: nothing to say
	}
	st := c.state(typeURL)
	if nonce := req.responseNonce; nonce != "" && nonce != st.nonce {
		return nil // an answer to an older response: the newer one stands
	}
	switch {
	case req.nack:
		st.nacked, st.why = req.responseNonce, req.nackMessage
	case req.responseNonce != "":
		st.acked = req.responseNonce
	}
	if req.nack {
		c.s.nacks.WithLabelValues(short).Inc()
		c.s.nackLog.Do(func() {
			c.s.log.Warn("xDS client rejected a response; it is not sent again until the answer changes",
				"client", c.node, "type", short, "nonce", req.responseNonce, "error", req.nackMessage)
		})
	}
	for _, name := range req.resourceNames {
		if len(name) > MaxNameLength {
			return &statusError{codeInvalid, "a resource name of " + strconv.Itoa(len(name)) + " bytes, over " + strconv.Itoa(MaxNameLength)}
		}
	}
	names := slices.Clone(req.resourceNames)
	slices.Sort(names)
	names = slices.Compact(names)
	if len(names) > MaxNames {
		return &statusError{codeInvalid, "a request names " + strconv.Itoa(len(names)) + " resources of one type, over " + strconv.Itoa(MaxNames)}
	}
	if slices.Equal(names, st.names) && req.responseNonce != "" {
		return nil // an ACK or a NACK of what it holds: nothing new to send
	}
	if delta := len(names) - len(st.names); !c.s.gate.addNames(c.caller, delta) {
		msg := "this caller's xDS streams would follow more than " + strconv.Itoa(c.s.limits.NamesPerCaller) + " resource names"
		c.s.refuse(refusedNames, c.caller, msg)
		return &statusError{codeResourceExhausted, msg}
	} else {
		c.names += delta
	}
	st.names = slices.Clip(names)
	if typeURL == TypeEndpoint {
		c.followOnly(names)
	}
	c.pruneAccess()
	c.pruneUnknown()
	return c.respond(typeURL, true)
}

// respond sends the resources of typeURL for the names subscribed, when
// they differ from what was sent last, or always when asked (a new
// subscription is answered even when nothing changed).
func (c *client) respond(typeURL string, always bool) error {
	st := c.state(typeURL)
	always = always || st.owed
	sent := make(map[string]*assignment, len(st.names))
	held, heldNew := false, false
	for _, name := range st.names {
		a, err := c.resource(typeURL, name)
		switch {
		case errors.Is(err, errUnsure):
			// Access not told now: the client keeps what it holds.
			held = true
			if old, ok := st.sent[name]; ok {
				sent[name] = old
			} else {
				heldNew = true
			}
		case err != nil:
			return err
		case a != nil:
			sent[name] = a
		}
	}
	if held {
		c.retryLater()
		// A Listener or Cluster left out of a response does not exist:
		// not said of one whose access is not told.
		if heldNew && (typeURL == TypeListener || typeURL == TypeCluster) {
			st.owed = always
			return nil
		}
	}
	st.owed = false
	perResource := typeURL == TypeEndpoint || typeURL == TypeRoute
	var changed []string
	for _, name := range st.names {
		a, ok := sent[name]
		if !ok {
			continue
		}
		// Assignments and route configurations go one by one: a push
		// holds those that changed, or that the client does not hold
		// (a new name is answered without the others it follows), so
		// that one the client rejected is not sent again with another's
		// change.
		if old, was := st.sent[name]; !perResource || !was || old != a {
			changed = append(changed, name)
		}
	}
	same := len(sent) == len(st.sent)
	for name, a := range sent {
		if st.sent[name] != a {
			same = false
		}
	}
	st.sent = sent
	switch {
	case same && !always:
		return nil
	case perResource && len(changed) == 0:
		// Assignments and route configurations are answered one by one:
		// one not known yet is left out (the client waits for it), and
		// a removal sends nothing.
		return nil
	}
	return c.send(typeURL, st, changed)
}

// pushPending sends the assignments whose entries changed since the
// last look: only those, whatever else the client follows.
func (c *client) pushPending() error {
	c.pendMu.Lock()
	pending := c.pending
	c.pending = nil
	c.pendMu.Unlock()
	st := c.types[TypeEndpoint]
	if st == nil || len(pending) == 0 {
		return nil
	}
	var changed []string
	held := false
	for name := range pending {
		if _, ok := slices.BinarySearch(st.names, name); !ok {
			continue
		}
		a, err := c.resource(TypeEndpoint, name)
		switch {
		case errors.Is(err, errUnsure):
			held = true
			continue
		case err != nil:
			return err
		case a == nil:
			delete(st.sent, name) // gone, or not readable: nothing is sent
			continue
		}
		if st.sent[name] != a {
			st.sent[name] = a
			changed = append(changed, name)
		}
	}
	if held {
		c.retryLater()
	}
	if len(changed) == 0 {
		return nil
	}
	slices.Sort(changed)
	defer c.publishStatus()
	return c.send(TypeEndpoint, st, changed)
}

// send sends the resources names of typeURL (their state in st.sent) as
// a new version.
func (c *client) send(typeURL string, st *typeState, names []string) error {
	st.version++
	st.nonce = strconv.Itoa(st.version)
	resources := make([][]byte, 0, len(names))
	for _, name := range names {
		switch typeURL {
		case TypeListener:
			resources = append(resources, encodeListener(name))
		case TypeRoute:
			t, _ := parseTarget(name)
			resources = append(resources, encodeRoute(name, t.clusterName()))
		case TypeCluster:
			resources = append(resources, encodeCluster(name))
		case TypeEndpoint:
			resources = append(resources, st.sent[name].resource)
		}
	}
	// What the status shows is copied before the message is queued;
	// the push is counted once it is written.
	c.publishStatus()
	return c.st.Send(encodeFrame(typeURL, st.nonce, st.nonce, resources), c.s.pushed[typeURL])
}

// resource is the state of the resource name of typeURL to send, or nil
// when there is none (an unknown target, one the client may not read,
// an assignment not answered yet); the error is may's.
func (c *client) resource(typeURL, name string) (*assignment, error) {
	t, ok := parseTarget(name)
	if !ok || !c.s.exists(t) {
		c.markUnknown(name, t, ok)
		return nil, nil
	}
	c.markKnown(name)
	if (typeURL == TypeCluster || typeURL == TypeEndpoint) && t.clusterName() != name {
		return nil, nil
	}
	if ok, err := c.may(t); !ok {
		if typeURL == TypeEndpoint && err == nil {
			c.unfollow(name) // what it may not read, it does not follow
		}
		return nil, err
	}
	if typeURL != TypeEndpoint {
		return fixed, nil
	}
	e := c.follows[name]
	if e == nil {
		if e = c.s.cache.follow(c, name, t, c.zone, c.s.limits.Assignments); e == nil {
			c.s.refuse(refusedAssignments, c.caller, "the xDS server follows as many assignments as it may ("+strconv.Itoa(c.s.limits.Assignments)+", a quarter of them started by one caller): "+name+" is not answered until some are let go")
			return nil, nil
		}
		c.follows[name] = e
	}
	return e.current(), nil
}

// wake tells the stream that the assignment name has a new state; it
// never waits.
func (c *client) wake(name string) {
	c.pendMu.Lock()
	if c.pending == nil {
		c.pending = map[string]struct{}{}
	}
	c.pending[name] = struct{}{}
	c.pendMu.Unlock()
	c.st.Wake(wakeChanged)
}

// followOnly stops following the assignments not in names (those in
// names are followed once resource finds them readable).
func (c *client) followOnly(names []string) {
	for name := range c.follows {
		if _, ok := slices.BinarySearch(names, name); !ok {
			c.unfollow(name)
		}
	}
}

// unfollow stops following the assignment name.
func (c *client) unfollow(name string) {
	if e, ok := c.follows[name]; ok {
		c.s.cache.unfollow(c, e)
		delete(c.follows, name)
	}
}

// pushChanged sends what changed of every type: assignments, and the
// Listeners and Clusters of targets that a reload removed or whose
// access changed.
func (c *client) pushChanged() error {
	defer c.publishStatus()
	for _, typeURL := range allTypes {
		if st := c.types[typeURL]; st != nil && len(st.names) > 0 {
			if err := c.respond(typeURL, false); err != nil {
				return err
			}
		}
	}
	return nil
}

// stopAll ends what the stream holds: its entries, its names in the
// caller's count, its retry.
func (c *client) stopAll() {
	if c.retry != nil {
		c.retry.Stop()
	}
	for name := range c.follows {
		c.unfollow(name)
	}
	c.s.gate.addNames(c.caller, -c.names)
	c.names = 0
}

// watch tells the streams of every client of s of a reload (after the
// cache restarted the entries it ended), and, with an Authorizer, when
// to ask it again (every recheckEvery for each client), until stop is
// closed.
func (s *Server) watch(stop <-chan struct{}) {
	reloaded := s.engine.StaleChanged()
	var tick <-chan time.Time
	if s.authorize != nil {
		t := time.NewTicker(min(max(recheckEvery/10, 10*time.Millisecond), time.Second))
		defer t.Stop()
		tick = t.C
	}
	for {
		var due []*client
		ev := wakeReload
		select {
		case <-stop:
			return
		case <-reloaded:
			// The next signal first: a reload that comes while the
			// entries restart (one that flips the home back) is heard.
			next := s.engine.StaleChanged()
			s.cache.restartEnded(reloaded)
			reloaded = next
			due = s.connectedClients()
		case now := <-tick:
			ev = wakeRecheck
			s.mu.Lock()
			for c := range s.connected {
				if !now.Before(c.nextCheck) {
					c.nextCheck = now.Add(recheckEvery)
					due = append(due, c)
				}
			}
			s.mu.Unlock()
		}
		for _, c := range due {
			c.st.Wake(ev)
		}
	}
}
