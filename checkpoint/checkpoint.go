// Package checkpoint is tidemark's control state in the target PostgreSQL
// database, next to the data it describes: source positions, per-table
// catch-up watermarks and states, stream offsets, verify runs, epoch floors
// and the hard-delete tombstones. It owns every control table (their DDL and
// names), the one control-schema setting (Config.Schema, DefaultSchema) and
// the DDL lock (DDLLockKey).
//
// A Store never opens connections of its own: every method runs on the
// Querier it is given, which the PostgreSQL sink (sink/postgres, the one
// product package that imports this one) adapts from the transaction that
// also writes the batch's data. A checkpoint or watermark therefore commits
// (or rolls back) together with the rows it describes, and can never be
// ahead of them.
//
// The control tables live in one schema (default DefaultSchema):
//
//	checkpoints(source text primary key, position text not null, gtid text,
//	            file text, pos bigint, updated_at timestamptz not null default now())
//	watermarks(source text, database text, table_name text,
//	           value timestamptz not null, updated_at timestamptz default now(),
//	           primary key (source, database, table_name))
//	tables(source text, database text, table_name text, state text not null,
//	       reason text, floor_seq bigint not null default 0,
//	       floor_idx integer not null default 0,
//	       updated_at timestamptz not null default now(),
//	       primary key (source, database, table_name))
//
// tables holds the replication state of each source table
// (tidemark.TableState): streaming, quarantined (with the reason), resync
// (requested by `tidemark resync`) or snapshotting, and the version of the
// table's last snapshot (floor_seq, floor_idx). `tidemark resync` writes
// state = 'resync'; everything else is written by the daemon.
//
// checkpoints.position holds tidemark.Position.String and is the value read
// back; gtid, file and pos are the same position split out for people and
// monitoring queries.
//
// Init also creates stream_offsets (the appliers' offsets, SaveOffset),
// verify_runs (SaveVerifyRun) and source_epochs (each source's epoch floor,
// raised by SavePosition). InitTombstones creates tombstones and
// tombstone_state, which the sink writes in hard-delete mode
// (sink/postgres/tombstones.go).
package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"tidemark"
)

// DefaultSchema is the schema of the control tables when Config.Schema is
// empty.
const DefaultSchema = "tidemark"

// DDLLockKey is the transaction-level advisory lock (pg_advisory_xact_lock)
// that serializes DDL on the target. Init takes it so that concurrent
// sessions creating the control tables do not race (CREATE SCHEMA IF NOT
// EXISTS and CREATE TABLE IF NOT EXISTS can both fail with a unique
// violation, SQLSTATE 23505, when two sessions run them at once); the
// PostgreSQL sink takes the same key for every change of a target table's
// layout, so the two never race on a shared schema either. The value is
// arbitrary but fixed: "tidemark" in ASCII, truncated to 63 bits.
const DDLLockKey int64 = 0x746964656d61726b

// Config configures a Store.
type Config struct {
	// Schema holds the control tables. Default "tidemark". It must be a
	// valid identifier (tidemark.ValidIdentifier); it is always quoted.
	Schema string
}

// Store is the control state on PostgreSQL tables. It is safe for
// concurrent use; it holds no state besides its SQL text.
type Store struct {
	schema string // unquoted, for messages

	initSQL, initCheckSQL       string
	loadPosSQL, savePosSQL      string
	loadFloorSQL                string
	loadWMSQL, saveWMSQL        string
	checkpointsName, wmarksName string // "schema.table", for messages

	loadStatesSQL, saveStateSQL, deleteStateSQL, deleteWMSQL string
	addStateSQL, swapStateSQL                                string
	tablesName                                               string

	loadOffsetsSQL, insertOffsetSQL, updateOffsetSQL string
	offsetsName                                      string
	saveVerifySQL, loadVerifySQL                     string

	tombstones, tombstoneState, tombstoneHorizons string // quoted "schema"."table"
}

