-- name: MachineStageCounts :one
-- MachineStageCounts returns the pipeline's progress: machines in all
-- and per completed stage (totals so far), and the claims and (machine,
-- process) pairs in backoff right now.
SELECT
    (SELECT count(*) FROM machines) AS machines,
    (SELECT count(*) FROM machine_provided) AS provided,
    (SELECT count(*) FROM machine_agent_started) AS agent_started,
    (SELECT count(*) FROM machine_os_installed) AS os_installed,
    (SELECT count(*) FROM work) AS in_flight,
    (SELECT count(*) FROM work_backoff WHERE until > now()) AS backed_off;
