package dbconn

import "context"

// bmdb's own statements (package store's, which package txn and the rooms
// above it run) are kept prepared on every connection from their first
// use, whatever the pool's statement cache size (Settings.StmtCacheSize,
// which is the application's statements'): they are few, and every claim,
// end and heartbeat runs them. A statement's context says it is one of
// them (Own).

// ownKey marks a context whose statement is one of bmdb's own.
type ownKey struct{}

// Own returns ctx marked: the statement it bounds is one of bmdb's own.
func Own(ctx context.Context) context.Context { return context.WithValue(ctx, ownKey{}, true) }

// isOwn reports whether ctx is marked by Own.
func isOwn(ctx context.Context) bool { return ctx.Value(ownKey{}) != nil }

// ownStatements bounds the cache of bmdb's own statements on a connection:
// more than bmdb has.
const ownStatements = 128
