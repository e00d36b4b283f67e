package server

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/fenced/fenced/lock"
)

// MinTokenLen is the shortest bearer token accepted.
const MinTokenLen = 16

// Permission is what a bearer token may do. Permissions combine with |.
type Permission uint8

// The permissions a token may have.
const (
	// PermAcquire: acquire, refresh and release leases (the holder's
	// operations).
	PermAcquire Permission = 1 << iota
	// PermInspect: read a lock's state (GET /v1/locks/{name}).
	PermInspect
	// PermForceRelease: release a lease the caller does not hold, as an
	// operator (reserved for DELETE /v1/locks/{name}).
	PermForceRelease
	// PermMetrics: read GET /metrics. Lock names do not limit it.
	PermMetrics

	// PermAll is every permission: a token on a line of its own.
	PermAll = PermAcquire | PermInspect | PermForceRelease | PermMetrics
)

var permNames = []struct {
	p    Permission
	name string
}{{PermAcquire, "acquire"}, {PermInspect, "inspect"}, {PermForceRelease, "force-release"}, {PermMetrics, "metrics"}}

// String lists the permissions by name, comma-separated, as a token file
// writes them: "acquire,inspect".
func (p Permission) String() string {
	var names []string
	for _, n := range permNames {
		if p&n.p != 0 {
			names = append(names, n.name)
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ",")
}

// ParsePermissions reads a comma-separated list of permission names:
// acquire, inspect, force-release, metrics.
func ParsePermissions(s string) (Permission, error) {
	var p Permission
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		found := false
		for _, n := range permNames {
			if f == n.name {
				p |= n.p
				found = true
			}
		}
		if !found {
			return 0, fmt.Errorf("unknown permission %q; want acquire, inspect, force-release or metrics, comma-separated", f)
		}
	}
	return p, nil
}

// Token is a bearer token and what it may do, as etcd's roles and Consul's
// ACL policies limit a credential to key prefixes and operations.
type Token struct {
	// Name identifies the token in logs and in 403 answers; the secret
	// never appears there. Default "token N" (its position, from 1).
	Name string
	// Secret is the bearer token: at least MinTokenLen bytes of printable
	// ASCII without spaces.
	Secret []byte
	// Prefixes limits the lock names the token may touch to those starting
	// with one of these (each 1 to 200 characters of a lock name). nil:
	// every lock name.
	Prefixes []string
	// Allow is what the token may do. 0 means PermAll.
	Allow Permission
}

// Tokens is a set of bearer tokens, each with its permissions. It does not
// change once made; Server.SetTokens swaps in a new set.
type Tokens struct {
	entries []tokenEntry
}

type tokenEntry struct {
	name     string
	digest   [sha256.Size]byte
	prefixes []string // nil: every name
	allow    Permission
}

// NewTokens checks ts and returns them as a set. Errors name the token by
// its Name or position, never by its secret.
func NewTokens(ts ...Token) (*Tokens, error) {
	return newTokens(ts, func(i int) string { return fmt.Sprintf("token %d", i+1) })
}

// newTokens is NewTokens with where(i) saying where ts[i] came from (its
// argument, or its line in a file), for errors about two tokens.
func newTokens(ts []Token, where func(i int) string) (*Tokens, error) {
	if len(ts) == 0 {
		return nil, errors.New("server: no token")
	}
	t := &Tokens{}
	names := map[string]int{}
	digests := map[[sha256.Size]byte]int{}
	for i, tok := range ts {
		e := tokenEntry{name: tok.Name, prefixes: tok.Prefixes, allow: tok.Allow}
		if e.name == "" {
			e.name = fmt.Sprintf("token %d", i+1)
		}
		if err := checkToken(tok.Secret); err != nil {
			return nil, fmt.Errorf("server: token %q: %w", e.name, err)
		}
		if e.allow == 0 {
			e.allow = PermAll
		}
		if e.allow&^PermAll != 0 {
			return nil, fmt.Errorf("server: token %q: unknown permission bits %#x", e.name, uint8(e.allow&^PermAll))
		}
		if tok.Prefixes != nil && len(tok.Prefixes) == 0 {
			return nil, fmt.Errorf("server: token %q: an empty list of prefixes allows no lock; leave Prefixes nil for every lock name", e.name)
		}
		for _, p := range tok.Prefixes {
			if err := lock.ValidateNamePrefix(p); err != nil || p == "" {
				return nil, fmt.Errorf("server: token %q: prefix %q: want the start of a lock name, 1 to %d characters of A-Z a-z 0-9 . _ - :", e.name, p, lock.MaxNameLen)
			}
		}
		if j, dup := names[e.name]; dup {
			return nil, fmt.Errorf("server: %s and %s are both named %q", where(j), where(i), e.name)
		}
		names[e.name] = i
		e.digest = sha256.Sum256(tok.Secret)
		if j, dup := digests[e.digest]; dup {
			return nil, fmt.Errorf("server: %s (token %q) repeats the secret of %s (token %q)", where(i), e.name, where(j), t.entries[j].name)
		}
		digests[e.digest] = i
		t.entries = append(t.entries, e)
	}
	return t, nil
}

