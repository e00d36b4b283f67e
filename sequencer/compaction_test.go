package sequencer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/sequencer"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestEmbeddedCompactsItsHistory: a member keeps only CompactionRetention
// of history. With a second of it, and writes going on, a read at the
// first revision comes to be refused as compacted (with the hour the
// member kept before, not for an hour).
func TestEmbeddedCompactsItsHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, err := sequencer.StartEmbedded(ctx, sequencer.EmbedConfig{Dir: t.TempDir(), UnsafeNoFsync: true, CompactionRetention: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	cli, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	testenv.WaitCompacted(t, cli, "k", 60*time.Second)
}

// TestEmbedRefusesANegativeRetention: a negative retention is a mistake,
// not the default.
func TestEmbedRefusesANegativeRetention(t *testing.T) {
	_, err := sequencer.StartEmbedded(context.Background(), sequencer.EmbedConfig{Dir: t.TempDir(), CompactionRetention: -time.Minute})
	if err == nil || !strings.Contains(err.Error(), "compaction retention -1m0s: want > 0 (0 means 1m0s)") {
		t.Fatalf("err %v, want the retention refused with what is allowed", err)
	}
}

// TestPingSeesASpaceAlarm: an etcd out of space answers reads and refuses
// every write, so Ping (readiness) reports its NOSPACE alarm rather than
// a read that succeeded. The alarm is raised through etcd's maintenance
// API, as etcd raises it itself.
func TestPingSeesASpaceAlarm(t *testing.T) {
	e, cli := testenv.Etcd(t)
	s := newSeq(t, cli)
	ctx := t.Context()
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := cli.Status(ctx, e.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	alarm := &clientv3.AlarmMember{MemberID: st.Header.MemberId, Alarm: pb.AlarmType_NOSPACE}
	if _, err := pb.NewMaintenanceClient(cli.ActiveConnection()).Alarm(ctx, &pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, MemberID: alarm.MemberID, Alarm: alarm.Alarm}); err != nil {
		t.Fatal(err)
	}
	err = s.Ping(ctx)
	if _, nerr := s.Next(ctx, "n"); !errors.Is(nerr, rpctypes.ErrNoSpace) {
		t.Fatalf("Next with the alarm raised: %v, want refused", nerr)
	}
	if _, derr := cli.AlarmDisarm(ctx, alarm); derr != nil {
		t.Fatal(derr)
	}
	if !errors.Is(err, rpctypes.ErrNoSpace) || !strings.Contains(err.Error(), "NOSPACE") {
		t.Fatalf("Ping with the alarm raised: %v, want it to match rpctypes.ErrNoSpace and name the alarm", err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping once disarmed: %v", err)
	}
}