// New validates cfg and returns a Store.
func New(cfg Config) (*Store, error) {
	schema := cfg.Schema
	if schema == "" {
		schema = DefaultSchema
	}
	if err := tidemark.CheckIdentifier("schema", schema); err != nil {
		return nil, fmt.Errorf("checkpoint config: schema: %w", err)
	}
	qs := tidemark.QuotePostgres(schema)
	cp := qs + ".checkpoints"
	wm := qs + ".watermarks"
	tb := qs + ".tables"
	so := qs + ".stream_offsets"
	vr := qs + ".verify_runs"
	ep := qs + ".source_epochs"
	s := &Store{
		schema:            schema,
		checkpointsName:   schema + ".checkpoints",
		wmarksName:        schema + ".watermarks",
		tablesName:        schema + ".tables",
		offsetsName:       schema + ".stream_offsets",
		tombstones:        qs + "." + tidemark.QuotePostgres(tombstoneTable),
		tombstoneState:    qs + "." + tidemark.QuotePostgres(tombstoneStateTable),
		tombstoneHorizons: qs + "." + tidemark.QuotePostgres(tombstoneHorizonTable),
	}
	// One string of several statements: executed without parameters it is
	// sent as one simple-protocol query, which PostgreSQL runs as a single
	// implicit transaction (or inside the caller's), so the advisory lock
	// is held until the tables exist.
	s.initCheckSQL = `SELECT count(*) FROM pg_catalog.pg_attribute a
JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
	AND c.relname::text || '.' || a.attname::text = ANY($2::text[])`
	s.initSQL = fmt.Sprintf(`SELECT pg_advisory_xact_lock(%d);
CREATE SCHEMA IF NOT EXISTS %s;
CREATE TABLE IF NOT EXISTS %s (
	source     text PRIMARY KEY,
	position   text NOT NULL,
	gtid       text,
	file       text,
	pos        bigint,
	updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS %s (
	source     text,
	database   text,
	table_name text,
	value      timestamptz NOT NULL,
	updated_at timestamptz DEFAULT now(),
	PRIMARY KEY (source, database, table_name)
);
CREATE TABLE IF NOT EXISTS %s (
	source     text,
	database   text,
	table_name text,
	state      text NOT NULL CHECK (state IN ('streaming', 'quarantined', 'resync', 'snapshotting')),
	reason     text,
	floor_seq  bigint NOT NULL DEFAULT 0,
	floor_idx  integer NOT NULL DEFAULT 0,
	updated_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (source, database, table_name)
);
ALTER TABLE %s ADD COLUMN IF NOT EXISTS snapshot_cursor text NOT NULL DEFAULT '';
CREATE TABLE IF NOT EXISTS %s (
	consumer_group text,
	topic          text,
	partition      integer,
	next_offset    bigint NOT NULL,
	table_schema   text NOT NULL DEFAULT '',
	updated_at     timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer_group, topic, partition)
);
ALTER TABLE %s ADD COLUMN IF NOT EXISTS topic_id text NOT NULL DEFAULT '',
	ADD COLUMN IF NOT EXISTS leader_epoch integer NOT NULL DEFAULT -1,
	ADD COLUMN IF NOT EXISTS floor_seq bigint NOT NULL DEFAULT 0,
	ADD COLUMN IF NOT EXISTS floor_idx integer NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS %s (
	source      text PRIMARY KEY,
	verdict     text NOT NULL,
	tables      integer NOT NULL,
	differing   integer NOT NULL,
	errors      integer NOT NULL,
	summary     text NOT NULL,
	finished_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS %s (
	source     text PRIMARY KEY,
	epoch      integer NOT NULL,
	identity   text NOT NULL,
	updated_at timestamptz NOT NULL DEFAULT now()
)`, DDLLockKey, qs, cp, wm, tb, tb, so, so, vr, ep)
	s.saveVerifySQL = `INSERT INTO ` + vr + ` (source, verdict, tables, differing, errors, summary, finished_at)
VALUES ($1, $2, $3, $4, $5, $6, now())
ON CONFLICT (source) DO UPDATE SET verdict = EXCLUDED.verdict, tables = EXCLUDED.tables, differing = EXCLUDED.differing,
	errors = EXCLUDED.errors, summary = EXCLUDED.summary, finished_at = now()`
	s.loadVerifySQL = `SELECT verdict, tables, differing, errors, summary, finished_at FROM ` + vr + ` WHERE source = $1`
	s.loadPosSQL = `SELECT position FROM ` + cp + ` WHERE source = $1`
	// The checkpoint, and the source's epoch floor (source_epochs: the
	// highest epoch rows were written in, kept apart from the checkpoint,
	// which an operator may delete or edit): raised, never lowered, in
	// the same statement and transaction. The floor as it is afterwards
	// comes back (the snapshot of the statement when it did not move);
	// below it, nothing is written.
	s.savePosSQL = `WITH c AS (INSERT INTO ` + cp + ` AS c (source, position, gtid, file, pos, updated_at)
SELECT $1::text, $2::text, $3::text, $4::text, $5::bigint, now()
WHERE NOT EXISTS (SELECT 1 FROM ` + ep + ` WHERE source = $1 AND (epoch > $6::integer
	OR (epoch = $6::integer AND identity <> '' AND $7::text <> '' AND identity <> $7::text)))
ON CONFLICT (source) DO UPDATE SET
	position = EXCLUDED.position, gtid = EXCLUDED.gtid, file = EXCLUDED.file,
	pos = EXCLUDED.pos, updated_at = now()
RETURNING 1),
e AS (INSERT INTO ` + ep + ` AS e (source, epoch, identity, updated_at) VALUES ($1, $6::integer, $7::text, now())
ON CONFLICT (source) DO UPDATE SET epoch = EXCLUDED.epoch, identity = EXCLUDED.identity, updated_at = now()
	WHERE e.epoch < EXCLUDED.epoch OR (e.epoch = EXCLUDED.epoch AND e.identity = '' AND EXCLUDED.identity <> '')
RETURNING e.epoch, e.identity)
SELECT coalesce((SELECT epoch FROM e), (SELECT epoch FROM ` + ep + ` WHERE source = $1), $6::integer),
	coalesce((SELECT identity FROM e), (SELECT identity FROM ` + ep + ` WHERE source = $1), $7::text)`
	s.loadFloorSQL = `SELECT epoch, identity FROM ` + ep + ` WHERE source = $1`
	s.loadWMSQL = `SELECT value FROM ` + wm + ` WHERE source = $1 AND database = $2 AND table_name = $3`
	// GREATEST: a watermark never moves backwards, also when an older
	// batch is replayed after a crash.
	s.saveWMSQL = `INSERT INTO ` + wm + ` AS w (source, database, table_name, value, updated_at)
VALUES ($1, $2, $3, $4, now())
ON CONFLICT (source, database, table_name) DO UPDATE SET
	value = GREATEST(w.value, EXCLUDED.value), updated_at = now()`
	// One row per source, so that it goes through Querier.QueryRow.
	s.loadStatesSQL = `SELECT coalesce(json_agg(json_build_object('d', database, 't', table_name, 's', state, 'r', reason,
	'fs', floor_seq::text, 'fi', floor_idx, 'c', snapshot_cursor, 'u', updated_at) ORDER BY database, table_name), '[]')::text
FROM ` + tb + ` WHERE source = $1`
	s.saveStateSQL = `INSERT INTO ` + tb + ` AS t (source, database, table_name, state, reason, floor_seq, floor_idx, snapshot_cursor, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now())
ON CONFLICT (source, database, table_name) DO UPDATE SET
	state = EXCLUDED.state, reason = EXCLUDED.reason, floor_seq = EXCLUDED.floor_seq,
	floor_idx = EXCLUDED.floor_idx, snapshot_cursor = EXCLUDED.snapshot_cursor, updated_at = now()`
	// Compare-and-set (SwapTableState): RETURNING gives no row when the
	// recorded state is not the one expected.
	s.addStateSQL = `INSERT INTO ` + tb + ` (source, database, table_name, state, reason, floor_seq, floor_idx, snapshot_cursor, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now()) ON CONFLICT DO NOTHING RETURNING 1`
	s.swapStateSQL = `UPDATE ` + tb + ` SET state = $4, reason = $5, floor_seq = $6, floor_idx = $7, snapshot_cursor = $8, updated_at = now()
WHERE source = $1 AND database = $2 AND table_name = $3 AND state = $9 RETURNING 1`
	s.deleteStateSQL = `DELETE FROM ` + tb + ` WHERE source = $1 AND database = $2 AND table_name = $3`
	s.deleteWMSQL = `DELETE FROM ` + wm + ` WHERE source = $1 AND database = $2 AND table_name = $3`
	s.loadOffsetsSQL = `SELECT coalesce(json_agg(json_build_object('p', partition, 'n', next_offset::text, 's', table_schema, 'id', topic_id, 'e', leader_epoch, 'fs', floor_seq::text, 'fi', floor_idx)
	ORDER BY partition), '[]')::text FROM ` + so + ` WHERE consumer_group = $1 AND topic = $2`
	// Compare-and-set: RETURNING gives no row when another member got
	// there first.
	s.insertOffsetSQL = `INSERT INTO ` + so + ` (consumer_group, topic, partition, next_offset, table_schema, topic_id, leader_epoch, floor_seq, floor_idx, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, now()) ON CONFLICT DO NOTHING RETURNING 1`
	s.updateOffsetSQL = `UPDATE ` + so + ` SET next_offset = $4, table_schema = $5, topic_id = $6, leader_epoch = $7, floor_seq = $8, floor_idx = $9, updated_at = now()
WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND next_offset = $10 RETURNING 1`
	return s, nil
}

