// Package sequencer issues fencing tokens ordered by Raft consensus.
//
// A token is the revision of the etcd transaction that granted it, plus a
// floor offset (see below). etcd's revision grows by one with every write
// transaction of the whole cluster, is agreed by Raft, survives restarts and
// leader changes, and never goes backwards, so for one lock name every grant
// gets a token larger than every grant that completed before it began.
//
// [Etcd] is the implementation of [Sequencer]. Concurrent calls for
// different names are group-committed: they share one transaction, a Put of
// one counter key, and so one revision and one Raft round trip. The same
// name is never twice in one transaction, so a name's tokens are unique. The
// batch is not held open by a timer: a lone request is sent at once, and
// requests that arrive while a transaction is in flight form the next
// batch. No key is kept per name: etcd's state does not grow with the names
// ever used. A retried call takes a new token; the lease store records the
// one a lease uses.
//
// [Keyspace] names fenced's keys under a prefix and [Issuer] is the one
// place where a revision and the floor offset become a token; lock's etcd
// lease store uses both. See docs/design.md, "Keys and tokens".
//
// # Restore safety
//
// Restoring etcd from an older snapshot, or replacing it by a new empty
// cluster, takes its revision back, and with it the tokens. [RaiseFloor] is
// the one step that makes every token issued afterwards exceed every token
// issued before: it stores an offset that is added to every revision. The new
// floor is the largest of the minimum you give, the current highest token, and
// the current time in microseconds since the Unix epoch. The clock makes the
// step safe without knowing the old tokens, provided the cluster never
// averaged more than one write per microsecond since the previous floor
// (etcd's ceiling is far below that); give the highest token your resources
// have seen as the minimum to be safe even against a wrong clock. Run it once
// after a restore and before fenced serves again (fenced admin raise-floor).
// [EnsureFloor] does the same automatically on a cluster that never had a
// floor, so a brand-new cluster (or a fresh fenced dev data dir) cannot
// reissue tokens that resources still remember; the [Issuer] runs it when
// it finds no floor, and raises the floor itself when a running process
// sees etcd's revision go back below a token it issued.
//
// # Embedded etcd
//
// [StartEmbedded] runs a real etcd member in this process: a single member in
// a given or temporary directory for development and tests, or one member of
// a multi-member cluster, so that fenced nodes can form their own Raft
// cluster.
package sequencer
