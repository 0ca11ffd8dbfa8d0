// Package fleet is the read model of a bmdb fleet: what an operator looks
// at, read from the database and from nothing else. Package web shows it
// as pages and JSON, bmdbctl as tables and JSON, from the same types and
// the same reads, so that both tell the same story and their JSON has the
// same field names.
//
// It reads bmdb's tables and views (package model's queries) and, where
// the application defines them, its own views of stages, tags and pending
// work (see ViewStages). It never writes: the fleet's writes are bmdb's
// (package bmdb), an operator's included.
//
//   - Machines (machines.go, machine.go): lists of machines with their
//     stage, claims and backoffs, paged by keyset; one machine with its
//     tags, claims, backoffs and history, and why each claim it lost was
//     abandoned (abandoned.go).
//   - The application's stages and tags (views.go).
//   - Processes (processes.go, health.go, controls.go): which processes
//     the database knows, each one's health (claims, waiting machines,
//     live sessions) and its fleet controls with their history.
//   - The overview (overview.go) and its plotted series (series.go), and
//     a session with its claims and history (session.go).
//
// Every function runs a few short queries with LIMITs, each under ctx
// (cancelling ctx cancels the query in flight and returns its error), on
// the *sql.DB it is given, which it does not close; lists page by keyset,
// never by OFFSET. Times come from the database's clock. The functions are
// safe for concurrent use. Errors about what the caller asked for are
// *Error (an argument refused, ErrInvalidArgument; something that does not
// exist, ErrNotFound) or *UnknownProcessError; others are the database's,
// wrapped.
package fleet