// Schema returns the schema of the control tables.
func (s *Store) Schema() string { return s.schema }

// Init creates the schema and control tables if they are missing. It is
// safe to run concurrently from several sessions. The SQL is sent without
// bind parameters as one multi-statement string, so q must accept that (a
// pgx connection or transaction does).
func (s *Store) Init(ctx context.Context, q Querier) error {
	// A catalog read first, which takes no lock: with every table and
	// column in place nothing else runs. The DDL below would lock the
	// control tables even when there is nothing to add (ALTER TABLE … ADD
	// COLUMN IF NOT EXISTS takes an ACCESS EXCLUSIVE lock), so it would
	// wait for any open transaction on them (an applier stopped in the
	// middle of a batch), and every session after it would wait behind it.
	var n int
	if err := q.QueryRow(ctx, s.initCheckSQL, s.schema, controlColumns).Scan(&n); err != nil {
		return fmt.Errorf("look up checkpoint tables in schema %q: %w", s.schema, err)
	}
	if n == len(controlColumns) {
		return nil
	}
	if err := q.Exec(ctx, s.initSQL); err != nil {
		return fmt.Errorf("create checkpoint tables in schema %q: %w", s.schema, err)
	}
	return nil
}

// LoadPosition returns the stored position of source and whether there is
// one. A stored value that does not parse is an error naming the table and
// the source.
func (s *Store) LoadPosition(ctx context.Context, q Querier, source string) (tidemark.Position, bool, error) {
	var text string
	err := q.QueryRow(ctx, s.loadPosSQL, source).Scan(&text)
	if errors.Is(err, ErrNoRows) {
		return tidemark.Position{}, false, nil
	}
	if err != nil {
		return tidemark.Position{}, false, fmt.Errorf("load checkpoint of source %q from %s: %w", source, s.checkpointsName, err)
	}
	pos, err := tidemark.ParsePosition(text)
	if err != nil {
		return tidemark.Position{}, false, fmt.Errorf("load checkpoint of source %q from %s: %w", source, s.checkpointsName, err)
	}
	return pos, true, nil
}

