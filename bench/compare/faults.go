package compare

// Fault ids, the scenarios of the table.
const (
	FPause         = "pause"
	FFailover      = "failover"
	FRestart       = "restart"
	FClockJump     = "clock-jump"
	FLeaderKill    = "etcd-leader-kill"
	FLeaderFreeze  = "etcd-leader-freeze"
	FPartRedis     = "partition-redis"
	FLatRedis      = "latency-redis"
	FPartEtcd      = "partition-etcd"
	FLatEtcd       = "latency-etcd"
	FRestoreNewest = "restore-running-newest"
	FRestoreOther  = "restore-running-other"
	FRestoreNew    = "restore-new"
	FRestoreRaise  = "restore-raise-floor"
)

// fault is one scenario, run on a fresh setup for each scheme it applies
// to. Desc is what the scenario does, step by step; the README's table
// links each fault to it.
type fault struct {
	ID      string
	Number  int // the numbering of faults: 1 to 7
	Title   string
	Desc    string
	applies func(s scheme) bool
	// control: a scenario that is expected to break fenced (the documented
	// step skipped); the gate does not apply, violations are its point.
	control bool
}

func redisLease(s scheme) bool { return s.Lease == leaseRedis || s.Lease == leaseRedis5 }
func all(scheme) bool          { return true }
func usesEtcd(s scheme) bool   { return s.Etcd }
func etcdToken(s scheme) bool  { return s.Fenced || s.ID == EtcdMutexRev }
func fencedOnly(s scheme) bool { return s.Fenced }

