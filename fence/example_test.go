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

// ExampleMemoryStore_Do: the admit and the write are one step, so the paused
// holder's write cannot land after the later holder's.
func ExampleMemoryStore_Do() {
	ctx := context.Background()
	store := fence.NewMemoryStore()
	var invoice []string // stands for the resource
	write := func(s string) func(context.Context) error {
		return func(ctx context.Context) error {
			tok, _ := fence.FromContext(ctx)
			invoice = append(invoice, fmt.Sprint(s, " by ", tok))
			return nil
		}
	}

	fmt.Println(store.Do(ctx, "invoice-42", 7, write("draft")))
	fmt.Println(store.Do(ctx, "invoice-42", 9, write("sent")))
	fmt.Println(store.Do(ctx, "invoice-42", 7, write("draft again"))) // the paused first holder
	fmt.Println(invoice)
	// Output:
	// <nil>
	// <nil>
	// fence: stale token 7 for "invoice-42": highest admitted is 9
	// [draft by 7 sent by 9]
}

func ExampleParseToken() {
	t, err := fence.ParseToken("1234")
	fmt.Println(t, err)
	_, err = fence.ParseToken("0")
	fmt.Println(err)
	_, err = fence.ParseToken("-1")
	fmt.Println(err)
	// Output:
	// 1234 <nil>
	// fence: invalid token: 0 means no token; want 1 to 9223372036854775807
	// fence: invalid token: "-1" is not a decimal number; want digits only, 1 to 9223372036854775807
}