// SavePosition stores pos for source, replacing what was there. It does not
// compare positions: the caller commits positions in stream order, in the
// same transaction as the data they follow.
func (s *Store) SavePosition(ctx context.Context, q Querier, source string, pos tidemark.Position) error {
	if source == "" {
		return fmt.Errorf("save checkpoint to %s: empty source name", s.checkpointsName)
	}
	if pos.IsZero() {
		return fmt.Errorf("save checkpoint of source %q to %s: zero position", source, s.checkpointsName)
	}
	if pos.Offset > math.MaxInt64 {
		return fmt.Errorf("save checkpoint of source %q to %s: offset %d does not fit a bigint", source, s.checkpointsName, pos.Offset)
	}
	text := pos.String()
	// Refuse what could not be read back: a checkpoint that cannot be
	// loaded stops the daemon at its next start.
	if back, err := tidemark.ParsePosition(text); err != nil || back != pos {
		if err == nil {
			err = fmt.Errorf("position %q reads back as %q", text, back.String())
		}
		return fmt.Errorf("save checkpoint of source %q to %s: %w", source, s.checkpointsName, err)
	}
	var gtid, file, off any
	if pos.GTID != "" {
		gtid = pos.GTID
	}
	if pos.File != "" {
		file = pos.File
		off = int64(pos.Offset)
	}
	id := ""
	if !pos.Source.IsZero() {
		id = pos.Source.String()
	}
	var (
		floor   int64
		floorID string
	)
	if err := q.QueryRow(ctx, s.savePosSQL, source, text, gtid, file, off, int64(pos.Epoch), id).Scan(&floor, &floorID); err != nil {
		return fmt.Errorf("save checkpoint of source %q to %s: %w", source, s.checkpointsName, err)
	}
	if floor > int64(pos.Epoch) || (floor == int64(pos.Epoch) && id != "" && floorID != "" && floorID != id) {
		return fmt.Errorf("save checkpoint %s of source %q: rows of this source were written in epoch %d (server %s; %s.source_epochs), and changes of a lower epoch, or of another server in the same epoch, lose to them in the version guard: nothing of the batch is committed: %w",
			pos, source, floor, floorID, s.schema, tidemark.ErrEpochRegressed)
	}
	return nil
}

