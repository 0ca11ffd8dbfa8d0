// Package pipeline is the example application built on bmdb, laid out as a
// team's own repository would lay it out: a bare-metal provisioning
// pipeline, provide -> start agent -> install OS, whose state is three tag
// tables of its own.
//
//	migrations/   its schema (golang-migrate), applied by bmdb.Open after
//	              bmdb's own, recorded in pipeline_schema_migrations
//	queries/      its sqlc queries: each stage's retrieval and tag insert
//	sqlc.yaml     generates pipelinedb/ from bmdb's schema plus its own
//	pipelinedb/   the generated package (never edited; make generate)
//	pipeline.go   the stages: process names, retrievals, commits
//
// Its migrations also define the views bmdb's web pages and bmdbctl read
// (app_stages, app_machine_stages, app_machine_tags, app_pending_work).
package pipeline

import (
	"context"

	"github.com/google/uuid"

	"github.com/bmdb-dev/bmdb/bmdb"
	"github.com/bmdb-dev/bmdb/cmd/worker-example/pipeline/pipelinedb"
	"github.com/bmdb-dev/bmdb/migrations"
	"github.com/bmdb-dev/bmdb/worker"
)

// Name is the application's name in bmdb.Config.Application.
const Name = "pipeline"

// Application returns the pipeline's schema, for bmdb.Config.Application.
func Application() *migrations.Application {
	app, err := migrations.NewApplication(Name, migrationFiles, "migrations")
	if err != nil {
		panic(err) // the embedded directory is there: a build error otherwise
	}
	return app
}

// Stage is one component of the pipeline: a bmdb process, how it finds
// machines that need it, and the tag its success commits.
type Stage struct {
	Process   string // the bmdb process name
	Component string // the component (session) name
	// Retrieve proposes machines that need the stage.
	Retrieve worker.Retrieve
	// Commit records in tx that the stage is done for machine.
	Commit func(ctx context.Context, tx *bmdb.Tx, machine uuid.UUID) error
}

// Stages are the pipeline's stages, in order.
var Stages = []Stage{
	{
		Process: "provide", Component: "provisioner",
		Retrieve: func(ctx context.Context, tx *bmdb.Tx, limit int32) ([]uuid.UUID, error) {
			return pipelinedb.New(tx.DBTX()).MachinesNeedingProvide(ctx, limit)
		},
		Commit: func(ctx context.Context, tx *bmdb.Tx, m uuid.UUID) error {
			return pipelinedb.New(tx.DBTX()).MachineProvidedInsert(ctx, pipelinedb.MachineProvidedInsertParams{MachineID: m, Provider: "example-dc"})
		},
	},
	{
		Process: "start-agent", Component: "agent-starter",
		Retrieve: func(ctx context.Context, tx *bmdb.Tx, limit int32) ([]uuid.UUID, error) {
			return pipelinedb.New(tx.DBTX()).MachinesNeedingAgentStart(ctx, limit)
		},
		Commit: func(ctx context.Context, tx *bmdb.Tx, m uuid.UUID) error {
			return pipelinedb.New(tx.DBTX()).MachineAgentStartedInsert(ctx, pipelinedb.MachineAgentStartedInsertParams{MachineID: m, AgentVersion: "v1.0.0"})
		},
	},
	{
		Process: "install-os", Component: "os-installer",
		Retrieve: func(ctx context.Context, tx *bmdb.Tx, limit int32) ([]uuid.UUID, error) {
			return pipelinedb.New(tx.DBTX()).MachinesNeedingOSInstall(ctx, limit)
		},
		Commit: func(ctx context.Context, tx *bmdb.Tx, m uuid.UUID) error {
			return pipelinedb.New(tx.DBTX()).MachineOSInstalledInsert(ctx, pipelinedb.MachineOSInstalledInsertParams{MachineID: m, OsImage: "debian-12"})
		},
	},
}

// Progress returns the pipeline's progress read from db: machines per
// stage done (totals so far) and claims and backoffs (now).
func Progress(ctx context.Context, db pipelinedb.DBTX) (pipelinedb.MachineStageCountsRow, error) {
	return pipelinedb.New(db).MachineStageCounts(ctx)
}
