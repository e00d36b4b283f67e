package testenv

import (
	"path/filepath"
	"testing"

	"github.com/fenced/fenced/sequencer"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
)

// SaveEtcdSnapshot saves a snapshot of e's data, as etcdctl snapshot save
// does, and returns its path (in t's temp dir).
func SaveEtcdSnapshot(t testing.TB, e *sequencer.Embedded) string {
	t.Helper()
	snap := filepath.Join(t.TempDir(), "snap.db")
	if _, err := snapshot.NewV3(zap.NewNop()).Save(t.Context(), clientv3.Config{Endpoints: []string{e.ClientURL()}, Logger: zap.NewNop()}, snap); err != nil {
		t.Fatal(err)
	}
	return snap
}

// RestoreEtcd starts a new single member from snap, as etcdutl snapshot
// restore does: etcd gone back to when snap was saved. t.Cleanup closes it.
func RestoreEtcd(t testing.TB, snap string) *sequencer.Embedded {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "restored")
	peer := FreeURL(t)
	if err := snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
		SnapshotPath: snap, Name: "fenced", OutputDataDir: dir,
		PeerURLs: []string{peer}, InitialCluster: "fenced=" + peer, InitialClusterToken: "fenced",
	}); err != nil {
		t.Fatal(err)
	}
	e, err := sequencer.StartEmbedded(t.Context(), sequencer.EmbedConfig{Dir: dir, PeerURL: peer, UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}
