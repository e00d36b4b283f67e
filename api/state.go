package api

import (
	"time"

	"github.com/fenced/fenced/lock"
)

// NewLockState is a lock's state as the API shows it: never its lease id
// nor its holder identity (an acquire with it gets the lease id); the
// owner and count only while held (count only above 1), the last token
// only when free.
func NewLockState(st lock.State) LockState {
	r := LockState{Name: st.Name, Held: st.Held, Token: st.Token, TTLMs: st.Remaining.Milliseconds(),
		Waiters: st.Waiters, OldestWaitMs: st.OldestWait.Milliseconds()}
	if st.Held {
		r.Owner = st.Owner
		if st.Count > 1 {
			r.Count = st.Count
		}
	} else {
		r.LastToken = st.LastToken
	}
	return r
}

// State is the lock.State the answer describes (LeaseID and Holder empty:
// the API never tells them).
func (a LockState) State() lock.State {
	count := a.Count
	if a.Held && count == 0 {
		count = 1
	}
	return lock.State{Name: a.Name, Held: a.Held, Token: a.Token, Remaining: time.Duration(a.TTLMs) * time.Millisecond,
		Owner: a.Owner, Count: count, LastToken: a.LastToken,
		Waiters: a.Waiters, OldestWait: time.Duration(a.OldestWaitMs) * time.Millisecond}
}

// NewLeader is who leads an election, as the API shows it.
func NewLeader(l lock.Leader) Leader {
	return Leader{Name: l.Name, Leading: l.Leading, Value: l.Value, Token: l.Token}
}

// Leader is the lock.Leader the answer describes.
func (a Leader) Leader() lock.Leader {
	return lock.Leader{Name: a.Name, Leading: a.Leading, Value: a.Value, Token: a.Token}
}
