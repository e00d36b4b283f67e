// Package redact hides the password a URL or address may carry, so that an
// error about it can quote it: what the user typed, less the secret.
package redact

import "strings"

// URL is raw with the password of its user information, if it has one,
// replaced by "xxxxx", as url.URL.Redacted does; unlike that, it also hides
// one in a string url.Parse refuses (a bad port, no scheme), since those
// are the strings errors quote. raw without user information comes back
// as it is.
func URL(raw string) string {
	rest := raw
	prefix := ""
	if i := strings.Index(raw, "://"); i >= 0 {
		prefix, rest = raw[:i+3], raw[i+3:]
	}
	// The user information ends at the last @ before the path.
	authority := rest
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority = rest[:i]
	}
	at := strings.LastIndex(authority, "@")
	if at < 0 {
		return raw
	}
	user, _, hasPassword := strings.Cut(authority[:at], ":")
	if !hasPassword {
		return raw
	}
	return prefix + user + ":xxxxx" + rest[at:]
}
