package main_test

import (
	"strings"
	"testing"
)

// TestFlagAfterNameSaysFlagsGoFirst: a flag after the lock NAME
// (`fenced exec mylock --ttl 5s -- true`, as `fenced locks get NAME --json`
// allows) was refused with "put -- before the command", which, followed,
// ran --ttl as the command. The usage error now says that flags go before
// NAME; a command after NAME without -- still gets the advice about --.
func TestFlagAfterNameSaysFlagsGoFirst(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"exec", "mylock", "--ttl", "5s", "--", "true"}, `"--ttl" after the lock NAME: flags go before NAME: fenced exec [flags] NAME [-- CMD [ARG...]]`},
		{[]string{"exec", "mylock", "-try"}, `"-try" after the lock NAME: flags go before NAME`},
		{[]string{"elect", "myelection", "--observe"}, `"--observe" after the election NAME: flags go before NAME: fenced elect [flags] NAME [-- CMD [ARG...]]`},
		{[]string{"exec", "mylock", "true"}, "put -- before the command"},
	} {
		code, _, stderr := run(t, nil, c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("fenced %s: exit %d, want 2 with %q; stderr:\n%s", strings.Join(c.args, " "), code, c.want, stderr)
		}
	}
}
