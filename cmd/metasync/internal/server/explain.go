package server

import (
	"fmt"
	"net/http"
	"time"

	"golang.org/x/time/rate"

	"github.com/iidp/metasync/internal/wire"
	msync "github.com/iidp/metasync/sync"
)

// ExplainRate and ExplainBurst bound the ?explain=true answers of a
// server, all callers together, and ExplainRatePerCaller and
// ExplainBurstPerCaller those of one caller (see callerOf): an explanation
// reads every object of each step's resource while writes wait (about
// 1 ms per 10,000 objects, 30 ms per 100,000 on 2 cores), so a flood of
// them must not hold the indexes' writes back, and one caller must not
// spend everyone's. Beyond either: 429 with Retry-After.
const (
	ExplainRate           = 10 // per second
	ExplainBurst          = 20
	ExplainRatePerCaller  = 2
	ExplainBurstPerCaller = 5
)

// maxExplainCallers bounds the callers whose explain limits are kept;
// beyond it, the limits of the callers idle longest are forgotten.
const maxExplainCallers = 4096

// explainAllowed takes one explanation from caller's budget and the
// server's: "" when both allow it, else why not.
func (s *Server) explainAllowed(caller string) string {
	s.explainMu.Lock()
	defer s.explainMu.Unlock()
	if s.explainBy == nil {
		s.explainBy = map[string]*rate.Limiter{}
	}
	l := s.explainBy[caller]
	if l == nil {
		if len(s.explainBy) >= maxExplainCallers {
			now := time.Now()
			for c, cl := range s.explainBy {
				// Full again: idle for a while, nothing lost.
				if cl.TokensAt(now) >= ExplainBurstPerCaller {
					delete(s.explainBy, c)
				}
			}
			if len(s.explainBy) >= maxExplainCallers {
				return fmt.Sprintf("explain: more than %d callers explaining at once: try again in a second", maxExplainCallers)
			}
		}
		l = rate.NewLimiter(ExplainRatePerCaller, ExplainBurstPerCaller)
		s.explainBy[caller] = l
	}
	if !l.Allow() {
		return fmt.Sprintf("explain: more than %d explanations a second from this caller: try again in a second", ExplainRatePerCaller)
	}
	if !s.explains.Allow() {
		return fmt.Sprintf("explain: more than %d explanations a second (all callers): try again in a second", ExplainRate)
	}
	return ""
}

// explaining reads ?explain: true or false (absent: false); anything
// else is a 400 that names the parameter. It spends no budget: see
// explainBudget.
func (s *Server) explaining(w http.ResponseWriter, r *http.Request) (explain, ok bool) {
	vs, given := r.URL.Query()["explain"]
	if given && len(vs) > 1 {
		writeError(w, http.StatusBadRequest, "explain given more than once: give explain=true once")
		return false, false
	}
	switch v := r.URL.Query().Get("explain"); {
	case !given || v == "false":
		return false, true
	case v == "":
		writeError(w, http.StatusBadRequest, `explain="": use explain=true or leave it out`)
		return false, false
	case v == "true":
		return true, true
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("explain=%q: use explain=true or leave it out", v))
		return false, false
	}
}

// explainBudget takes one explanation from the caller's budget and the
// server's, once the request is known to be answered (access to every
// step granted): a request refused for another reason spends none. Beyond
// either budget it writes a 429 and returns false.
func (s *Server) explainBudget(w http.ResponseWriter, r *http.Request) bool {
	if msg := s.explainAllowed(callerOf(r)); msg != "" {
		s.limitMetrics.refused.WithLabelValues(refusedExplain).Inc()
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusTooManyRequests, msg)
		return false
	}
	return true
}

// wireSteps is what ?explain=true sends of an Explanation's steps.
func wireSteps(steps []msync.ExplainStep) []wire.Step {
	out := make([]wire.Step, 0, len(steps))
	for _, st := range steps {
		ws := wire.Step{Index: st.Index, Keys: nonNil(st.Keys), Values: nonNil(st.Values), Objects: []wire.StepObject{},
			Conflicts: st.Conflicts, Synced: st.Synced, Stale: st.Stale, Empty: st.Empty}
		for _, o := range st.Objects {
			wo := wire.StepObject{Resource: o.Resource, Key: o.Key, Cluster: o.Cluster, ResourceVersion: o.ResourceVersion, IndexKey: o.IndexKey,
				Values: nonNil(o.Values), Chosen: o.Chosen, Fallback: o.Fallback, Unanswered: o.Unanswered, Why: o.Why}
			if !o.Created.IsZero() {
				c := o.Created
				wo.CreationTimestamp = &c
			}
			ws.Objects = append(ws.Objects, wo)
		}
		out = append(out, ws)
	}
	return out
}