// LoadEpochFloor returns source's epoch floor: the highest epoch its rows
// were written in (raised by SavePosition in the batch's transaction, kept
// apart from the checkpoint, which an operator may delete or edit), as a
// Position holding only Epoch and Source (the server of that epoch), and
// whether one is stored. A start position below it cannot take the source
// back to an epoch whose changes would all lose to the target's rows
// (docs/FAILOVER.md).
func (s *Store) LoadEpochFloor(ctx context.Context, q Querier, source string) (tidemark.Position, bool, error) {
	var (
		epoch int64
		id    string
	)
	err := q.QueryRow(ctx, s.loadFloorSQL, source).Scan(&epoch, &id)
	if errors.Is(err, ErrNoRows) {
		return tidemark.Position{}, false, nil
	}
	if err != nil {
		return tidemark.Position{}, false, fmt.Errorf("load epoch floor of source %q from %s.source_epochs: %w", source, s.schema, err)
	}
	floor := tidemark.Position{Epoch: uint32(epoch)}
	if id != "" {
		if floor.Source, err = tidemark.ParseSourceIdentity(id); err != nil {
			return tidemark.Position{}, false, fmt.Errorf("load epoch floor of source %q from %s.source_epochs: %w", source, s.schema, err)
		}
	}
	return floor, true, nil
}

// LoadWatermark returns the stored catch-up watermark of a table, in UTC,
// and whether there is one.
func (s *Store) LoadWatermark(ctx context.Context, q Querier, source string, table tidemark.TableID) (time.Time, bool, error) {
	var v time.Time
	err := q.QueryRow(ctx, s.loadWMSQL, source, table.Database, table.Name).Scan(&v)
	if errors.Is(err, ErrNoRows) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("load watermark of %s (source %q) from %s: %w", table, source, s.wmarksName, err)
	}
	return v.UTC(), true, nil
}

