package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"time"

	"github.com/fenced/fenced/client"
	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
	"github.com/fenced/fenced/server"
)

// A holder acquires a lease from a fenced server and writes with its token;
// a second holder is refused while the first holds it, and after the first
// releases, the second's token is larger.
func Example() {
	ctx := context.Background()
	// A fenced server in this process, as `fenced dev` runs it: embedded
	// etcd, leases in etcd.
	etcd, err := sequencer.StartEmbedded(ctx, sequencer.EmbedConfig{})
	if err != nil {
		panic(err)
	}
	defer etcd.Close()
	cli, err := etcd.Client()
	if err != nil {
		panic(err)
	}
	defer cli.Close()
	store, err := lock.NewEtcdStore(cli)
	if err != nil {
		panic(err)
	}
	defer store.Close()
	locks, err := lock.New(store)
	if err != nil {
		panic(err)
	}
	defer locks.Close(ctx)
	srv, err := server.New(server.Config{Locks: locks})
	if err != nil {
		panic(err)
	}
	hs := httptest.NewServer(srv)
	defer hs.Close()

	c, err := client.New(hs.URL) // e.g. http://127.0.0.1:7070
	if err != nil {
		panic(err)
	}
	defer c.Close(ctx)
	resource := fence.NewMemoryStore() // stands for the database

	first, err := c.Acquire(ctx, "invoice-42", 5*time.Second, lock.WithKeepAlive())
	if err != nil {
		panic(err)
	}
	fmt.Println("first writes:", resource.Admit(ctx, "invoice-42", first.Token()))

	_, err = c.TryAcquire(ctx, "invoice-42", 5*time.Second)
	fmt.Println("second while held:", errors.Is(err, lock.ErrNotAcquired))

	first.Release(ctx)
	second, err := c.Acquire(ctx, "invoice-42", 5*time.Second, lock.WithWait(10*time.Second))
	if err != nil {
		panic(err)
	}
	defer second.Release(ctx)
	fmt.Println("second writes:", resource.Admit(ctx, "invoice-42", second.Token()))
	fmt.Println("first again, stale:", fence.IsStale(resource.Admit(ctx, "invoice-42", first.Token())))
	// Output:
	// first writes: <nil>
	// second while held: true
	// second writes: <nil>
	// first again, stale: true
}
