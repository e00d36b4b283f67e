package main

// The orchestrator and its workers talk in lines of JSON: commands on the
// worker's stdin, reports on its stdout. A worker does one command at a time
// and reports its result before it reads the next; it exits when its stdin
// closes. Its stderr is its log.

// Commands.
const (
	opTransfer = "transfer" // acquire the lock, read, (pause,) write, release
	opGo       = "go"       // the paused worker may write now
)

// command is a line on a worker's stdin.
type command struct {
	Op       string `json:"op"`
	Transfer string `json:"transfer,omitempty"`
	From     int    `json:"from,omitempty"`
	To       int    `json:"to,omitempty"`
	Amount   int64  `json:"amount,omitempty"`
	// Pause: after reading the balances, report "read" and block until the
	// command "go". The orchestrator freezes the worker at that point.
	Pause bool `json:"pause,omitempty"`
}

// Reports.
const (
	reportRead   = "read"   // a pausing transfer has read its balances, under the lock
	reportResult = "result" // a transfer is done
)

// Outcomes of a transfer's write.
const (
	outcomeApplied = "applied"
	outcomeStale   = "stale" // rejected by the fence
)

// report is a line on a worker's stdout.
type report struct {
	Type        string `json:"type"`
	Transfer    string `json:"transfer"`
	From        int    `json:"from"`
	To          int    `json:"to"`
	FromBalance int64  `json:"from_balance"` // as read
	ToBalance   int64  `json:"to_balance"`
	// Holder is what the lock's key holds while this worker has it: the
	// random value of the Redis-only lock, or fenced's lease id.
	Holder string `json:"holder"`
	Token  uint64 `json:"token,omitempty"` // fenced only

	Outcome string `json:"outcome,omitempty"`
	Highest uint64 `json:"highest,omitempty"` // stale: the highest token the ledger had admitted
	Reason  string `json:"reason,omitempty"`  // stale: the error
	// LeaseLost: the release found that the lock was no longer this
	// worker's (it had expired, and maybe been taken by another).
	LeaseLost bool `json:"lease_lost,omitempty"`
}
