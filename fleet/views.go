package fleet

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/lib/pq"
)

// The read model shows an application's stages when the application
// defines them, in its own migrations, as views under these names (the example pipeline's
// are in cmd/worker-example/pipeline/migrations):
//
//	app_stages (stage TEXT, position INT8, description TEXT)
//	    the stages, in order of position
//	app_machine_stages (machine_id UUID, stage TEXT)
//	    each machine's stage
//	app_machine_tags (machine_id UUID, tag TEXT, value TEXT, at TIMESTAMPTZ)
//	    optional: what the application knows of a machine, for its page
//	app_pending_work (process TEXT, machine_id UUID)
//	    optional: the machines that need a process now, claimed or not, in
//	    backoff or not (what its retrieval would find, before bmdb excludes
//	    claims and backoffs); the overview counts those nobody works on
//	    among the machines waiting for the process
//
// Without them it shows what bmdb knows of every application: claims,
// backoffs, history and sessions.
const (
	ViewStages        = "app_stages"
	ViewMachineStages = "app_machine_stages"
	ViewMachineTags   = "app_machine_tags"
	ViewPendingWork   = "app_pending_work"
)

// Queries of the application's views: constant text, parameters as values.
const (
	appViewsSQL = `SELECT table_name FROM information_schema.tables
WHERE table_schema = current_schema() AND table_name IN ('app_stages', 'app_machine_stages', 'app_machine_tags', 'app_pending_work')`
	// readyWorkSQL counts per process the machines of app_pending_work with
	// neither a claim nor a backoff row of that process: those wait for a
	// worker and are counted nowhere else.
	readyWorkSQL = `SELECT a.process, count(DISTINCT a.machine_id) FROM app_pending_work a
WHERE NOT EXISTS (SELECT 1 FROM work w WHERE w.machine_id = a.machine_id AND w.process = a.process)
  AND NOT EXISTS (SELECT 1 FROM work_backoff b WHERE b.machine_id = a.machine_id AND b.process = a.process)
GROUP BY a.process ORDER BY a.process`
	stageCountsSQL = `SELECT s.stage, s.position, s.description, count(ms.machine_id)
FROM app_stages s LEFT JOIN app_machine_stages ms ON ms.stage = s.stage
GROUP BY s.stage, s.position, s.description
ORDER BY s.position, s.stage`
	machineStagesSQL = `SELECT machine_id, stage FROM app_machine_stages WHERE machine_id = ANY ($1::UUID[])`
	machineTagsSQL   = `SELECT tag, value, at FROM app_machine_tags WHERE machine_id = $1 ORDER BY at, tag`
)

// Stage is one of the application's stages, with its number of machines.
type Stage struct {
	Name        string `json:"name"`
	Position    int64  `json:"position"`
	Description string `json:"description"`
	Machines    int64  `json:"machines"`
}

// AppViews says which of the application's views a database has.
type AppViews struct {
	Stages  bool // app_stages and app_machine_stages
	Tags    bool // app_machine_tags
	Pending bool // app_pending_work
}

// ReadAppViews reports which of the application's views db has.
func ReadAppViews(ctx context.Context, db *sql.DB) (AppViews, error) {
	rows, err := db.QueryContext(ctx, appViewsSQL)
	if err != nil {
		return AppViews{}, fmt.Errorf("fleet: looking for the application's views: %w", err)
	}
	defer rows.Close()
	have := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return AppViews{}, err
		}
		have[name] = true
	}
	if err := rows.Err(); err != nil {
		return AppViews{}, err
	}
	return AppViews{Stages: have[ViewStages] && have[ViewMachineStages], Tags: have[ViewMachineTags], Pending: have[ViewPendingWork]}, nil
}

// ReadStages returns the application's stages in order, with their machine
// counts; nil if it defines none.
func ReadStages(ctx context.Context, db *sql.DB) ([]Stage, error) {
	views, err := ReadAppViews(ctx, db)
	if err != nil || !views.Stages {
		return nil, err
	}
	return readStageCounts(ctx, db)
}

// readStageCounts returns the application's stages in order, with their
// machine counts.
func readStageCounts(ctx context.Context, db *sql.DB) ([]Stage, error) {
	rows, err := db.QueryContext(ctx, stageCountsSQL)
	if err != nil {
		return nil, fmt.Errorf("fleet: reading %s: %w", ViewStages, err)
	}
	defer rows.Close()
	stages := []Stage{}
	for rows.Next() {
		var s Stage
		var desc sql.NullString
		if err := rows.Scan(&s.Name, &s.Position, &desc, &s.Machines); err != nil {
			return nil, fmt.Errorf("fleet: reading %s: %w", ViewStages, err)
		}
		s.Description = desc.String
		stages = append(stages, s)
	}
	return stages, rows.Err()
}

// ReadMachineStages returns the stage of each of ids that has one.
func ReadMachineStages(ctx context.Context, db *sql.DB, ids []uuid.UUID) (map[uuid.UUID]string, error) {
	rows, err := db.QueryContext(ctx, machineStagesSQL, pq.Array(uuidStrings(ids)))
	if err != nil {
		return nil, fmt.Errorf("fleet: reading %s: %w", ViewMachineStages, err)
	}
	defer rows.Close()
	out := make(map[uuid.UUID]string, len(ids))
	for rows.Next() {
		var id uuid.UUID
		var stage string
		if err := rows.Scan(&id, &stage); err != nil {
			return nil, err
		}
		out[id] = stage
	}
	return out, rows.Err()
}

// Tag is one of a machine's tags (app_machine_tags).
type Tag struct {
	Name  string    `json:"name"`
	Value string    `json:"value"`
	At    time.Time `json:"at"`
}

// readTags returns a machine's tags.
func readTags(ctx context.Context, db *sql.DB, id uuid.UUID) ([]Tag, error) {
	rows, err := db.QueryContext(ctx, machineTagsSQL, id)
	if err != nil {
		return nil, fmt.Errorf("fleet: reading %s: %w", ViewMachineTags, err)
	}
	defer rows.Close()
	tags := []Tag{}
	for rows.Next() {
		var t Tag
		var value sql.NullString
		if err := rows.Scan(&t.Name, &value, &t.At); err != nil {
			return nil, err
		}
		t.Value = value.String
		tags = append(tags, t)
	}
	return tags, rows.Err()
}

func uuidStrings(ids []uuid.UUID) []string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = id.String()
	}
	return s
}

// readReadyWork returns per process the number of machines that need it
// (app_pending_work) and that nobody works on: no claim, no backoff.
func readReadyWork(ctx context.Context, db *sql.DB) (map[string]int64, error) {
	rows, err := db.QueryContext(ctx, readyWorkSQL)
	if err != nil {
		return nil, fmt.Errorf("fleet: reading %s: %w", ViewPendingWork, err)
	}
	defer rows.Close()
	ready := map[string]int64{}
	for rows.Next() {
		var process string
		var n int64
		if err := rows.Scan(&process, &n); err != nil {
			return nil, err
		}
		ready[process] = n
	}
	return ready, rows.Err()
}
