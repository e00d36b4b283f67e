package sequencer_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
)

// A follower whose watch of the counter key is cut off for longer than
// etcd keeps history gets its watch cancelled at the compaction. It must
// watch again and go on learning the tokens others issue; the watch used
// to end for good, and with it the follower's part in noticing a restore
// (guarantee 4).
func TestFollowOutlivesACompaction(t *testing.T) {
	e, direct := testenv.Etcd(t)
	ctx := t.Context()
	p, cli := testenv.EtcdThroughProxy(t, e)
	follower := newSeq(t, cli)
	issuer := newSeq(t, direct)
	if _, err := follower.Next(ctx, "f"); err != nil { // its floor is read: it counts what it sees
		t.Fatal(err)
	}
	seen := func(want uint64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for uint64(follower.Highest()) < want {
			if time.Now().After(deadline) {
				t.Fatalf("the follower's highest token is %d, 10s after %d was issued: it no longer follows", follower.Highest(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	tok, err := issuer.Next(ctx, "i")
	if err != nil {
		t.Fatal(err)
	}
	seen(uint64(tok))

	// Cut the follower off; what it has not seen is compacted away.
	p.Refuse(true)
	p.CutAll()
	for i := range 5 {
		if _, err := issuer.Next(ctx, fmt.Sprint("i", i)); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := direct.Put(ctx, testenv.Name(t), "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := direct.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	p.Refuse(false)

	tok, err = issuer.Next(ctx, "i")
	if err != nil {
		t.Fatal(err)
	}
	seen(uint64(tok))
}
