package server

import (
	"os"
	"path/filepath"
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
		{"Config.MinTTL", func(c *Config) { c.MinTTL = time.Millisecond }},
		{"Config.MinTTL", func(c *Config) { c.MinTTL = 10500 * time.Microsecond }},
		{"Config.MaxTTL", func(c *Config) { c.MaxTTL = 25 * time.Hour }},
		{"Config.MaxTTL", func(c *Config) { c.MinTTL, c.MaxTTL = time.Minute, time.Second }},
		{"Config.DefaultTTL", func(c *Config) { c.MaxTTL = 10 * time.Second }},
		{"Config.DefaultTTL", func(c *Config) { c.DefaultTTL = -time.Second }},
		{"Config.MaxWait", func(c *Config) { c.MaxWait = -time.Second }},
		{"Config.BackendTimeout", func(c *Config) { c.BackendTimeout = -time.Second }},
		{"Config.AuthTokens[1]", func(c *Config) { c.AuthTokens = [][]byte{[]byte("0123456789abcdef"), []byte("short")} }},
		{"Config.AuthTokens[0]", func(c *Config) { c.AuthTokens = [][]byte{[]byte("0123456789 abcdef")} }},
		{"Config.Gatherer", func(c *Config) { c.Registerer = onlyRegisterer{prometheus.NewRegistry()} }},
	} {
		cfg := Config{Locks: locks}
		c.mod(&cfg)
		_, err := New(cfg)
		if err == nil || !strings.Contains(err.Error(), c.field+" ") && !strings.Contains(err.Error(), c.field+":") {
			t.Errorf("%s: New = %v, want an error naming it", c.field, err)
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
		s.maxBody != DefaultMaxBodyBytes || s.backendTimeout != DefaultBackendTimeout || s.auth != nil {
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
	p := write("ok", "# fenced tokens\n\n  first-token-0123456789  \r\n# second:\nsecond-token-abcdefgh\n\n")
	toks, err := LoadTokens(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(toks) != 2 || string(toks[0]) != "first-token-0123456789" || string(toks[1]) != "second-token-abcdefgh" {
		t.Fatalf("tokens %q", toks)
	}
	for _, c := range []struct{ content, want string }{
		{"", "no token"},
		{"# only a comment\n\n", "no token"},
		{"first-token-0123456789\nshort\n", "line 2"},
		{"first-token-0123456789\nhas a space in it 0123\n", "line 2"},
	} {
		_, err := LoadTokens(write("bad", c.content))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error saying %q", c.content, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "short") && strings.Contains(c.content, "short") {
			t.Errorf("the error shows the token: %v", err)
		}
	}
	if _, err := LoadTokens(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing file: no error")
	}
}
