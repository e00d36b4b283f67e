// Command quickstart is the Go SDK's first program: it takes a lock, writes
// with its fencing token to a resource that fences, and shows the late
// write of a holder whose lease was lost rejected. Run it against fenced
// dev with the line fenced dev prints:
//
//	go run ./examples/quickstart --etcd http://127.0.0.1:PORT                         # leases in etcd
//	go run ./examples/quickstart --etcd http://127.0.0.1:PORT --redis 127.0.0.1:6379  # leases in Redis
//	go run ./examples/quickstart --url http://127.0.0.1:7070                          # through the fenced server
//
// With --etcd it uses package lock in this process; with --url, package
// client through fenced's HTTP API. Both are a lock.Locker, and the code
// that takes the lock is the same.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/fenced/fenced/client"
	"github.com/fenced/fenced/fence"
	"github.com/fenced/fenced/lock"
	"github.com/fenced/fenced/sequencer"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("quickstart", flag.ContinueOnError)
	fs.SetOutput(stderr)
	etcdURL := fs.String("etcd", "", "etcd `URL` (what fenced dev prints): use package lock in this process")
	etcdPrefix := fs.String("etcd-prefix", sequencer.DefaultPrefix, "etcd key `prefix`, as fenced's --etcd-prefix")
	redisAddr := fs.String("redis", "", "Redis `host:port` for the leases (fenced dev --redis-addr); empty: leases in etcd")
	redisPrefix := fs.String("redis-prefix", "fenced:", "Redis key `prefix`, as fenced's --redis-prefix")
	url := fs.String("url", "", "fenced server `URL`s, comma-separated: use package client through the HTTP API")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case (*etcdURL == "") == (*url == ""):
		return errors.New("give --etcd (the Go SDK in this process) or --url (through a fenced server): run fenced dev, it prints the line to use")
	case *url != "":
		c, err := client.New(*url)
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		return writeUnderLock(ctx, c, stdout)
	}
	return withSDK(ctx, *etcdURL, *etcdPrefix, *redisAddr, *redisPrefix, stdout)
}

// withSDK connects to etcd (tokens, and leases unless redisAddr is given)
// and Redis (leases), and writes under a lock taken with package lock.
func withSDK(ctx context.Context, etcdURL, etcdPrefix, redisAddr, redisPrefix string, out io.Writer) error {
	etcd, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer etcd.Close()
	var store lock.LeaseStore
	if redisAddr == "" {
		// Leases in etcd too: nothing else to run.
		es, err := lock.NewEtcdStore(etcd, lock.WithEtcdPrefix(etcdPrefix))
		if err != nil {
			return err
		}
		defer es.Close() // its session, watch and timers
		store = es
	} else {
		seq, err := sequencer.NewEtcd(etcd, sequencer.WithPrefix(etcdPrefix)) // tokens: etcd revisions
		if err != nil {
			return err
		}
		defer seq.Close()
		rdb := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
		defer rdb.Close()
		rs, err := lock.NewRedisStore(rdb, seq, lock.WithRedisPrefix(redisPrefix)) // leases: Redis single, Sentinel or Cluster
		if err != nil {
			return err
		}
		defer rs.Close()
		store = rs
	}
	locks, err := lock.New(store)
	if err != nil {
		return err
	}
	defer locks.Close(ctx) // releases what is still held
	return writeUnderLock(ctx, locks, out)
}

// writeUnderLock is the same for a *lock.Client and a *client.Client: two
// holders in turn take the lock and write with their tokens; then the
// first, paused past its lease (GC, swap, SIGSTOP), writes late and is
// rejected by the resource.
func writeUnderLock(ctx context.Context, locks lock.Locker, out io.Writer) error {
	db := fence.NewMemoryStore() // stands for your database: it admits a token >= the highest it has seen

	first, err := locks.Acquire(ctx, "invoice-7", 10*time.Second, lock.WithKeepAlive())
	if err != nil {
		return err
	}
	if err := db.Admit(first.Context(), "invoice-7", first.Token()); err != nil { // send the token with every write
		return err
	}
	fmt.Fprintf(out, "holder 1 has %q with token %d; its write is admitted\n", first.Name(), first.Token())
	if err := first.Release(ctx); err != nil { // lock.ErrLost: a write may have overlapped another holder's
		return err
	}

	second, err := locks.Acquire(ctx, "invoice-7", 10*time.Second, lock.WithKeepAlive())
	if err != nil {
		return err
	}
	if err := db.Admit(second.Context(), "invoice-7", second.Token()); err != nil {
		return err
	}
	fmt.Fprintf(out, "holder 2 has %q with token %d; its write is admitted\n", second.Name(), second.Token())

	err = db.Admit(ctx, "invoice-7", first.Token()) // holder 1 wakes up and writes
	if !fence.IsStale(err) {
		return fmt.Errorf("a late write was not rejected: %v", err)
	}
	fmt.Fprintf(out, "holder 1 writes late with token %d: rejected: %v\n", first.Token(), err)
	return second.Release(ctx)
}
