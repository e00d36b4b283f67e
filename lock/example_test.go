package lock_test

import (
	"context"
	"fmt"
	"time"

	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
)

// A holder's write is admitted by the resource; after its lease expires and
// another holder writes, its late write is rejected as stale.
func Example() {
	ctx := context.Background()
	etcd, err := sequencer.StartEmbedded(ctx, sequencer.EmbedConfig{}) // real etcd, temp dir
	if err != nil {
		panic(err)
	}
	defer etcd.Close()
	cli, err := etcd.Client()
	if err != nil {
		panic(err)
	}
	defer cli.Close()
	store, _ := lock.NewEtcdStore(cli)
	defer store.Close()
	client, _ := lock.New(store)
	defer client.Close(ctx)

	resource := fence.NewMemoryStore() // stands for the database

	first, _ := client.Acquire(ctx, "invoice-42", time.Second)
	fmt.Println("first writes:", resource.Admit(ctx, "invoice-42", first.Token()))

	<-first.Done() // first pauses past its lease...
	second, _ := client.Acquire(ctx, "invoice-42", time.Second)
	fmt.Println("second writes:", resource.Admit(ctx, "invoice-42", second.Token()))

	err = resource.Admit(ctx, "invoice-42", first.Token()) // ...and wakes up
	fmt.Println("first writes again, stale:", fence.IsStale(err))
	second.Release(ctx)
	// Output:
	// first writes: <nil>
	// second writes: <nil>
	// first writes again, stale: true
}
