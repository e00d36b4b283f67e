package compare

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// grant is one successful acquisition: a holder.
type grant struct {
	Worker int    `json:"worker"`
	Holder string `json:"holder"`
	Inv    int64  `json:"inv"`   // the acquisition's invocation, ns
	OK     int64  `json:"ok"`    // its completion
	End    int64  `json:"end"`   // the release's invocation (or the end of the run): the holder believes it holds until then
	Token  uint64 `json:"token"` // 0: none
}

// attempt is one try to write (or, for fenced writers, to read through the
// fence, which admits the token just as a write does).
type attempt struct {
	Kind     string `json:"kind"` // read or write
	Worker   int    `json:"worker"`
	Holder   string `json:"holder"`
	Transfer string `json:"transfer"`
	Token    uint64 `json:"token"`
	Inv      int64  `json:"inv"`
	Ret      int64  `json:"ret"` // math.MaxInt64: never completed
	Outcome  string `json:"outcome"`
	Highest  uint64 `json:"highest,omitempty"`
	Commit   int64  `json:"commit,omitempty"` // commit_seq of an admitted write
}

// history is a scenario's operations on one lock name and one resource.
type history struct {
	Grants   []grant
	Attempts []attempt
	Failed   int // acquisitions that failed
	End      int64
}

// buildHistory pairs every invocation with its completion. Writes whose
// completion is missing or an error are settled by the ledger: a transfer
// in the log was admitted, whatever its writer heard.
func buildHistory(es []event, a audit, end int64) history {
	type key struct{ w, op int }
	inv := map[key]event{}
	done := map[key]bool{}
	h := history{End: end}
	holders := map[string]int{} // holder -> index in Grants
	for _, e := range es {
		k := key{e.Worker, e.Op}
		if e.Inv {
			inv[k] = e
			continue
		}
		switch e.What {
		case evAcquire:
			done[k] = true
			if e.Outcome != outOK {
				h.Failed++
				continue
			}
			holders[e.Holder] = len(h.Grants)
			h.Grants = append(h.Grants, grant{Worker: e.Worker, Holder: e.Holder, Inv: inv[k].T, OK: e.T, End: end, Token: e.Token})
		case evRead, evWrite:
			done[k] = true
			at := attempt{Kind: e.What, Worker: e.Worker, Holder: e.Holder, Transfer: e.Transfer, Token: e.Token,
				Inv: inv[k].T, Ret: e.T, Outcome: e.Outcome, Highest: e.Highest}
			h.Attempts = append(h.Attempts, at)
		case evRelease:
			done[k] = true
		}
	}
	// Releases end a holding at their invocation.
	for k, e := range inv {
		if e.What == evRelease {
			if i, ok := holders[e.Holder]; ok && e.T < h.Grants[i].End {
				h.Grants[i].End = e.T
			}
		}
		if !done[k] && (e.What == evRead || e.What == evWrite) {
			h.Attempts = append(h.Attempts, attempt{Kind: e.What, Worker: e.Worker, Holder: e.Holder, Transfer: e.Transfer,
				Token: e.Token, Inv: e.T, Ret: math.MaxInt64, Outcome: outUnknown})
		}
	}
	for i := range h.Attempts {
		at := &h.Attempts[i]
		if at.Kind != evWrite {
			continue
		}
		if seq, ok := a.commits[at.Transfer]; ok {
			at.Outcome, at.Commit = outAdmitted, seq
		} else if at.Outcome == outAdmitted {
			at.Outcome = outUnknown // reported committed but not in the log: should not happen
		} else if at.Outcome == outUnknown && at.Ret != math.MaxInt64 {
			at.Outcome = outFailed // an error, and not in the log: rolled back
		}
	}
	slices.SortFunc(h.Grants, func(x, y grant) int { return cmpInt(x.OK, y.OK) })
	slices.SortFunc(h.Attempts, func(x, y attempt) int { return cmpInt(x.Inv, y.Inv) })
	return h
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// succeeds reports whether y is a successor of x: y began to acquire after
// x's acquisition had completed.
func succeeds(y, x grant) bool { return y.Inv > x.OK }

// counts is what the checkers find in one history.
type counts struct {
	Overlaps        int `json:"overlapping_holders"`
	StaleAdmitted   int `json:"stale_writes_admitted"`
	StaleRejected   int `json:"stale_rejected"`
	CurrentRejected int `json:"current_holders_rejected"`
	TokensBad       int `json:"tokens_repeated_or_back"`
	Unknown         int `json:"unknown_outcomes"`
}

// check counts overlapping holders, stale writes admitted and rejected and
// bad tokens. tokens says the scheme's holders carry tokens.
func check(h history, tokens bool) counts {
	var c counts
	byHolder := map[string]grant{}
	for _, g := range h.Grants {
		byHolder[g.Holder] = g
	}
	// Two holders at once: their [granted, release invoked] intervals meet.
	for i, x := range h.Grants {
		for _, y := range h.Grants[i+1:] {
			if y.OK < x.End && x.OK < y.End {
				c.Overlaps++
			}
		}
	}
	// Tokens: unique per name, and larger than every grant that completed
	// before the grant began.
	if tokens {
		for i, y := range h.Grants {
			for j, x := range h.Grants {
				if i != j && (x.Token == y.Token || succeeds(y, x) && y.Token < x.Token) {
					c.TokensBad++
					break
				}
			}
		}
	}
	// Stale writes admitted, in commit order.
	var admitted []attempt
	for _, at := range h.Attempts {
		if at.Kind == evWrite && at.Outcome == outAdmitted {
			admitted = append(admitted, at)
		}
		if at.Outcome == outUnknown {
			c.Unknown++
		}
	}
	slices.SortFunc(admitted, func(x, y attempt) int { return cmpInt(x.Commit, y.Commit) })
	for i, w := range admitted {
		g := byHolder[w.Holder]
		for _, prev := range admitted[:i] {
			pg := byHolder[prev.Holder]
			if prev.Holder != w.Holder && (succeeds(pg, g) || tokens && prev.Token > w.Token) {
				c.StaleAdmitted++
				break
			}
		}
	}
	// Rejections: stale when the holder whose token was higher is not an
	// earlier holder; otherwise the current holder was turned away because
	// tokens went back.
	for _, at := range h.Attempts {
		if at.Outcome != outRejected {
			continue
		}
		g := byHolder[at.Holder]
		wrongful := false
		for _, x := range h.Grants {
			if x.Token == at.Highest && x.Holder != at.Holder && succeeds(g, x) {
				wrongful = true
				break
			}
		}
		if wrongful {
			c.CurrentRejected++
		} else {
			c.StaleRejected++
		}
	}
	return c
}

// Porcupine models.

// registerInput is a write attempt on the fenced register.
type registerInput struct {
	Token uint64
}

// registerModel is the resource as a fenced register: an attempt is
// admitted iff its token is at least the highest admitted so far, and then
// raises it; a rejected one leaves it; a failed one (rolled back) may do
// nothing; one of unknown outcome may have done either.
var registerModel = porcupine.NondeterministicModel{
	Init: func() []any { return []any{uint64(0)} },
	Step: func(state, input, output any) []any {
		hi, t, out := state.(uint64), input.(registerInput).Token, output.(string)
		switch out {
		case outAdmitted:
			if t >= hi {
				return []any{t}
			}
		case outRejected:
			if t < hi {
				return []any{hi}
			}
		case outFailed:
			return []any{hi}
		case outUnknown:
			if t >= hi {
				return []any{hi, t}
			}
			return []any{hi}
		}
		return nil
	},
	Equal: func(a, b any) bool { return a.(uint64) == b.(uint64) },
}

// mutexModel is token issue: each grant's token exceeds that of every grant
// linearized before it, so it exceeds every grant that completed before it
// began.
var mutexModel = porcupine.Model{
	Init: func() any { return uint64(0) },
	Step: func(state, input, _ any) (bool, any) {
		t := input.(uint64)
		return t > state.(uint64), t
	},
}

const porcupineTimeout = 20 * time.Second

// linearizable checks the resource's history against the fenced register
// and, for schemes with tokens, the grants against the fenced mutex.
// Schemes without a token are checked as a register whose tokens are the
// holders' grant order: a write by an earlier holder after a later
// holder's write is what the fence would have refused. mutex is "" for
// schemes without tokens.
func linearizable(h history, tokens bool) (register, mutex string) {
	rank := map[string]uint64{}
	for i, g := range h.Grants {
		rank[g.Holder] = uint64(i + 1)
	}
	var ops []porcupine.Operation
	for _, at := range h.Attempts {
		if !tokens && at.Kind == evRead {
			continue
		}
		t := at.Token
		if !tokens {
			t = rank[at.Holder]
		}
		ret := at.Ret
		if ret == math.MaxInt64 {
			ret = h.End + 1
		}
		ops = append(ops, porcupine.Operation{ClientId: at.Worker, Input: registerInput{t}, Call: at.Inv, Output: at.Outcome, Return: ret})
	}
	register = verdict(porcupine.CheckOperationsTimeout(registerModel.ToModel(), ops, porcupineTimeout))
	if !tokens {
		return register, ""
	}
	ops = ops[:0]
	for _, g := range h.Grants {
		ops = append(ops, porcupine.Operation{ClientId: g.Worker, Input: g.Token, Call: g.Inv, Output: nil, Return: g.OK})
	}
	return register, verdict(porcupine.CheckOperationsTimeout(mutexModel, ops, porcupineTimeout))
}

func verdict(r porcupine.CheckResult) string {
	switch r {
	case porcupine.Ok:
		return "yes"
	case porcupine.Illegal:
		return "no"
	}
	return fmt.Sprintf("unknown (%s)", r)
}
