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

// An election: the leader's term is its token. A second candidate waits;
// when the leader resigns it leads with a higher term, and an observer
// sees each leader.
func ExampleClient_Elect() {
	ctx := context.Background()
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
	store, _ := lock.NewEtcdStore(cli)
	defer store.Close()
	client, _ := lock.New(store)
	defer client.Close(ctx)

	octx, stop := context.WithCancel(ctx)
	defer stop()
	leaders, err := client.Observe(octx, "scheduler")
	if err != nil {
		panic(err)
	}
	fmt.Println("leading:", (<-leaders).Leading)

	lead, err := client.Elect(ctx, "scheduler", "host-a:8080", 10*time.Second) // blocks until leading
	if err != nil {
		panic(err)
	}
	l := <-leaders
	fmt.Println("leader:", l.Value, l.Token == lead.Token())

	next := make(chan *lock.Lease)
	go func() {
		l, _ := client.Elect(ctx, "scheduler", "host-b:8080", 10*time.Second)
		next <- l
	}()
	lead.Release(ctx) // resign
	second := <-next
	fmt.Println("next term is higher:", second.Token() > lead.Token())
	second.Release(ctx)
	// Output:
	// leading: false
	// leader: host-a:8080 true
	// next term is higher: true
}
