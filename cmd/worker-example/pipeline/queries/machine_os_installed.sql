-- name: MachineOSInstalledInsert :exec
-- MachineOSInstalledInsert tags a machine as having its OS installed (the
-- example's last stage).
INSERT INTO machine_os_installed (machine_id, os_image) VALUES (sqlc.arg(machine_id), sqlc.arg(os_image));

-- name: MachinesNeedingOSInstall :many
-- MachinesNeedingOSInstall returns up to row_limit machines with a started
-- agent, earliest first, whose OS is not installed, that have no live claim
-- of "install-os" nor of the conflicting "start-agent", and are not in
-- backoff for "install-os".
SELECT a.machine_id FROM machine_agent_started a
WHERE NOT EXISTS (SELECT 1 FROM machine_os_installed t WHERE t.machine_id = a.machine_id)
  AND NOT EXISTS (
        SELECT 1 FROM work w JOIN sessions s ON s.session_id = w.session_id
        WHERE w.machine_id = a.machine_id AND w.process IN ('install-os', 'start-agent')
          AND s.deadline > now()
    )
  AND NOT EXISTS (
        SELECT 1 FROM work_backoff b
        WHERE b.machine_id = a.machine_id AND b.process = 'install-os' AND b.until > now()
    )
ORDER BY a.started_at, a.machine_id
LIMIT sqlc.arg(row_limit);
