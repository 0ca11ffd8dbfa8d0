-- name: ClaimGateOn :exec
-- ClaimGateOn turns the claim gate on for hold_seconds from now (the
-- database clock), or keeps it on at least that long (migration 000013).
INSERT INTO claim_gate (gate, until) VALUES (TRUE, statement_timestamp() + sqlc.arg(hold_seconds)::FLOAT8 * INTERVAL '1 second')
ON CONFLICT (gate) DO UPDATE SET until = GREATEST(claim_gate.until, EXCLUDED.until);
