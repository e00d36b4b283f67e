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
// . _ - :. Anything else could collide with key syntax (Redis hash tags,
// etcd prefixes) and is rejected before any key is touched.
func ValidateName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty; want 1 to %d characters of A-Z a-z 0-9 . _ - :", ErrInvalidName, MaxNameLen)
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("%w: %d characters; want at most %d", ErrInvalidName, len(name), MaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-' || c == ':') {
			return fmt.Errorf("%w: %q has %q at byte %d; allowed are A-Z a-z 0-9 . _ - :", ErrInvalidName, name, c, i)
		}
	}
	return nil
}

// ValidateNamePrefix checks a prefix of lock names, as List takes: "" or
// up to MaxNameLen characters of A-Z a-z 0-9 . _ - :.
func ValidateNamePrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	if err := ValidateName(prefix); err != nil {
		return fmt.Errorf("prefix: %w", err)
	}
	return nil
}

// ValidateTTL checks a TTL against MinTTL and MaxTTL.
func ValidateTTL(ttl time.Duration) error {
	if ttl < MinTTL || ttl > MaxTTL {
		return fmt.Errorf("%w: %s; want %s to %s", ErrInvalidTTL, ttl, MinTTL, MaxTTL)
	}
	return nil
}

// Drift is the clock-drift allowance of docs/design.md (step 5), 1% of the TTL plus 2ms:
// a lease is valid for its TTL from the start of the acquisition, less this.
func Drift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }
