package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/lock"
)

// at is a planted instant, ms after a fixed one.
func at(ms int) time.Time { return time.Unix(1000, 0).Add(time.Duration(ms) * time.Millisecond) }

// g is a planted grant of "n", its times in ms (at).
func g(id string, token fence.Token, invoked, granted, first, believed int) *grant {
	return &grant{name: "n", who: "w-" + id, id: id, token: token,
		invoked: at(invoked), granted: at(granted), first: at(first), believed: at(believed)}
}

// checkFinds checks h with grants added: it must find nothing wrong if
// want is "", else one thing, which says want.
func checkFinds(t *testing.T, h *history, grants []*grant, want string) {
	t.Helper()
	for _, gr := range grants {
		h.grants[gr.id] = gr
	}
	wrong := checkHistory(h)
	switch {
	case want == "" && len(wrong) > 0:
		t.Fatalf("found %q in a correct history", wrong)
	case want != "" && (len(wrong) != 1 || !strings.Contains(wrong[0], want)):
		t.Fatalf("found %q, want one thing, %q", wrong, want)
	}
}

// The checker finds each violation planted in a history, and nothing in
// one without: a run that passed means something only if it would fail.
func TestCheckHistory(t *testing.T) {
	for _, c := range []struct {
		name   string
		grants []*grant
		want   string // in the one thing found wrong; "": nothing
	}{
		{"one after another", []*grant{g("a", 5, 0, 10, 10, 50), g("b", 7, 60, 70, 70, 90)}, ""},
		{"concurrent asks, either order", []*grant{g("a", 7, 0, 10, 10, 50), g("b", 5, 5, 60, 60, 90)}, ""},
		{"a token twice", []*grant{g("a", 5, 0, 10, 10, 50), g("b", 5, 5, 70, 70, 90)}, "token 5 granted twice"},
		{"a token going back", []*grant{g("a", 7, 0, 10, 10, 50), g("b", 5, 60, 70, 70, 90)}, "asking after that"},
		{"two holders at once", []*grant{g("a", 5, 0, 10, 10, 75), g("b", 7, 60, 70, 70, 90)}, "two holders at once"},
		{"two holders, the later with the lower token", []*grant{g("a", 7, 0, 10, 10, 95), g("b", 5, 5, 70, 70, 90)}, "two holders at once"},
		{"two holders, the earlier deposed", []*grant{g("a", 3, 0, 10, 10, 75), g("b", 7, 60, 70, 70, 90)}, ""},
		{"two holders, another deposed", []*grant{g("a", 4, 0, 10, 10, 75), g("b", 7, 60, 70, 70, 90)}, "two holders at once"},
		{"two holders, deposed too late", []*grant{g("a", 3, 0, 10, 10, 95), g("b", 7, 5, 50, 50, 90)}, "two holders at once"},
	} {
		t.Run(c.name, func(t *testing.T) {
			// An operator force-released token 3 at 65 ms.
			h := &history{grants: map[string]*grant{}, forces: []forced{{name: "n", token: 3, sent: at(65)}}}
			checkFinds(t, h, c.grants, c.want)
		})
	}
}

// A Redis restart that frees every lock deposes the grants asked for
// before it, and no other; a Redlock node's restart deposes none.
func TestCheckRestart(t *testing.T) {
	for _, c := range []struct {
		name   string
		frees  bool
		grants []*grant
		want   string
	}{
		{"the earlier asked for before the restart", true, []*grant{g("a", 5, 0, 10, 10, 75), g("b", 7, 66, 70, 70, 90)}, ""},
		{"both asked for after it", true, []*grant{g("a", 5, 66, 68, 68, 85), g("b", 7, 80, 82, 82, 90)}, "two holders at once"},
		{"believed until before the restart", true, []*grant{g("a", 5, 0, 10, 10, 64), g("b", 7, 60, 62, 62, 90)}, "two holders at once"},
		{"a Redlock node's restart", false, []*grant{g("a", 5, 0, 10, 10, 75), g("b", 7, 66, 70, 70, 90)}, "two holders at once"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := &history{grants: map[string]*grant{}, restarts: []window{{at(65), at(65)}}, restartsFree: c.frees}
			checkFinds(t, h, c.grants, c.want)
		})
	}
}

// With Sentinel, a fault of a server is a window in which a failover may
// have taken leases: it deposes the grants asked for before its end, each
// from the window's start or its ask, whichever came later.
func TestCheckFailoverWindow(t *testing.T) {
	for _, c := range []struct {
		name   string
		grants []*grant
		want   string
	}{
		{"asked for before the window", []*grant{g("a", 5, 0, 10, 10, 75), g("b", 7, 72, 74, 74, 90)}, ""},
		{"asked for in it", []*grant{g("a", 5, 62, 64, 64, 85), g("b", 7, 72, 74, 74, 90)}, ""},
		{"asked for after it", []*grant{g("a", 5, 71, 72, 72, 85), g("b", 7, 80, 82, 82, 90)}, "two holders at once"},
		{"believed until before it", []*grant{g("a", 5, 0, 10, 10, 59), g("b", 7, 50, 55, 55, 90)}, "two holders at once"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := &history{grants: map[string]*grant{}, restarts: []window{{at(60), at(70)}}, restartsFree: true}
			checkFinds(t, h, c.grants, c.want)
		})
	}
}

