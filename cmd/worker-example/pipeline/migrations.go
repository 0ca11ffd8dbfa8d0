package pipeline

import "embed"

// migrationFiles holds the pipeline's migrations (golang-migrate files),
// applied by bmdb.Open after bmdb's own: see Application.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS
