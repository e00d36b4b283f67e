package fence

import (
	"context"
	"sync"
)

// keyedMutex is a mutex per key; entries live only while someone holds or
// waits for them. A waiter leaves when its context ends. The zero value is
// ready to use, so that a MemoryStore's zero value stays ready too.
type keyedMutex struct {
	mu sync.Mutex
	m  map[string]*keyedEntry
}

type keyedEntry struct {
	held chan struct{} // holds a value while the key is locked
	refs int
}

func (k *keyedMutex) lock(ctx context.Context, key string) (unlock func(), err error) {
	k.mu.Lock()
	if k.m == nil {
		k.m = make(map[string]*keyedEntry)
	}
	e := k.m[key]
	if e == nil {
		e = &keyedEntry{held: make(chan struct{}, 1)}
		k.m[key] = e
	}
	e.refs++
	k.mu.Unlock()
	release := func() {
		k.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
	select {
	case e.held <- struct{}{}:
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
	return func() {
		<-e.held
		release()
	}, nil
}
