package lock

import (
	"fmt"
	"time"
)

const (
	// MaxNameLen is the longest lock name.
	MaxNameLen = 200
	// MinTTL and MaxTTL bound a lease's TTL. Below 10ms the drift allowance
	// leaves no validity; a day is longer than any holder should go without
	// a refresh.
	MinTTL = 10 * time.Millisecond
	MaxTTL = 24 * time.Hour
)

// ValidateName checks a lock name: 1 to 200 characters of A-Z a-z 0-9 and
// . _ - :, and not "." or "..". Anything else could collide with key
// syntax (Redis hash tags, etcd prefixes) and is rejected before any key is
// touched; "." and ".." are URL path segments that HTTP clients and proxies
// rewrite (fetch sends /v1/locks/../acquire as /v1/acquire), so no client
// could reach such a lock through the API.
func ValidateName(name string) error {
	if err := validateChars(name); err != nil {
		return err
	}
	if name == "." || name == ".." {
		return fmt.Errorf("%w: %q alone is a URL path segment that HTTP clients and proxies rewrite; use another name", ErrInvalidName, name)
	}
	return nil
}

// validateChars checks a name's length and characters.
func validateChars(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty; want 1 to %d characters of A-Z a-z 0-9 . _ - :", ErrInvalidName, MaxNameLen)
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("%w: %d characters; want at most %d", ErrInvalidName, len(name), MaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-' || c == ':') {
			bad := fmt.Sprintf("%q", c)
			if c >= 0x80 {
				bad = fmt.Sprintf("byte 0x%02x (not ASCII)", c) // %q of one byte of UTF-8 shows another character
			}
			return fmt.Errorf("%w: %q has %s at byte %d; allowed are A-Z a-z 0-9 . _ - :", ErrInvalidName, name, bad, i)
		}
	}
	return nil
}

// ValidateNamePrefix checks a prefix of lock names, as List takes: "" or
// up to MaxNameLen characters of A-Z a-z 0-9 . _ - : (a prefix may be
// "." or "..": names that start so are fine).
func ValidateNamePrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	if err := validateChars(prefix); err != nil {
		return fmt.Errorf("prefix: %w", err)
	}
	return nil
}

// ValidateTTL checks a TTL: MinTTL to MaxTTL in whole milliseconds, the
// unit of Redis's PEXPIRE and of the HTTP API, so that the TTL a Lease
// reports is the one the store keeps (before, the Redis store cut 10.0009s
// to 10s and the Lease said 10.0009s: docs/design.md, defect 199).
func ValidateTTL(ttl time.Duration) error {
	if ttl < MinTTL || ttl > MaxTTL || ttl%time.Millisecond != 0 {
		return fmt.Errorf("%w: %s; want %s to %s in whole milliseconds", ErrInvalidTTL, ttl, MinTTL, MaxTTL)
	}
	return nil
}

// Drift is the clock-drift allowance of docs/design.md (step 5), 1% of the TTL plus 2ms:
// a lease is valid for its TTL from the start of the acquisition, less this.
func Drift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }
