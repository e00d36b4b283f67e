package server

import (
	"strings"
	"testing"
)

// TestTokenFileErrorsHideSecrets: a token file with two tokens on one line
// (or a field that is no attribute) is refused with an error that names
// the line and says what is allowed, but never quotes the field: it may be
// a secret. It used to quote the second token whole, at start and in the
// log of a SIGHUP reload.
func TestTokenFileErrorsHideSecrets(t *testing.T) {
	for _, c := range []struct {
		content, secret string
		want            []string
	}{
		// The review's file, as printf wrote it: two lines.
		{"admin-token-0123456789abcdef\nci-token-0123456789abcdef TOPSECRET-second-token-9f8e7d6c5b4a\n",
			"TOPSECRET", []string{"line 2: ", "one token per line", "name=, prefixes= and allow="}},
		// With a comment first, the line is the third.
		{"# ops\nadmin-token-0123456789abcdef\nci-token-0123456789abcdef TOPSECRET-second-token-9f8e7d6c5b4a\n",
			"TOPSECRET", []string{"line 3: ", "one token per line", "name=, prefixes= and allow="}},
		// A base64 token has '=' in it: not an attribute's either.
		{"admin-token-0123456789abcdef VE9QU0VDUkVULXNlY29uZC10b2tlbg==\n",
			"VE9QU0VDUkVU", []string{"line 1: ", "name=, prefixes= and allow="}},
		// A misspelt attribute: its key, never its value.
		{"admin-token-0123456789abcdef prefix=TOPSECRETvalue\n",
			"TOPSECRET", []string{`line 1: unknown attribute "prefix"`, "name=, prefixes= and allow="}},
	} {
		_, err := ParseTokens([]byte(c.content))
		if err == nil {
			t.Errorf("%q: accepted", c.content)
			continue
		}
		if strings.Contains(err.Error(), c.secret) || strings.Contains(err.Error(), "0123456789") {
			t.Errorf("%q: the error shows a secret: %v", c.content, err)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: %v; want it to say %q", c.content, err, w)
			}
		}
	}
}