var faults = []fault{
	{ID: FPause, Number: 1, Title: "holder frozen past its TTL", applies: all,
		Desc: "Worker 1 takes the lock and reads two balances; the orchestrator freezes its process with SIGSTOP (every thread, keep-alive included). " +
			"Worker 2 is given a transfer on the same accounts and worker 3 two others. Once worker 2 has taken the lock and finished its transfer " +
			"(or after a deadline, when the lock still excludes it), worker 1 gets SIGCONT and writes what it computed before the pause, without looking at its lease."},
	{ID: FFailover, Number: 2, Title: "Redis failover to a replica that missed the lease", applies: redisLease,
		Desc: "Each Redis node has an asynchronous replica (for Redlock, three of the five nodes: a majority). Before worker 1 acquires, each replica is frozen and its link cut (CLIENT KILL TYPE replica), " +
			"so the lease (and an INCR counter) never reaches it. Worker 1 takes the lock and reads; the primary is killed, the replica resumed and promoted (REPLICAOF NO ONE), and every client's proxy " +
			"pointed at it, as Sentinel or a DNS switch would. Worker 2 then acquires on the new primary; worker 1 writes after worker 2 is done."},
	{ID: FRestart, Number: 3, Title: "Redis restarts without persistence", applies: redisLease,
		Desc: "Worker 1 takes the lock and reads; the Redis node (for Redlock, three of the five) is killed and started again, empty, on the same port. Worker 2 acquires; worker 1 writes after worker 2 is done."},
	{ID: FClockJump, Number: 6, Title: "clock jump on the Redis server", applies: redisLease,
		Desc: "redis-server runs under libfaketime (real-time clock only; glibc's malloc_debug preloaded too, or jemalloc aborts at start). Worker 1 takes the lock and reads; the server's clock " +
			"(for Redlock, three of the five servers') jumps forward by far more than the TTL, so Redis expires the lease at once. Worker 2 acquires; worker 1 writes after worker 2 is done."},
	{ID: FLeaderKill, Number: 4, Title: "etcd leader killed", applies: usesEtcd,
		Desc: "Three etcd members, each in its own process; each worker talks to one member only: worker 1 to the leader, workers 2 and 3 to the followers. Worker 1 takes the lock and reads; " +
			"workers 2 and 3 are acquiring when the leader is killed (SIGKILL). Worker 2 acquires once the survivors have a leader and worker 1's lease, if it is in etcd, has expired; worker 1 writes after worker 2 is done, and the member is started again."},
	{ID: FLeaderFreeze, Number: 4, Title: "etcd leader frozen", applies: usesEtcd,
		Desc: "As the kill, but the leader is frozen with SIGSTOP and resumed (SIGCONT) after worker 1 has written: a member that comes back believing it still leads."},
	{ID: FPartRedis, Number: 5, Title: "partition between one client and Redis", applies: redisLease,
		Desc: "Every client reaches Redis through its own fault-injecting TCP proxy on loopback (internal/faultproxy). Worker 1 takes the lock and reads; its proxies stop forwarding in both directions, " +
			"so its keep-alive cannot reach Redis and the lease expires. Worker 2 acquires; worker 1 writes (Postgres is not partitioned) after worker 2 is done; then the partition heals."},
	{ID: FLatRedis, Number: 5, Title: "latency between one client and Redis during its acquisition", applies: redisLease,
		Desc: "Worker 1's proxies delay every chunk by 1.5×TTL. Its SET NX lands, and the lease expires before the reply gets back. Once the lease is in Redis, worker 2 tries: it acquires when the lease " +
			"expires and reads. A lock that does not subtract the time its acquisition took then hands worker 1 the lock too: both hold and both have read the same balances. Worker 2 writes first, then worker 1."},
	{ID: FPartEtcd, Number: 5, Title: "partition between one client and etcd", applies: usesEtcd,
		Desc: "Every client reaches etcd through its own proxy. With the lease in etcd, worker 1 takes the lock and reads, then its proxy stops forwarding: its keep-alive cannot reach etcd and the lease expires. " +
			"With the lease in Redis and the token from etcd (fenced/redis, fenced/redlock), the partition starts before worker 1 acquires, so it holds the lease while its token request hangs: " +
			"the lease expires, worker 2 acquires and writes, the partition heals and worker 1's token arrives late. Worker 1 writes after worker 2 is done."},
	{ID: FLatEtcd, Number: 5, Title: "latency between one client and etcd during its acquisition", applies: usesEtcd,
		Desc: "As the Redis latency, on worker 1's etcd proxy, 1.5 s per chunk (the etcd TTL is 1 s)."},
	{ID: FRestoreNewest, Number: 7, Title: "etcd restored from an older snapshot; running processes, the newest issuer first", applies: fencedOnly,
		Desc: "One etcd member. After the warm-up a snapshot is saved; worker 3 then makes three transfers and worker 1 takes the lock and reads, so both hold tokens newer than the snapshot; worker 1 is frozen. " +
			"etcd is killed, the snapshot restored into a new data dir and the member started on the same address, without raise-floor. Worker 3 (running all along; it issued tokens above the snapshot) acquires first, " +
			"then worker 2; worker 1 is resumed and writes."},
	{ID: FRestoreOther, Number: 7, Title: "etcd restored from an older snapshot; running processes, another process first", applies: etcdToken,
		Desc: "As above, but after the restore worker 2 acquires first: it has been running all along, but every token it issued is older than the snapshot."},
	{ID: FRestoreNew, Number: 7, Title: "etcd restored; processes started after the restore, no raise-floor (control)", applies: fencedOnly, control: true,
		Desc: "As above, but workers 2 and 3 are stopped before the restore and new worker processes are started after it, without `fenced admin raise-floor`: the documented step is skipped, so nothing can tell fenced that tokens went back. " +
			"A control: it shows what the step is for."},
	{ID: FRestoreRaise, Number: 7, Title: "etcd restored; processes started after the restore, with raise-floor", applies: fencedOnly,
		Desc: "As the control, but sequencer.RaiseFloor (what `fenced admin raise-floor` runs) is called once after the restore, before the new processes start."},
}

func faultByID(id string) (fault, bool) {
	for _, f := range faults {
		if f.ID == id {
			return f, true
		}
	}
	return fault{}, false
}