// A "lost" before the holder's deadline is wrong unless an operator sent a
// force-release of that very grant before it, or a restart of a Redis
// that kept its lease came between the grant's ask and the answer (which
// may take the lease with it, whether or not it freed every lock).
func TestCheckLostEarly(t *testing.T) {
	for _, c := range []struct {
		name     string
		forced   []forced
		restarts []window
		wrong    bool
	}{
		{"no force-release", nil, nil, true},
		{"its own, sent before", []forced{{name: "n", token: 5, sent: at(10)}}, nil, false},
		{"its own, sent after", []forced{{name: "n", token: 5, sent: at(30)}}, nil, true},
		{"another token's", []forced{{name: "n", token: 6, sent: at(10)}}, nil, true},
		{"another name's", []forced{{name: "m", token: 5, sent: at(10)}}, nil, true},
		{"a restart after the ask, before the answer", nil, []window{{at(10), at(10)}}, false},
		{"a restart after the answer", nil, []window{{at(30), at(30)}}, true},
		{"a restart before the ask", nil, []window{{at(-5), at(-5)}}, true},
		// A failover Sentinel may have made at any time in a window.
		{"a failover's window around the ask", nil, []window{{at(-5), at(10)}}, false},
		{"a failover's window over before the ask", nil, []window{{at(-5), at(-1)}}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := &history{grants: map[string]*grant{"a": {name: "n", id: "a", token: 5, invoked: at(0), granted: at(2)}},
				forces: c.forced, restarts: c.restarts,
				early: []lostEarly{{name: "n", token: 5, at: at(20), what: "lost early"}}}
			if wrong := checkHistory(h); (len(wrong) > 0) != c.wrong {
				t.Fatalf("found %q; want something wrong: %v", wrong, c.wrong)
			}
		})
	}
}

// checkObserved finds a term going back, a leader shown leading again
// after another state (docs/design.md, defect 205) and a leader shown with
// another's value, and passes a correct sequence with nobody leading in
// between and what a fresh Observe call may show first: the state the last
// one showed, or a later one.
func TestCheckObserved(t *testing.T) {
	h := &history{grants: map[string]*grant{
		"a": {name: "e", who: "p0c0", id: "a", token: 5},
		"b": {name: "e", who: "p1c1", id: "b", token: 7},
		"c": {name: "other", who: "p1c0", id: "c", token: 6},
	}}
	lead := func(token fence.Token, value string) lock.Leader {
		return lock.Leader{Name: "e", Leading: true, Value: value, Token: token}
	}
	nobody := lock.Leader{Name: "e"}
	for _, c := range []struct {
		name string
		seen []lock.Leader
		want string
	}{
		{"terms in order", []lock.Leader{nobody, lead(5, "p0c0"), nobody, lead(7, "p1c1"), lead(9, "final")}, ""},
		{"a term going back", []lock.Leader{lead(7, "p1c1"), nobody, lead(5, "p0c0")}, "showed term 5 after term 7"},
		{"a resigned leader again", []lock.Leader{lead(5, "p0c0"), nobody, lead(5, "p0c0")}, "showed term 5 leading again after nobody leading"},
		{"a resigned leader again, later", []lock.Leader{lead(5, "p0c0"), nobody, lead(7, "p1c1"), nobody, lead(5, "p0c0")}, "showed term 5 after term 7"},
		{"a leader again after the next", []lock.Leader{lead(5, "p0c0"), lead(7, "p1c1"), lead(5, "p0c0")}, "showed term 5 after term 7"},
		{"a fresh call shows the leader again", []lock.Leader{nobody, lead(5, "p0c0"), lead(5, "p0c0"), nobody, nobody, lead(7, "p1c1")}, ""},
		{"a fresh call shows a later state", []lock.Leader{lead(5, "p0c0"), lead(7, "p1c1"), nobody, lead(9, "final")}, ""},
		{"another's value", []lock.Leader{lead(5, "p1c1")}, "that term is p0c0's"},
	} {
		t.Run(c.name, func(t *testing.T) {
			wrong := checkObserved(h, "e", "p0o", c.seen)
			switch {
			case c.want == "" && len(wrong) > 0:
				t.Fatalf("found %q in a correct sequence", wrong)
			case c.want != "" && (len(wrong) != 1 || !strings.Contains(wrong[0], c.want)):
				t.Fatalf("found %q, want one thing, %q", wrong, c.want)
			}
		})
	}
}
