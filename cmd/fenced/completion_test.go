package main_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCompletion sources the bash completion and completes command lines
// with it; the zsh and fish scripts carry the same commands and flags.
func TestCompletion(t *testing.T) {
	t.Parallel()
	code, script, stderr := run(t, nil, "completion", "bash")
	if code != 0 {
		t.Fatalf("completion bash: exit %d\n%s", code, stderr)
	}
	file := filepath.Join(t.TempDir(), "fenced.bash")
	if err := os.WriteFile(file, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	complete := func(words ...string) []string {
		t.Helper()
		// COMP_WORDS as bash splits the line; the last word is the one
		// being completed.
		quoted := make([]string, len(words))
		for i, w := range words {
			quoted[i] = "'" + w + "'"
		}
		sh := `source "$1"; COMP_WORDS=(` + strings.Join(quoted, " ") + `); COMP_CWORD=$((${#COMP_WORDS[@]}-1)); _fenced; printf '%s\n' "${COMPREPLY[@]}"`
		out, err := exec.Command("bash", "-c", sh, "bash", file).CombinedOutput()
		if err != nil {
			t.Fatalf("bash: %v\n%s", err, out)
		}
		return strings.Fields(string(out))
	}
	for _, c := range []struct {
		words []string
		want  string
	}{
		{[]string{"fenced", "se"}, "serve"},
		{[]string{"fenced", "admin", "pg-m"}, "pg-migrate"},
		{[]string{"fenced", "serve", "--redis-sent"}, "--redis-sentinel-addrs --redis-sentinel-password"},
		{[]string{"fenced", "exec", "--client-t"}, "--client-tls-ca --client-tls-cert --client-tls-key --client-token --client-token-file"},
		{[]string{"fenced", "admin", "raise-floor", "--min"}, "--min-token"},
		{[]string{"fenced", "dev", "--log-format", ""}, "text json"},
		{[]string{"fenced", "completion", ""}, "bash zsh fish"},
	} {
		if got := strings.Join(complete(c.words...), " "); got != c.want {
			t.Errorf("%q completes to %q, want %q", c.words, got, c.want)
		}
	}
	_, zsh, _ := run(t, nil, "completion", "zsh")
	if !strings.HasPrefix(zsh, "#compdef fenced\n") || !strings.Contains(zsh, "bashcompinit") || !strings.Contains(zsh, script) {
		t.Errorf("zsh completion:\n%s", zsh)
	}
	_, fish, _ := run(t, nil, "completion", "fish")
	for _, want := range []string{
		"complete -c fenced -n __fish_use_subcommand -a serve",
		"complete -c fenced -n '__fish_seen_subcommand_from exec' -l url",
		"complete -c fenced -n '__fish_seen_subcommand_from serve' -l lease-store",
		"-x -a 'redis etcd'",
	} {
		if !strings.Contains(fish, want) {
			t.Errorf("fish completion lacks %q", want)
		}
	}
}
