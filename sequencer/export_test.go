package sequencer

import (
	"context"

	"github.com/fenced/fenced/fence"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Highest is the largest token the sequencer's issuer knows was issued in
// its keyspace, by it or by others it follows.
func (s *Etcd) Highest() fence.Token {
	s.issuer.mu.Lock()
	defer s.issuer.mu.Unlock()
	return s.issuer.highest
}

// RaiseFloorAnyMin is RaiseFloor without its bound on min (MaxMinToken),
// as the issuer raises the floor after a restore: for tests that need a
// floor near fence.MaxToken.
func RaiseFloorAnyMin(ctx context.Context, cli *clientv3.Client, prefix string, min fence.Token) (Floor, error) {
	f, _, err := raiseFloor(ctx, cli, prefix, min, false)
	return f, err
}
