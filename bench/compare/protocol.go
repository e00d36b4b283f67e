package compare

// The orchestrator and its workers talk in lines of JSON, as in
// examples/ledger: commands on a worker's stdin, events on its stdout, its
// log on stderr. A worker reads commands at any time (a "go" may come while
// it holds a lock) and runs its transfers one at a time, in order.

// Commands.
const (
	opTransfer = "transfer" // acquire, read, (hold,) write, release
	opGo       = "go"       // the holding worker may write now
)

// command is a line on a worker's stdin.
type command struct {
	Op       string `json:"op"`
	Transfer string `json:"transfer,omitempty"`
	From     int    `json:"from,omitempty"`
	To       int    `json:"to,omitempty"`
	Amount   int64  `json:"amount,omitempty"`
	// Hold: after reading the balances under the lock, report "held" and
	// wait for "go" before writing.
	Hold bool `json:"hold,omitempty"`
}

// What an event is about.
const (
	evAcquire = "acquire"
	evRead    = "read" // a read admitted through the fence (fenced writers only)
	evWrite   = "write"
	evRelease = "release"
	evHeld    = "held" // a holding transfer has read and waits for "go"
	evDone    = "done" // a transfer is over
)

// Outcomes.
const (
	outOK       = "ok"       // acquire, release
	outAdmitted = "admitted" // read, write
	outRejected = "rejected" // read, write: the fence said stale
	outUnknown  = "unknown"  // read, write: an error; the write may or may not have committed
	outFailed   = "failed"   // acquire: no lock
	outLost     = "lost"     // release: the lock was no longer this holder's
)

// event is a line on a worker's stdout. Every operation is reported twice:
// at its invocation (Inv) and at its completion, with the same Op number,
// so that an operation that never completes (a killed worker) still shows.
// Times are the wall clock in nanoseconds: every process runs on one host.
type event struct {
	Worker   int    `json:"w"` // set by the orchestrator
	Op       int    `json:"op"`
	What     string `json:"what"`
	Inv      bool   `json:"inv,omitempty"`
	T        int64  `json:"t"`
	Transfer string `json:"transfer,omitempty"`
	Holder   string `json:"holder,omitempty"` // w<worker>#<acquisition>
	Token    uint64 `json:"token,omitempty"`
	Outcome  string `json:"outcome,omitempty"`
	Highest  uint64 `json:"highest,omitempty"` // rejected: the highest token admitted
	Err      string `json:"err,omitempty"`
}