// Len is the number of tokens.
func (t *Tokens) Len() int { return len(t.entries) }

// LoadTokens reads a token file (see ParseTokens).
func LoadTokens(path string) (*Tokens, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("server: auth tokens: %w", err)
	}
	t, err := ParseTokens(data)
	if err != nil {
		return nil, fmt.Errorf("server: auth tokens: %s: %w", path, err)
	}
	return t, nil
}

// ParseTokens reads a token file: one token per line, which alone on its
// line has every permission on every lock. Attributes after the token,
// separated by white space, narrow it:
//
//	# the operators: everything
//	3f1c0b7e5a9d2c4e8f6a1b3d5c7e9f0a
//	# CI may take build: and deploy: locks and look at them
//	9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d  name=ci  prefixes=build:,deploy:  allow=acquire,inspect
//	# Prometheus
//	5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b  name=prometheus  allow=metrics
//
// name= names the token in logs and 403 answers (default "line N");
// prefixes= limits it to lock names starting with one of the
// comma-separated prefixes (default every name); allow= lists its
// permissions: acquire (with refresh and release), inspect, force-release,
// metrics (default all). Leading and trailing white space is ignored, and
// so are blank lines and lines whose first non-blank character is #. A
// token must have at least MinTokenLen bytes of printable ASCII. Errors
// name the line, never a token: of a field after it that is not an
// attribute, at most a misspelt attribute's name.
func ParseTokens(data []byte) (*Tokens, error) {
	var ts []Token
	var lines []int
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), len(data)+1)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		fields := strings.Fields(string(line))
		tok := Token{Secret: []byte(fields[0]), Name: fmt.Sprintf("line %d", n)}
		if err := checkToken(tok.Secret); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		seen := map[string]bool{}
		for _, attr := range fields[1:] {
			// Only a recognised key is ever quoted: any other field may be
			// a second token on this line, or a token with '=' in it
			// (base64).
			k, v, ok := strings.Cut(attr, "=")
			if !ok {
				return nil, fmt.Errorf("line %d: a second field without '=' after the token (its text not shown: it may be a secret); one token per line, followed only by the attributes name=, prefixes= and allow=", n)
			}
			if k != "name" && k != "prefixes" && k != "allow" {
				return nil, unknownAttribute(n, k)
			}
			if v == "" {
				return nil, fmt.Errorf("line %d: %s= without a value", n, k)
			}
			if seen[k] {
				return nil, fmt.Errorf("line %d: %s= appears twice", n, k)
			}
			seen[k] = true
			switch k {
			case "name":
				tok.Name = v
			case "prefixes":
				tok.Prefixes = strings.Split(v, ",")
				for _, p := range tok.Prefixes {
					if err := lock.ValidateNamePrefix(p); err != nil || p == "" {
						return nil, fmt.Errorf("line %d: prefixes=: %q: want the start of a lock name, 1 to %d characters of A-Z a-z 0-9 . _ - :", n, excerpt([]byte(p)), lock.MaxNameLen)
					}
				}
			case "allow":
				p, err := ParsePermissions(v)
				if err != nil {
					return nil, fmt.Errorf("line %d: allow=: %w", n, err)
				}
				tok.Allow = p
			}
		}
		ts = append(ts, tok)
		lines = append(lines, n)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(ts) == 0 {
		return nil, errors.New("has no token (one per line; # starts a comment)")
	}
	t, err := newTokens(ts, func(i int) string { return fmt.Sprintf("line %d", lines[i]) })
	if err != nil {
		return nil, fmt.Errorf("%s", strings.TrimPrefix(err.Error(), "server: "))
	}
	return t, nil
}

