// Package migrations holds bmdb's SQL schema as golang-migrate files,
// embedded into every binary that links bmdb.
//
// Files are named NNNNNN_name.up.sql / NNNNNN_name.down.sql with fixed-width
// versions. Each up file states in its header which older binaries still work
// against the schema it creates. The same files are sqlc's schema.
package migrations

import "embed"

// FS contains every migration file at its root.
//
//go:embed *.sql
var FS embed.FS
