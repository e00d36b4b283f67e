package main_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/internal/testenv"
	"github.com/fenced/fenced/sequencer"
)

// TestAdminRaiseFloorRefusesAHugeMin: a --min-token above 2^62 (a typo
// with extra digits) is refused before etcd is asked, saying that nothing
// lowers a floor and what to give instead. Taken, it left one token below
// 2^63, then a 503 on every acquisition for good.
func TestAdminRaiseFloorRefusesAHugeMin(t *testing.T) {
	t.Parallel()
	e, _ := testenv.Etcd(t)
	prefix := "/" + testenv.Name(t) + "/"
	for _, args := range [][]string{
		{"admin", "raise-floor", "--etcd-endpoints", e.ClientURL(), "--etcd-prefix", prefix, "--min-token", "9223372036854775805"},
		{"admin", "raise-floor", "--etcd-endpoints", e.ClientURL(), "--etcd-prefix", prefix, "--min-token", strconv.FormatUint(uint64(sequencer.MaxMinToken)+1, 10)},
		{"dev", "--listen", "127.0.0.1:0", "--raise-floor", "--min-token", "9223372036854775805"},
	} {
		code, out, stderr := run(t, nil, args...)
		if code != 2 || strings.Contains(out, "floor raised") || strings.Contains(out, "listening") {
			t.Errorf("fenced %s: exit %d, stdout %q, stderr:\n%s\nwant exit 2, nothing raised", strings.Join(args, " "), code, out, stderr)
		}
		for _, want := range []string{"--min-token", "2^62", "nothing lowers a floor", "the highest token your resources have seen"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("fenced %s: stderr %q; want it to say %q", strings.Join(args, " "), stderr, want)
			}
		}
	}
	if code, out, stderr := run(t, nil, "admin", "floor", "--etcd-endpoints", e.ClientURL(), "--etcd-prefix", prefix); code != 0 || !strings.Contains(out, "(floor offset 0,") {
		t.Fatalf("admin floor after the refused raises: exit %d, %q %s; want no floor set", code, out, stderr)
	}
}

// TestAdminFloorNamesThePrefix: admin floor and raise-floor name the etcd
// prefix they acted on, and say when no token was ever issued under it (a
// prefix fenced never served, or a new cluster), without refusing: a new
// cluster is raised before fenced first runs (docs/design.md).
func TestAdminFloorNamesThePrefix(t *testing.T) {
	t.Parallel()
	e, cli := testenv.Etcd(t)
	used, unused := "/"+testenv.Name(t)+"/", "/"+testenv.Name(t)+"-wrong/"
	seq, err := sequencer.NewEtcd(cli, sequencer.WithPrefix(used))
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
	if _, err := seq.Next(t.Context(), "n"); err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"floor", "raise-floor"} {
		for _, prefix := range []string{unused, used} {
			code, out, stderr := run(t, nil, "admin", sub, "--etcd-endpoints", e.ClientURL(), "--etcd-prefix", prefix)
			never := strings.Contains(out, "no token was ever issued under")
			if code != 0 || !strings.Contains(out, strconv.Quote(prefix)) || never != (prefix == unused) {
				t.Errorf("admin %s --etcd-prefix %s: exit %d, stdout %q, stderr %q; want 0, naming the prefix, and saying no token was issued under it: %v",
					sub, prefix, code, out, stderr, prefix == unused)
			}
		}
	}
}

// TestAdminFloorSaysTokensAreUsedUp: admin floor on a floor that leaves
// no token below 2^63 says so, and exits 1, rather than print a next
// token above fence.MaxToken as if all were well. The floor is written by
// hand: RaiseFloor no longer sets one that high.
func TestAdminFloorSaysTokensAreUsedUp(t *testing.T) {
	t.Parallel()
	e, cli := testenv.Etcd(t)
	prefix := "/" + testenv.Name(t) + "/"
	if _, err := cli.Put(t.Context(), prefix+"floor", strconv.FormatUint(uint64(fence.MaxToken)-1, 10)); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := run(t, nil, "admin", "floor", "--etcd-endpoints", e.ClientURL(), "--etcd-prefix", prefix)
	if code != 1 || !strings.Contains(stderr, "no token is left below 2^63") || !strings.Contains(stderr, "--etcd-prefix") {
		t.Fatalf("admin floor with no token left: exit %d, stdout %q, stderr %q; want exit 1, saying no token is left and what to do", code, out, stderr)
	}
}

// TestAdminSubcommandHelp: every admin command's --help (and fenced help
// admin <command>, fenced admin help <command>) prints that command's own
// usage, not the admin summary.
func TestAdminSubcommandHelp(t *testing.T) {
	t.Parallel()
	for _, sub := range []string{"raise-floor", "floor", "pg-sql", "pg-migrate"} {
		for _, args := range [][]string{{"admin", sub, "--help"}, {"help", "admin", sub}, {"admin", "help", sub}} {
			code, out, stderr := run(t, nil, args...)
			if code != 0 || !strings.HasPrefix(out, "Usage: fenced admin "+sub+" [flags]") || strings.Contains(out, "fenced admin pg-sql [flags]   ") {
				t.Errorf("fenced %s: exit %d, stderr %q, stdout:\n%s\nwant %s's own usage", strings.Join(args, " "), code, stderr, out, sub)
			}
		}
	}
	_, out, _ := run(t, nil, "admin", "raise-floor", "--help")
	for _, want := range []string{"--min-token", "2^62", "restored from an older snapshot"} {
		if !strings.Contains(out, want) {
			t.Errorf("admin raise-floor --help lacks %q:\n%s", want, out)
		}
	}
}
