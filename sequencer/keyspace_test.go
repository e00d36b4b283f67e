package sequencer_test

import (
	"testing"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/sequencer"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A lock key holds its lease id and its info in one value; LockHeldBy must
// still hold for that lease id alone: not for one it begins with, one that
// begins with it, or one with a space in it.
func TestLockHeldByMatchesTheLeaseIDOnly(t *testing.T) {
	_, cli := testenv.Etcd(t)
	ks := sequencer.NewKeyspace("/" + testenv.Name(t) + "/")
	ctx := t.Context()
	const stored = "0123abcd"
	info := sequencer.LockInfo{Offset: 7, Owner: "o w n e r", Holder: "h"}
	if _, err := cli.Txn(ctx).Then(ks.PutLock("n", stored, clientv3.NoLease, info)...).Commit(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id   string
		want bool
	}{
		{stored, true},
		{"0123abc", false},   // a prefix of it
		{"0123abcd0", false}, // it is a prefix of this one
		{"0123abce", false},
		{"0123abcc", false},
		{"", false},
		{"0123abcd {", false}, // its value begins with this
		{"0123abcd ", false},
	} {
		resp, err := cli.Txn(ctx).If(ks.LockHeldBy("n", tc.id)...).Commit()
		if err != nil {
			t.Fatal(err)
		}
		if resp.Succeeded != tc.want {
			t.Errorf("LockHeldBy(%q) on a lock held by %q: %v, want %v", tc.id, stored, resp.Succeeded, tc.want)
		}
	}
	resp, err := cli.Txn(ctx).Then(ks.GetLock("n")...).Commit()
	if err != nil {
		t.Fatal(err)
	}
	st, held, err := ks.ParseLock(resp.Responses[0].GetResponseRange(), resp.Responses[1].GetResponseRange())
	if err != nil || !held {
		t.Fatalf("ParseLock: held %v, %v", held, err)
	}
	if st.LeaseID != stored || st.Owner != info.Owner || st.Holder != info.Holder || st.Count != 1 ||
		uint64(st.Token) != uint64(resp.Header.Revision)+info.Offset {
		t.Fatalf("ParseLock: %+v; want lease id %q, owner %q, holder %q, count 1, token %d", st, stored, info.Owner, info.Holder, uint64(resp.Header.Revision)+info.Offset)
	}
	if got := sequencer.LeaseIDOf(resp.Responses[0].GetResponseRange().Kvs[0].Value); got != stored {
		t.Fatalf("LeaseIDOf: %q, want %q", got, stored)
	}
}
