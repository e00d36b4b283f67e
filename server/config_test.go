package server

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fenced/fenced/lock"
	"github.com/prometheus/client_golang/prometheus"
)

// nopStore is a LeaseStore that New can be given without a backend; the
// config tests never call it.
type nopStore struct{ lock.LeaseStore }

func TestConfigErrors(t *testing.T) {
	locks := newLocks(t, nopStore{})
	for _, c := range []struct {
		field string
		mod   func(*Config)
	}{
		{"Config.Locks", func(c *Config) { c.Locks = nil }},
		{"Config.MaxBodyBytes", func(c *Config) { c.MaxBodyBytes = -1 }},
		{"Config.MaxBodyBytes", func(c *Config) { c.MaxBodyBytes = 10 }},
		{"Config.MinTTL", func(c *Config) { c.MinTTL = time.Millisecond }},
		{"Config.MinTTL", func(c *Config) { c.MinTTL = 10500 * time.Microsecond }},
		{"Config.MaxTTL", func(c *Config) { c.MaxTTL = 25 * time.Hour }},
		{"Config.MaxTTL", func(c *Config) { c.MinTTL, c.MaxTTL = time.Minute, time.Second }},
		{"Config.DefaultTTL", func(c *Config) { c.MaxTTL = 10 * time.Second }},
		{"Config.DefaultTTL", func(c *Config) { c.DefaultTTL = -time.Second }},
		{"Config.MaxWait", func(c *Config) { c.MaxWait = -time.Second }},
		{"Config.BackendTimeout", func(c *Config) { c.BackendTimeout = -time.Second }},
		{"Config.Gatherer", func(c *Config) { c.Registerer = onlyRegisterer{prometheus.NewRegistry()} }},
	} {
		cfg := Config{Locks: locks}
		c.mod(&cfg)
		_, err := New(cfg)
		var ce *ConfigError
		if err == nil || !strings.Contains(err.Error(), c.field+" ") && !strings.Contains(err.Error(), c.field+":") ||
			!errors.As(err, &ce) || "Config."+ce.Field != c.field {
			t.Errorf("%s: New = %v, want a *ConfigError naming it", c.field, err)
		}
		if c.field != "Config.Locks" && c.field != "Config.Gatherer" && (cfg.Check() == nil) {
			t.Errorf("%s: Check accepts what New refuses", c.field)
		}
	}
	s, err := New(Config{Locks: locks, MinTTL: time.Second, MaxTTL: time.Hour, DefaultTTL: time.Minute, MaxWait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if s.limits != (limits{minTTL: time.Second, maxTTL: time.Hour, defaultTTL: time.Minute, maxWait: 5 * time.Second}) {
		t.Fatalf("limits %+v", s.limits)
	}
	s, err = New(Config{Locks: locks})
	if err != nil {
		t.Fatal(err)
	}
	if s.limits != (limits{minTTL: lock.MinTTL, maxTTL: lock.MaxTTL, defaultTTL: DefaultTTL, maxWait: DefaultMaxWait}) ||
		s.maxBody != DefaultMaxBodyBytes || s.backendTimeout != DefaultBackendTimeout || s.tokens.Load() != nil {
		t.Fatalf("defaults: %+v", s)
	}
}

type onlyRegisterer struct{ prometheus.Registerer }

func TestLoadTokens(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := write("ok", "# fenced tokens\n\n  first-token-0123456789  \r\n# second:\nsecond-token-abcdefgh\tname=ci prefixes=build:,deploy: allow=acquire,inspect\n\n")
	toks, err := LoadTokens(p)
	if err != nil {
		t.Fatal(err)
	}
	if toks.Len() != 2 {
		t.Fatalf("%d tokens, want 2", toks.Len())
	}
	first, second := toks.entries[0], toks.entries[1]
	if first.name != "line 3" || first.allow != PermAll || first.prefixes != nil {
		t.Fatalf("a bare token: %+v, want every permission on every lock", first)
	}
	if second.name != "ci" || second.allow != PermAcquire|PermInspect || !slices.Equal(second.prefixes, []string{"build:", "deploy:"}) {
		t.Fatalf("a scoped token: %+v", second)
	}
	for _, c := range []struct{ content, want string }{
		{"", "no token"},
		{"# only a comment\n\n", "no token"},
		{"first-token-0123456789\nshort\n", "line 2"},
		{"first-token-0123456789\nhas a space in it 0123\n", "line 2"},
		{"first-token-0123456789 allow=acquire,delete\n", `line 1: allow=: unknown permission "delete"`},
		{"first-token-0123456789 prefixes=a/b\n", "line 1: prefixes="},
		{"first-token-0123456789 prefixes=\n", "line 1"},
		{"first-token-0123456789 owner=me\n", `unknown attribute "owner"`},
		{"first-token-0123456789 name=a name=b\n", "name= appears twice"},
		{"first-token-0123456789 name=a\nsecond-token-abcdefgh name=a\n", `both named "a"`},
		{"first-token-0123456789\nfirst-token-0123456789\n", "repeats the secret"},
		// Errors about two tokens name both by their lines in the file,
		// comments and blank lines counted, not by their rank among tokens.
		{"# ops\nfirst-token-0123456789 name=a\n\n# ci\nsecond-token-abcdefgh name=a\n", `line 2 and line 5 are both named "a"`},
		{"# ops\nfirst-token-0123456789 name=a\n# again\nfirst-token-0123456789 name=b\n", `line 4 (token "b") repeats the secret of line 2 (token "a")`},
	} {
		_, err := LoadTokens(write("bad", c.content))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error saying %q", c.content, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "0123456789") {
			t.Errorf("the error shows the token: %v", err)
		}
	}
	if _, err := LoadTokens(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing file: no error")
	}
	if _, err := NewTokens(Token{Secret: []byte("first-token-0123456789"), Prefixes: []string{}}); err == nil {
		t.Fatal("an empty, non-nil list of prefixes accepted")
	}
}

func TestPermissions(t *testing.T) {
	p, err := ParsePermissions("inspect,acquire,metrics,force-release")
	if err != nil || p != PermAll || p.String() != "acquire,inspect,force-release,metrics" {
		t.Fatalf("ParsePermissions: %v %v", p, err)
	}
	if _, err := ParsePermissions("acquire,,inspect"); err == nil {
		t.Fatal("an empty permission accepted")
	}
}

// fullAccess is a token set of tokens with every permission.
func fullAccess(t testing.TB, secrets ...string) *Tokens {
	t.Helper()
	var ts []Token
	for _, s := range secrets {
		ts = append(ts, Token{Secret: []byte(s)})
	}
	toks, err := NewTokens(ts...)
	if err != nil {
		t.Fatal(err)
	}
	return toks
}