// SaveWatermark stores a table's watermark. It never moves a stored
// watermark backwards: the larger of the stored and the new value is kept.
func (s *Store) SaveWatermark(ctx context.Context, q Querier, source string, w tidemark.Watermark) error {
	if source == "" {
		return fmt.Errorf("save watermark of %s to %s: empty source name", w.Table, s.wmarksName)
	}
	if w.Table.Database == "" || w.Table.Name == "" {
		return fmt.Errorf("save watermark of %s (source %q) to %s: incomplete table name", w.Table, source, s.wmarksName)
	}
	if w.Value.IsZero() {
		return fmt.Errorf("save watermark of %s (source %q) to %s: zero time", w.Table, source, s.wmarksName)
	}
	if err := q.Exec(ctx, s.saveWMSQL, source, w.Table.Database, w.Table.Name, w.Value.UTC()); err != nil {
		return fmt.Errorf("save watermark of %s (source %q) to %s: %w", w.Table, source, s.wmarksName, err)
	}
	return nil
}

// LoadTableStates returns the table states recorded for source, ordered by
// table.
func (s *Store) LoadTableStates(ctx context.Context, q Querier, source string) ([]tidemark.TableState, error) {
	var text string
	if err := q.QueryRow(ctx, s.loadStatesSQL, source).Scan(&text); err != nil {
		return nil, fmt.Errorf("load table states of source %q from %s: %w", source, s.tablesName, err)
	}
	var rows []struct {
		D, T, S string
		R       *string
		FS      string
		FI      uint32
		C       string
		U       time.Time
	}
	if err := json.Unmarshal([]byte(text), &rows); err != nil {
		return nil, fmt.Errorf("load table states of source %q from %s: %w", source, s.tablesName, err)
	}
	out := make([]tidemark.TableState, 0, len(rows))
	for _, r := range rows {
		seq, err := strconv.ParseUint(r.FS, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("load table state of %s.%s (source %q) from %s: floor_seq %q: %w", r.D, r.T, source, s.tablesName, r.FS, err)
		}
		st := tidemark.TableState{Table: tidemark.TableID{Database: r.D, Name: r.T}, Mode: tidemark.TableMode(r.S),
			Floor: tidemark.Version{Seq: seq, Index: r.FI}, Cursor: r.C, UpdatedAt: r.U.UTC()}
		if r.R != nil {
			st.Reason = *r.R
		}
		if !st.Mode.Valid() {
			return nil, fmt.Errorf("load table state of %s (source %q) from %s: unknown state %q", st.Table, source, s.tablesName, r.S)
		}
		out = append(out, st)
	}
	return out, nil
}

// SaveTableState records a table's state, replacing what was there.
func (s *Store) SaveTableState(ctx context.Context, q Querier, source string, st tidemark.TableState) error {
	args, err := s.stateArgs(source, st)
	if err != nil {
		return fmt.Errorf("save state of %s (source %q) to %s: %w", st.Table, source, s.tablesName, err)
	}
	if err := q.Exec(ctx, s.saveStateSQL, args...); err != nil {
		return fmt.Errorf("save state of %s (source %q) to %s: %w", st.Table, source, s.tablesName, err)
	}
	return nil
}

// SwapTableState records st only if the table's recorded state has mode
// old (old "": none is recorded), and reports whether it did: a
// compare-and-set in one statement.
func (s *Store) SwapTableState(ctx context.Context, q Querier, source string, old tidemark.TableMode, st tidemark.TableState) (bool, error) {
	args, err := s.stateArgs(source, st)
	if err == nil && old != "" && !old.Valid() {
		err = fmt.Errorf("unknown expected state %q", old)
	}
	if err != nil {
		return false, fmt.Errorf("swap state of %s (source %q) in %s: %w", st.Table, source, s.tablesName, err)
	}
	query := s.addStateSQL
	if old != "" {
		query, args = s.swapStateSQL, append(args, string(old))
	}
	var one int
	err = q.QueryRow(ctx, query, args...).Scan(&one)
	if errors.Is(err, ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("swap state of %s (source %q) in %s: %w", st.Table, source, s.tablesName, err)
	}
	return true, nil
}