// unknownAttribute is the error of a field key=… after a token whose key
// is not an attribute. The key is quoted only if it looks like a
// misspelt attribute (a short lower-case word): a longer one may be a
// base64 token, cut at its padding.
func unknownAttribute(line int, key string) error {
	const want = "the attributes are name=, prefixes= and allow= (one token per line)"
	if len(key) > 0 && len(key) <= 12 && strings.Trim(key, "abcdefghijklmnopqrstuvwxyz_-") == "" {
		return fmt.Errorf("line %d: unknown attribute %q; %s", line, key, want)
	}
	return fmt.Errorf("line %d: a field with '=' after the token that is no attribute (its text not shown: it may be a secret); %s", line, want)
}

func checkToken(tok []byte) error {
	if bytes.HasPrefix(bytes.ToUpper(tok), []byte(placeholder)) {
		// deploy/kubernetes/secret.yaml's, applied unedited: a token
		// everyone who read the file knows.
		return fmt.Errorf("token %q is an example file's placeholder, not a secret; replace it with the output of: openssl rand -hex 32", excerpt(tok))
	}
	if len(tok) < MinTokenLen {
		return fmt.Errorf("token of %d bytes; want at least %d (e.g. openssl rand -hex 32)", len(tok), MinTokenLen)
	}
	for i, c := range tok {
		if c < 0x21 || c > 0x7e {
			return fmt.Errorf("token has a byte 0x%02x at %d; want printable ASCII without spaces", c, i)
		}
	}
	return nil
}

// placeholder starts the example tokens of the deploy files, which fenced
// refuses so that a file applied unedited does not start.
const placeholder = "REPLACE"

var errNoCredentials = errors.New("missing Authorization header; want Authorization: Bearer <token>")

// authenticate returns the entry of the token r carries. It compares the
// token's SHA-256 digest with every token's in constant time, so that
// neither a token's content nor its length nor its position in the set
// shows in the time taken.
func (t *Tokens) authenticate(r *http.Request) (*tokenEntry, error) {
	vs := r.Header.Values("Authorization")
	switch len(vs) {
	case 0:
		return nil, errNoCredentials
	case 1:
	default:
		return nil, errors.New("more than one Authorization header")
	}
	scheme, tok, ok := strings.Cut(vs[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return nil, errors.New("Authorization header: want the Bearer scheme")
	}
	d := sha256.Sum256([]byte(strings.TrimLeft(tok, " ")))
	found := -1
	for i := range t.entries {
		if subtle.ConstantTimeCompare(d[:], t.entries[i].digest[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return nil, errors.New("the bearer token is not one of the configured tokens")
	}
	return &t.entries[found], nil
}

// authorize says whether the token may do perm to the lock name ("" for an
// operation on no lock). The refusal says what the token may do instead.
func (e *tokenEntry) authorize(perm Permission, op, name string) *apiError {
	if e.allow&perm == 0 {
		return &apiError{status: http.StatusForbidden, code: codeForbidden,
			message: fmt.Sprintf("token %q may not %s: its permissions are %s", e.name, op, e.allow)}
	}
	if name == "" || e.prefixes == nil {
		return nil
	}
	for _, p := range e.prefixes {
		if strings.HasPrefix(name, p) {
			return nil
		}
	}
	return &apiError{status: http.StatusForbidden, code: codeForbidden, field: fieldName,
		message: fmt.Sprintf("token %q may not %s lock %q: its lock names must start with %s", e.name, op, name, quoteOr(e.prefixes))}
}

// authorizePrefix says whether the token may list the locks under prefix:
// a token limited to prefixes lists only under one of them, so a listing
// never shows a name the token could not inspect.
func (e *tokenEntry) authorizePrefix(op, prefix string) *apiError {
	if e.prefixes == nil {
		return nil
	}
	for _, p := range e.prefixes {
		if strings.HasPrefix(prefix, p) {
			return nil
		}
	}
	return &apiError{status: http.StatusForbidden, code: codeForbidden, field: fieldPrefix,
		message: fmt.Sprintf("token %q may not %s under prefix %q: its lock names must start with %s; list with prefix=%s", e.name, op, prefix, quoteOr(e.prefixes), e.prefixes[0])}
}

// quoteOr is "a", "a" or "b", "a", "b" or "c".
func quoteOr(ss []string) string {
	q := quoteAll(ss)
	if len(q) == 1 {
		return q[0]
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}
