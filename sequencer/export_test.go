package sequencer

import "github.com/fenced/fenced/fence"

// Highest is the largest token the sequencer's issuer knows was issued in
// its keyspace, by it or by others it follows.
func (s *Etcd) Highest() fence.Token {
	s.issuer.mu.Lock()
	defer s.issuer.mu.Unlock()
	return s.issuer.highest
}
