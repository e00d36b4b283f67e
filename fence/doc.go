// Package fence is the protected resource's side of fencing: it decides
// whether a writer's token may still write.
//
// A fencing token ([Token]) is a number that grows with every lock grant.
// A resource that admits writes through a [Store] remembers, per resource,
// the highest token it has admitted and rejects every later write that
// carries a lower one. Tokens are admitted with >=: one holder may write many
// times with its token.
//
// Guard each resource with exactly one lock name. Grants of different lock
// names may share a token (fenced takes them in one etcd transaction), so a
// resource written under two lock names could admit two holders with the
// same token; under one name, tokens are unique and increasing. A rejected write returns an error that matches
// [ErrStale] and is a [*StaleError] carrying the resource, the token and the
// highest token seen; [IsStale] tests for it.
//
// The check must be part of the write it guards. [Store.Admit] alone is a
// check, not a guard: a write made after Admit returns can land after a
// newer holder's. [MemoryStore] is the in-process store, and its
// [MemoryStore.Do] admits and runs a write in one turn per resource;
// [Middleware] guards an HTTP handler and serialises the admit and the
// handler per resource so that a stale request cannot slip in between them.
// The Postgres adapter (adapters/postgres) admits inside the write's own
// database transaction. See docs/design.md, "Where the fence must be".
//
// On the client side, a token travels in a [context.Context] ([WithToken],
// [FromContext]) and in the Fencing-Token HTTP header ([SetHeader],
// [Transport]).
//
// This package depends on the standard library only.
package fence
