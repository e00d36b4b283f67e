package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
)

// modeResult is what a mode did and what the audit of its ledger found.
type modeResult struct {
	Mode                   string `json:"mode"` // "redis-only" or "fenced"
	Workers                int    `json:"workers"`
	TransfersAttempted     int    `json:"transfers_attempted"`   // transfers done under the lock, once per try
	TransfersApplied       int    `json:"transfers_applied"`     // rows in the transfers log
	StaleWritesRejected    int    `json:"stale_writes_rejected"` // transfers whose token the ledger rejected (at the write, or at the read)
	LostUpdates            int    `json:"lost_updates"`
	StaleWritesApplied     int    `json:"stale_writes_applied"`  // by a holder after a later holder had written
	WritesAfterDeadline    int    `json:"writes_after_deadline"` // after the writer's own lease deadline, by the clock
	ReleasesFoundLeaseLost int    `json:"releases_found_lease_lost"`
	MoneyConserved         bool   `json:"money_conserved"`
	BalancesMatchLog       bool   `json:"balances_match_log"`
	TotalBefore            int64  `json:"total_before"`
	TotalAfter             int64  `json:"total_after"`
	PausedTransfer         string `json:"paused_transfer"`
	PausedWrite            string `json:"paused_write"`  // "applied" or "rejected"
	PauseMS                int64  `json:"pause_ms"`      // how long the worker was frozen
	LeaseGoneMS            int64  `json:"lease_gone_ms"` // when its lease was seen gone, after SIGSTOP
	InvariantOK            bool   `json:"invariant_ok"`
	Verdict                string `json:"verdict"`

	applied int // applied results the workers reported, checked against the log
}

func writeJSON(w io.Writer, rs []modeResult) error {
	enc := json.NewEncoder(w)
	for _, r := range rs {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

// writeTable prints the modes side by side.
func writeTable(w io.Writer, rs []modeResult) error {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	row := func(label string, f func(modeResult) string) {
		fmt.Fprint(tw, label)
		for _, r := range rs {
			fmt.Fprint(tw, "\t", f(r))
		}
		fmt.Fprintln(tw)
	}
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	fmt.Fprintln(w)
	row("", func(r modeResult) string {
		if r.Mode == modeRedisOnly {
			return "Redis-only lock"
		}
		return "fenced"
	})
	row("transfers attempted", func(r modeResult) string { return fmt.Sprint(r.TransfersAttempted) })
	row("transfers applied", func(r modeResult) string { return fmt.Sprint(r.TransfersApplied) })
	row("stale writes rejected", func(r modeResult) string { return fmt.Sprint(r.StaleWritesRejected) })
	row("lost updates", func(r modeResult) string { return fmt.Sprint(r.LostUpdates) })
	row("stale writes applied", func(r modeResult) string { return fmt.Sprint(r.StaleWritesApplied) })
	row("writes after own lease deadline", func(r modeResult) string { return fmt.Sprint(r.WritesAfterDeadline) })
	row("money conserved", func(r modeResult) string {
		return fmt.Sprintf("%s (%d)", yes(r.MoneyConserved), r.TotalAfter)
	})
	row("balances = replay of the log", func(r modeResult) string { return yes(r.BalancesMatchLog) })
	row("paused worker's write", func(r modeResult) string {
		return fmt.Sprintf("%s (frozen %dms)", r.PausedWrite, r.PauseMS)
	})
	row("invariant", func(r modeResult) string {
		if r.InvariantOK {
			return "holds"
		}
		return "BROKEN"
	})
	return tw.Flush()
}
