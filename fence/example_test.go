package fence_test

import (
	"context"
	"fmt"

	"github.com/fenced/fenced/fence"
)

func ExampleMemoryStore() {
	ctx := context.Background()
	store := fence.NewMemoryStore()

	fmt.Println(store.Admit(ctx, "invoice-42", 7)) // the holder with token 7 writes
	fmt.Println(store.Admit(ctx, "invoice-42", 9)) // a later holder writes
	err := store.Admit(ctx, "invoice-42", 7)       // the paused first holder wakes up
	fmt.Println(fence.IsStale(err))
	fmt.Println(err)
	// Output:
	// <nil>
	// <nil>
	// true
	// fence: stale token 7 for "invoice-42": highest admitted is 9
}

func ExampleParseToken() {
	t, err := fence.ParseToken("1234")
	fmt.Println(t, err)
	_, err = fence.ParseToken("0")
	fmt.Println(err)
	// Output:
	// 1234 <nil>
	// fence: invalid token: 0 means no token
}
