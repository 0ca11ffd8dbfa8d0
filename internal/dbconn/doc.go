// Package dbconn is bmdb's driver wrapper: lib/pq connections whose every
// call is bounded by its context (netconn.go), with server-side timeouts
// and, on CockroachDB, pinned settings applied on connect; a per-connection
// statement cache (stmtcache.go); and socket options (sockopt_*.go). A
// test may wrap lib/pq's connector under it (NewConnector). Package bmdb
// opens its pools through it; nothing here knows about sessions or claims.
package dbconn
