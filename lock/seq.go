package lock

import (
	"sync/atomic"
	"time"
)

// lastSeq is the last refresh sequence number this process handed out.
var lastSeq atomic.Uint64

// NextRefreshSeq returns a refresh sequence number higher than every one
// this process returned before: the microseconds since the Unix epoch, or
// the last one plus one when the clock has not moved on (or went back).
// Every Lease numbers its refreshes with it. Taken from the clock, the
// numbers of a process that refreshes a lease after another (a restarted
// one adopting its lease id) start above the other's, as long as the two
// clocks agree to better than the time between their refreshes; one
// counter for the process orders the refreshes of Leases that share a
// lease id (a reentrant lock's holds). Below 2^53 until the year 2255, so
// JSON numbers carry it exactly.
func NextRefreshSeq() uint64 {
	now := uint64(max(time.Now().UnixMicro(), 0))
	for {
		last := lastSeq.Load()
		next := max(now, last+1)
		if lastSeq.CompareAndSwap(last, next) {
			return next
		}
	}
}
