package main

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"
)

// The Redis-only lock is the "correct" single-node lock of the Redis
// documentation, written here so that the comparison is with the real
// thing: SET key <random value> NX PX <ttl> to acquire, a Lua
// compare-and-delete to release. It excludes holders while no holder pauses
// past its TTL. It has no fencing token, so the database cannot tell a late
// holder from a current one.

//go:embed release.lua
var releaseLua string

var releaseScript = redis.NewScript(releaseLua)

// redisLock is a lock on one Redis key.
type redisLock struct {
	rdb *redis.Client
	key string
}

// redisHold is one holding of a redisLock.
type redisHold struct {
	value    string    // 128 random bits, known only to the holder
	acquired time.Time // when SET NX returned OK
	deadline time.Time // start of the acquisition + TTL - drift
}

// acquire takes the lock, waiting while it is held. A waiter retries with
// exponential backoff from 2ms to 64ms with jitter, never past the moment
// the holder's lease expires, like a client of redislock or redsync: plain
// Redis has no release notification.
func (l *redisLock) acquire(ctx context.Context, ttl time.Duration) (redisHold, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return redisHold{}, err
	}
	h := redisHold{value: hex.EncodeToString(b[:])}
	backoff := 2 * time.Millisecond
	for {
		start := time.Now()
		err := l.rdb.Do(ctx, "SET", l.key, h.value, "NX", "PX", ttl.Milliseconds()).Err()
		if err == nil {
			h.acquired, h.deadline = time.Now(), start.Add(ttl-drift(ttl))
			return h, nil
		}
		if !errors.Is(err, redis.Nil) {
			return redisHold{}, fmt.Errorf("redis-only lock %s: %w", l.key, err)
		}
		wait := backoff - time.Duration(mrand.Int64N(int64(backoff)/4+1))
		if left, err := l.rdb.PTTL(ctx, l.key).Result(); err == nil && left > 0 && left < wait {
			wait = left
		}
		backoff = min(2*backoff, 64*time.Millisecond)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return redisHold{}, fmt.Errorf("redis-only lock %s: %w", l.key, ctx.Err())
		case <-t.C:
		}
	}
}

// release deletes the lock if h still holds it. held is false when the lock
// had expired (and maybe been taken by another holder) before the release.
func (l *redisLock) release(ctx context.Context, h redisHold) (held bool, err error) {
	n, err := releaseScript.Run(ctx, l.rdb, []string{l.key}, h.value).Int64()
	if err != nil {
		return false, fmt.Errorf("redis-only lock %s: release: %w", l.key, err)
	}
	return n == 1, nil
}

// holder returns the value that holds the lock now, "" if none.
func (l *redisLock) holder(ctx context.Context) (string, error) {
	v, err := l.rdb.Get(ctx, l.key).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return v, err
}