// stateArgs checks st and returns the bind parameters of saveStateSQL.
func (s *Store) stateArgs(source string, st tidemark.TableState) ([]any, error) {
	if source == "" || st.Table.Database == "" || st.Table.Name == "" {
		return nil, errors.New("incomplete name")
	}
	if !st.Mode.Valid() {
		return nil, fmt.Errorf("unknown state %q", st.Mode)
	}
	if st.Floor.Seq > math.MaxInt64 || st.Floor.Index > math.MaxInt32 {
		return nil, fmt.Errorf("floor %s does not fit", st.Floor)
	}
	var reason any
	if st.Reason != "" {
		reason = st.Reason
	}
	return []any{source, st.Table.Database, st.Table.Name, string(st.Mode), reason,
		int64(st.Floor.Seq), int32(st.Floor.Index), st.Cursor}, nil
}

// DeleteTableState forgets a table's state.
func (s *Store) DeleteTableState(ctx context.Context, q Querier, source string, table tidemark.TableID) error {
	if err := q.Exec(ctx, s.deleteStateSQL, source, table.Database, table.Name); err != nil {
		return fmt.Errorf("delete state of %s (source %q) from %s: %w", table, source, s.tablesName, err)
	}
	return nil
}

// DeleteWatermark forgets a table's catch-up watermark: its next catch-up
// is a full snapshot.
func (s *Store) DeleteWatermark(ctx context.Context, q Querier, source string, table tidemark.TableID) error {
	if err := q.Exec(ctx, s.deleteWMSQL, source, table.Database, table.Name); err != nil {
		return fmt.Errorf("delete watermark of %s (source %q) from %s: %w", table, source, s.wmarksName, err)
	}
	return nil
}

// LoadOffsets returns the stored offsets of group's partitions of topic
// (Prev is set to Next).
func (s *Store) LoadOffsets(ctx context.Context, q Querier, group, topic string) ([]tidemark.StreamOffset, error) {
	var text string
	if err := q.QueryRow(ctx, s.loadOffsetsSQL, group, topic).Scan(&text); err != nil {
		return nil, fmt.Errorf("load offsets of group %q, topic %q from %s: %w", group, topic, s.offsetsName, err)
	}
	var rows []struct {
		P  int32  `json:"p"`
		N  string `json:"n"`
		S  string `json:"s"`
		ID string `json:"id"`
		E  int32  `json:"e"`
		FS string `json:"fs"`
		FI uint32 `json:"fi"`
	}
	if err := json.Unmarshal([]byte(text), &rows); err != nil {
		return nil, fmt.Errorf("load offsets of group %q, topic %q from %s: %w", group, topic, s.offsetsName, err)
	}
	out := make([]tidemark.StreamOffset, 0, len(rows))
	for _, r := range rows {
		fs, _ := strconv.ParseUint(r.FS, 10, 64) // bigint ≥ 0; "" from an older row
		n, err := strconv.ParseInt(r.N, 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("load offsets of group %q, topic %q from %s: partition %d: bad next_offset %q", group, topic, s.offsetsName, r.P, r.N)
		}
		out = append(out, tidemark.StreamOffset{Group: group, Topic: topic, Partition: r.P, Next: n, Prev: n, Schema: r.S, TopicID: r.ID, Epoch: r.E, Floor: tidemark.Version{Seq: fs, Index: r.FI}})
	}
	return out, nil
}

