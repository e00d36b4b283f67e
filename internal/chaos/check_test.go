package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/fence"
)

// The checker finds each violation planted in a history, and nothing in
// one without: a run that passed means something only if it would fail.
func TestCheckHistory(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(1000, 0).Add(time.Duration(ms) * time.Millisecond) }
	g := func(id string, token fence.Token, invoked, granted, first, believed int) *grant {
		return &grant{name: "n", who: "w-" + id, id: id, token: token,
			invoked: at(invoked), granted: at(granted), first: at(first), believed: at(believed)}
	}
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
	} {
		t.Run(c.name, func(t *testing.T) {
			h := &history{grants: map[string]*grant{}}
			for _, gr := range c.grants {
				h.grants[gr.id] = gr
			}
			wrong := checkHistory(h)
			switch {
			case c.want == "" && len(wrong) > 0:
				t.Fatalf("found %q in a correct history", wrong)
			case c.want != "" && (len(wrong) != 1 || !strings.Contains(wrong[0], c.want)):
				t.Fatalf("found %q, want one thing, %q", wrong, c.want)
			}
		})
	}
}
