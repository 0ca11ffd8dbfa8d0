-- name: MachineAgentStartedInsert :exec
-- MachineAgentStartedInsert tags a machine's agent as started (the
-- example's second stage).
INSERT INTO machine_agent_started (machine_id, agent_version) VALUES (sqlc.arg(machine_id), sqlc.arg(agent_version));

-- name: MachinesNeedingAgentStart :many
-- MachinesNeedingAgentStart returns up to row_limit provided machines,
-- earliest provided first, whose agent is not started, that have no live
-- claim of "start-agent" nor of the conflicting "install-os" (an agent is not
-- restarted under a running install), and are not in backoff for
-- "start-agent".
SELECT p.machine_id FROM machine_provided p
WHERE NOT EXISTS (SELECT 1 FROM machine_agent_started t WHERE t.machine_id = p.machine_id)
  AND NOT EXISTS (
        SELECT 1 FROM work w JOIN sessions s ON s.session_id = w.session_id
        WHERE w.machine_id = p.machine_id AND w.process IN ('start-agent', 'install-os')
          AND s.deadline > now()
    )
  AND NOT EXISTS (
        SELECT 1 FROM work_backoff b
        WHERE b.machine_id = p.machine_id AND b.process = 'start-agent' AND b.until > now()
    )
ORDER BY p.provided_at, p.machine_id
LIMIT sqlc.arg(row_limit);