// SaveOffset stores o if the stored Next still equals o.Prev (no row when
// o.Prev is -1): a compare-and-set; otherwise it returns an error wrapping
// tidemark.ErrOffsetMoved.
func (s *Store) SaveOffset(ctx context.Context, q Querier, o tidemark.StreamOffset) error {
	what := fmt.Sprintf("save offset %d of group %q, topic %q, partition %d to %s", o.Next, o.Group, o.Topic, o.Partition, s.offsetsName)
	if o.Group == "" || o.Topic == "" || o.Partition < 0 || o.Next < 0 {
		return fmt.Errorf("%s: incomplete offset", what)
	}
	var one int
	var err error
	if o.Prev < 0 {
		err = q.QueryRow(ctx, s.insertOffsetSQL, o.Group, o.Topic, o.Partition, o.Next, o.Schema, o.TopicID, o.Epoch, int64(o.Floor.Seq), int32(o.Floor.Index)).Scan(&one)
	} else {
		err = q.QueryRow(ctx, s.updateOffsetSQL, o.Group, o.Topic, o.Partition, o.Next, o.Schema, o.TopicID, o.Epoch, int64(o.Floor.Seq), int32(o.Floor.Index), o.Prev).Scan(&one)
	}
	if errors.Is(err, ErrNoRows) {
		return fmt.Errorf("%s: expected stored offset %d: %w", what, o.Prev, tidemark.ErrOffsetMoved)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// SaveVerifyRun records the outcome of a verification of r.Source,
// replacing the previous one (FinishedAt is the target's clock).
func (s *Store) SaveVerifyRun(ctx context.Context, q Querier, r tidemark.VerifyRun) error {
	if r.Source == "" {
		return fmt.Errorf("save verify run to %s.verify_runs: source: required", s.schema)
	}
	if err := q.Exec(ctx, s.saveVerifySQL, r.Source, r.Verdict, r.Tables, r.Differing, r.Errors, r.Summary); err != nil {
		return fmt.Errorf("save verify run of %s to %s.verify_runs: %w", r.Source, s.schema, err)
	}
	return nil
}

// LastVerifyRun returns the last recorded verification of source; ok is
// false when there is none.
func (s *Store) LastVerifyRun(ctx context.Context, q Querier, source string) (r tidemark.VerifyRun, ok bool, err error) {
	r.Source = source
	err = q.QueryRow(ctx, s.loadVerifySQL, source).Scan(&r.Verdict, &r.Tables, &r.Differing, &r.Errors, &r.Summary, &r.FinishedAt)
	if errors.Is(err, ErrNoRows) {
		return r, false, nil
	}
	if err != nil {
		return r, false, fmt.Errorf("load verify run of %s from %s.verify_runs: %w", source, s.schema, err)
	}
	r.FinishedAt = r.FinishedAt.UTC()
	return r, true, nil
}

// controlColumns is "table.column" of every column Init creates, sorted.
// Init looks them up first (initCheckSQL) and does nothing more when all
// are there: a column added to initSQL must be added here too, or existing
// installations never get it (TestInitCheckListsEveryColumn compares the
// two).
var controlColumns = []string{
	"checkpoints.file", "checkpoints.gtid", "checkpoints.pos", "checkpoints.position", "checkpoints.source", "checkpoints.updated_at",
	"source_epochs.epoch", "source_epochs.identity", "source_epochs.source", "source_epochs.updated_at",
	"stream_offsets.consumer_group", "stream_offsets.floor_idx", "stream_offsets.floor_seq", "stream_offsets.leader_epoch",
	"stream_offsets.next_offset", "stream_offsets.partition", "stream_offsets.table_schema", "stream_offsets.topic",
	"stream_offsets.topic_id", "stream_offsets.updated_at",
	"tables.database", "tables.floor_idx", "tables.floor_seq", "tables.reason", "tables.snapshot_cursor", "tables.source",
	"tables.state", "tables.table_name", "tables.updated_at",
	"verify_runs.differing", "verify_runs.errors", "verify_runs.finished_at", "verify_runs.source", "verify_runs.summary",
	"verify_runs.tables", "verify_runs.verdict",
	"watermarks.database", "watermarks.source", "watermarks.table_name", "watermarks.updated_at", "watermarks.value",
}

// ControlColumns returns "table.column" of every column Init creates,
// sorted (for tests and documentation).
func ControlColumns() []string { return append([]string(nil), controlColumns...) }
