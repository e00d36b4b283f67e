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
)

// MinTokenLen is the shortest bearer token LoadTokens and New accept.
const MinTokenLen = 16

// LoadTokens reads bearer tokens from a file: one token per line; leading
// and trailing white space is ignored, and so are blank lines and lines
// whose first non-blank character is #. It is an error if the file has no
// token, or a token is shorter than MinTokenLen bytes or has a character
// outside printable ASCII (0x21 to 0x7e). Errors name the line, never the
// token.
func LoadTokens(path string) ([][]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("server: auth tokens: %w", err)
	}
	var tokens [][]byte
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), len(data)+1)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		if err := checkToken(line); err != nil {
			return nil, fmt.Errorf("server: auth tokens: %s line %d: %w", path, n, err)
		}
		tokens = append(tokens, bytes.Clone(line))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("server: auth tokens: %s: %w", path, err)
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("server: auth tokens: %s has no token (one per line; # starts a comment)", path)
	}
	return tokens, nil
}

func checkToken(tok []byte) error {
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

// authenticator checks bearer tokens. It keeps their SHA-256 digests and
// compares digests with subtle.ConstantTimeCompare against every token, so
// that neither a token's content nor its length nor its position in the
// list shows in the time taken.
type authenticator struct {
	digests [][sha256.Size]byte
}

func newAuthenticator(tokens [][]byte) (*authenticator, error) {
	if len(tokens) == 0 {
		return nil, nil
	}
	a := &authenticator{}
	for i, t := range tokens {
		if err := checkToken(t); err != nil {
			return nil, fmt.Errorf("server: Config.AuthTokens[%d]: %w", i, err)
		}
		a.digests = append(a.digests, sha256.Sum256(t))
	}
	return a, nil
}

var errNoCredentials = errors.New("missing Authorization header; want Authorization: Bearer <token>")

// check returns nil if r carries one of the tokens.
func (a *authenticator) check(r *http.Request) error {
	vs := r.Header.Values("Authorization")
	switch len(vs) {
	case 0:
		return errNoCredentials
	case 1:
	default:
		return errors.New("more than one Authorization header")
	}
	scheme, tok, ok := strings.Cut(vs[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return errors.New("Authorization header: want the Bearer scheme")
	}
	d := sha256.Sum256([]byte(strings.TrimLeft(tok, " ")))
	match := 0
	for i := range a.digests {
		match |= subtle.ConstantTimeCompare(d[:], a.digests[i][:])
	}
	if match != 1 {
		return errors.New("the bearer token is not one of the configured tokens")
	}
	return nil
}
