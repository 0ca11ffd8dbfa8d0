package dbconn

import (
	"context"
	"database/sql/driver"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"k8s.io/klog/v2"
)

// On CockroachDB, bmdb relies on session settings an operator may change
// for every role or the whole cluster (ALTER ROLE ALL SET ...):
//
//   - enable_shared_locking_for_serializable: on, the FOR KEY SHARE of
//     every session check becomes a real shared lock, and the heartbeat's
//     UPDATE of the session row waits for every open transaction of its
//     own session, so a busy session starves its heartbeat and expires.
//   - enable_durable_locking_for_serializable: on, the locks of SERIALIZABLE
//     transactions are replicated (cockroach#107749), the FOR UPDATE of
//     every claim statement included. 23.2 refuses SKIP LOCKED with
//     replicated locks (cockroach#116461, lifted in 24.1), so every claim
//     would fail there; later, every claim's lock would be a replicated
//     write, for nothing: under SERIALIZABLE bmdb's fencing does not rely
//     on locks surviving a lease transfer or a node loss.
//
// So each connection of a pool with Settings.PinCockroach pins them to
// what bmdb relies on, and the first one logs what it pinned.

// A pin is a session setting and the value bmdb relies on.
type pin struct {
	name, value, why string
}

// cockroachPins are the settings pinned on CockroachDB connections.
var cockroachPins = []pin{
	{"enable_shared_locking_for_serializable", "off",
		"FOR KEY SHARE stays a plain read under SERIALIZABLE, so heartbeats never wait for their session's transactions"},
	{"enable_durable_locking_for_serializable", "off",
		"claims' FOR UPDATE SKIP LOCKED locks stay unreplicated: 23.2 refuses SKIP LOCKED with replicated locks"},
	{"optimizer_use_lock_op_for_serializable", "off",
		"locking reads lock what their scans fetch, on every version alike, and claims offer no more than they claim"},
}

// Statements of the pins: constant text, names and values as parameters.
const (
	readSettingSQL = "SELECT current_setting($1)"
	pinSettingSQL  = "SELECT set_config($1, $2, false)"
	// Two and three of cockroachPins at once.
	pinTwoSettingsSQL   = "SELECT set_config($1, $2, false) || set_config($3, $4, false)"
	pinThreeSettingsSQL = "SELECT set_config($1, $2, false) || set_config($3, $4, false) || set_config($5, $6, false)"
)

// Engines as the connector knows them (Connector.engine).
const (
	engineUnknown int32 = iota
	enginePostgres
	engineCockroach
)

// pinState is a Connector's memory of its pins.
type pinState struct {
	engine atomic.Int32 // engineUnknown until the first connection

	mu      sync.Mutex
	present []pin // the pins this server has; nil until the first pinned connection
}

// pin applies cockroachPins to a new connection if the pool asks for them
// and the server is CockroachDB. The first connection reads each setting
// before pinning it, learns which the server has, and logs what it pinned;
// later ones pin them in one round trip.
func (c *Connector) pin(ctx context.Context, pc PQConn) error {
	if !c.settings.PinCockroach {
		return nil
	}
	cockroach, err := c.serverIsCockroach(ctx, pc)
	if err != nil || !cockroach {
		return err
	}
	c.pins.mu.Lock()
	present := c.pins.present
	c.pins.mu.Unlock()
	if present != nil {
		return pinAll(pc, present)
	}
	var report []string
	changed := false
	present = []pin{}
	for _, p := range cockroachPins {
		name := p.name
		was, err := querySetting(pc, readSettingSQL, name)
		if SQLState(err) == codeUndefinedVar { // an older CockroachDB: no such setting
			report = append(report, p.name+" (absent on this version)")
			continue
		}
		if err != nil {
			return fmt.Errorf("bmdb: reading %s: %w", name, err)
		}
		if _, err := querySetting(pc, pinSettingSQL, name, p.value); err != nil {
			return fmt.Errorf("bmdb: pinning %s = %s: %w", name, p.value, err)
		}
		present = append(present, p)
		report = append(report, fmt.Sprintf("%s = %s (was %s: %s)", name, p.value, was, p.why))
		changed = changed || was != p.value && was != "unset"
	}
	c.pins.mu.Lock()
	first := c.pins.present == nil
	c.pins.present = present
	c.pins.mu.Unlock()
	if first {
		// Info when the server's default differed: an operator's choice
		// that bmdb overrides.
		if changed {
			klog.Infof("bmdb: pinned on every CockroachDB connection: %s", strings.Join(report, "; "))
		} else {
			klog.V(1).Infof("bmdb: pinned on every CockroachDB connection: %s", strings.Join(report, "; "))
		}
	}
	return nil
}

// pinAll sets every pin the server has, in one round trip.
func pinAll(pc PQConn, pins []pin) error {
	var err error
	switch len(pins) {
	case 2:
		_, err = querySetting(pc, pinTwoSettingsSQL, pins[0].name, pins[0].value, pins[1].name, pins[1].value)
	case 3:
		_, err = querySetting(pc, pinThreeSettingsSQL, pins[0].name, pins[0].value, pins[1].name, pins[1].value, pins[2].name, pins[2].value)
	default:
		for _, p := range pins {
			if _, err := querySetting(pc, pinSettingSQL, p.name, p.value); err != nil {
				return fmt.Errorf("bmdb: pinning %s = %s: %w", p.name, p.value, err)
			}
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("bmdb: pinning CockroachDB settings: %w", err)
	}
	return nil
}

// serverIsCockroach asks the server once per Connector.
func (c *Connector) serverIsCockroach(_ context.Context, pc PQConn) (bool, error) {
	switch c.pins.engine.Load() {
	case enginePostgres:
		return false, nil
	case engineCockroach:
		return true, nil
	}
	version, err := querySetting(pc, versionSQL)
	if err != nil {
		return false, fmt.Errorf("bmdb: detecting database engine: %w", err)
	}
	engine := enginePostgres
	if strings.Contains(version, "CockroachDB") {
		engine = engineCockroach
	}
	c.pins.engine.Store(engine)
	return engine == engineCockroach, nil
}

// querySetting runs query, which returns one text value, on pc.
func querySetting(pc PQConn, query string, args ...string) (string, error) {
	named := make([]driver.NamedValue, len(args))
	for i, a := range args {
		named[i] = driver.NamedValue{Ordinal: i + 1, Value: a}
	}
	rows, err := pc.QueryContext(context.Background(), query, named)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	dest := make([]driver.Value, len(rows.Columns()))
	if err := rows.Next(dest); err != nil {
		return "", err
	}
	switch v := dest[0].(type) {
	case string:
		return v, nil
	case []byte:
		return string(v), nil
	case nil:
		return "unset", nil
	}
	return fmt.Sprint(dest[0]), nil
}
