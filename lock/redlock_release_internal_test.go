package lock

import (
	"context"
	"testing"
)

// A Redlock release is lost for certain only when more nodes than a
// minority are sure they never released the lease (RedlockStore.Release):
// the others, which may have held it until an earlier attempt of the
// release freed it there, are then fewer than a majority.
func TestRedlockReleaseLostForCertainWithoutAMajorityThatMayHaveHeldIt(t *testing.T) {
	released, sure, maybe, silent := error(nil), ErrLost, errLostMaybeReleased, &NodeError{Err: context.DeadlineExceeded}
	for _, c := range []struct {
		answers []error
		certain bool
	}{
		{[]error{sure, sure, sure}, true},
		{[]error{sure, sure, maybe}, true},    // one node is no majority
		{[]error{sure, sure, released}, true}, // nor is one released
		{[]error{sure, maybe, maybe}, false},
		{[]error{sure, maybe, released}, false},
		{[]error{sure, sure, silent}, true},
		{[]error{sure, maybe, silent}, false},
		{[]error{maybe, maybe, maybe}, false},
		{[]error{sure, sure, sure, maybe, maybe}, true},
		{[]error{sure, sure, maybe, maybe, released}, false},
	} {
		s := &RedlockStore{nodes: make([]*RedisStore, len(c.answers)), quorum: len(c.answers)/2 + 1}
		if got := s.lostForCertain(outcome{op: "release", errs: c.answers}); got != c.certain {
			t.Errorf("answers %v: lost for certain %v, want %v", c.answers, got, c.certain)
		}
	}
}
