// Package fallback catches a target up with its source without the binlog:
// when the source has purged the position in the checkpoint, on the first
// run (no checkpoint: a snapshot), and on `tidemark catchup`.
//
// The algorithm, per run:
//
//  1. Capture the source position (and the version to stamp rows with)
//     before reading anything, from a consistent snapshot: every
//     transaction up to the position is visible to every read that follows
//     (binlog.Reader.Capture; under group commit a plain SHOW MASTER STATUS
//     runs ahead of what reads see).
//  2. Per table, read the stored watermark W (UTC). A table with no
//     watermark gets a full snapshot in key order, in chunks (also when
//     the column is NULL in every row). A watermark column missing from
//     the source table is a *tidemark.TableError: the table is quarantined.
//  3. Capture the upper bound U = MAX(column) before reading, clamped to the
//     source clock + a tolerance: a far-future value never drags the
//     watermark forward (rows beyond U are counted and reported).
//  4. Read W − lookback < column ≤ U with keyset pagination on
//     (column, key). The source compares the column in its own zone: the
//     UTC bounds are converted back to source local time (the incident was
//     a UTC watermark compared with IST values); the lower bound is lowered
//     across a DST fold (tidemark.ZonePolicy.LocalFloor). Rows whose column
//     is NULL or a zero date are read again by every window.
//  5. Upsert through the sink (rows carry the captured version, which
//     orders against binlog versions; see tidemark.Snapshot) and store
//     W = U in the same transaction as the last chunk. A table without a
//     dated row (MAX is NULL) stores nothing.
//  6. Optionally detect hard deletes with a key diff: one checksum of all
//     the keys on each side, computed by both servers at once; only when
//     they differ, chunk checksums of the keys on both sides, key lists
//     only inside mismatching chunks.
//  7. Store the captured position as the checkpoint; streaming resumes
//     there, and the overlap is absorbed by the version guard (and dedupe).
//
// A crash during a run leaves the checkpoint at the old position: the next
// start runs the catch-up again. Tables finished before the crash start from
// their new watermark; the table in progress re-reads its window (idempotent
// upserts). A first run (no checkpoint) with table states resumes instead:
// with the interrupted run's capture, after each range's recorded cursor
// (firstrun.go).
package fallback

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"tidemark"
)

// Delete detection modes.
const (
	DeletesNone    = ""
	DeletesKeyDiff = "keydiff"
)

// TableConfig is the catch-up configuration of one table.
type TableConfig struct {
	// Column is the watermark column (DATETIME in the source zone, or
	// TIMESTAMP). Empty: every catch-up re-reads the table in full.
	Column string
	// Lookback re-reads this much before the watermark, to catch rows
	// committed late with an older timestamp; size it to the longest
	// source transaction (default Config.Lookback).
	Lookback time.Duration
	// DeleteDetection is "" (deletes in the gap are not captured, and the
	// report says so) or "keydiff".
	DeleteDetection string
}

// Config configures a CatchUp.
type Config struct {
	// Source names the source (checkpoint and watermark rows). Required.
	Source string
	// Tables configures tables by "db.table"; others get a full re-read.
	Tables map[string]TableConfig
	// Lookback is the default lookback (default 15m).
	Lookback time.Duration
	// ChunkRows is the rows per read and per applied batch (default 5000).
	ChunkRows int
	// FutureTolerance bounds how far past the source clock the upper bound
	// may be (default 5m).
	FutureTolerance time.Duration
	// KeyChunkRows is the chunk of the key diff (default 10000).
	KeyChunkRows int
	// ReadAhead is how many chunks may be read ahead of the one being
	// applied (default 2).
	ReadAhead int
	// ProgressEvery is how often a first-run table's range cursors are
	// recorded at most, besides its begin and its end (default
	// tidemark.DefaultSnapshotProgressEvery): the reading a kill -9
	// mid-snapshot can make the next start redo.
	ProgressEvery time.Duration
	// Logger receives progress lines (default discard).
	Logger *slog.Logger
	// Progress, if set, is called after every chunk.
	Progress func(p Progress)
	// Boundaries, when set, encloses each full read of a catch-up of every
	// table that no key diff can follow (the target lists no keys: the
	// scale-out tailer's Kafka) in snapshot boundaries. Its consumers then
	// remove the target rows the read did not carry, as the key diff
	// would (tidemark.SnapshotBoundary): an interrupted first-run
	// snapshot ends like an uninterrupted one, and no hard delete made
	// while the binlog was unavailable is missed by a full read.
	Boundaries tidemark.SnapshotBoundary
	// HeldRows, when set, tells whether the target holds rows of a table
	// when the key target cannot (Kafka alone: the table's topic holds
	// records). Without either, the target is taken to hold rows.
	HeldRows tidemark.TargetRows
}

// Progress reports a table's catch-up progress.
type Progress struct {
	Table       tidemark.TableID
	Rows        int64
	Chunks      int
	Done        bool
	Deletes     int64
	BeyondUpper int64
}

// TableReport says what a catch-up did for one table.
type TableReport struct {
	Table tidemark.TableID
	// Mode is "window", "snapshot" (no watermark yet), "full" (no
	// watermark column), "empty" (a snapshot that found no row), or
	// "gone" (renamed or dropped on the source after the capture: left
	// out, Rows counts what was read before it went).
	Mode string
	// Lower and Upper are the window read (UTC; Lower zero = unbounded).
	Lower, Upper time.Time
	Rows         int64
	// Undated counts the rows of Rows a window read because their column
	// is NULL or a zero date (no window selects them).
	Undated int64
	Chunks  int
	Applied tidemark.ApplyStats
	// BeyondUpper counts rows whose column is past the clamped upper
	// bound (far-future values).
	BeyondUpper int64
	// Deletes found by the key diff; DeletesChecked is false when the
	// table has no delete detection (deletes in the gap were not
	// captured).
	Deletes        int64
	DeletesChecked bool
	// Reason says why a table with a watermark was read in full instead
	// of a window ("" when it was not).
	Reason string
	// ReadTime and ApplyTime split the table's time between the source
	// reads and the target applies.
	ReadTime, ApplyTime time.Duration
	// Resumed says how a first run resumed the table after an interrupted
	// one (firstrun.go): "ranges" (each range after its recorded cursor;
	// Rows counts the rows read since), "done" (read before, not again),
	// "" (not resumed).
	Resumed string
}

// Report is the result of a catch-up run.
type Report struct {
	Snapshot tidemark.Snapshot
	Tables   []TableReport
	Took     time.Duration
	// firstRun is the first run's recorder (nil when the run recorded
	// nothing): its tables are recorded streaming before the checkpoint.
	firstRun *firstRun
}

// Target is what a catch-up writes to: a sink that also reads its
// watermarks. Key diffs also need a tidemark.KeyTarget (New's keys).
type Target interface {
	tidemark.Sink
	tidemark.WatermarkStore
}

// CatchUp runs the catch-up algorithm for one source.
type CatchUp struct {
	cfg    Config
	src    tidemark.SnapshotSource
	target Target
	keys   tidemark.KeyTarget // nil: no key diff possible
	// readers are the extra readers of a parallel full read (SetReaders).
	readers []tidemark.SnapshotSource
	// pool, in a worker of a run that catches several tables up at once
	// (runTables), takes the key ranges of the worker's table to the
	// workers that are free; src is then the worker's own reader and
	// readers is empty.
	pool *workPool
}

// SetReaders gives the catch-up more readers of the source, each on a
// connection of its own that nothing else uses (snapshot.parallelism − 1
// of them): a full read of a table (a first-run snapshot, a table without
// a watermark column) is then split into up to 1+len(extra) ranges of its
// first key column (tidemark.KeySplitter), each read in chunks by its own
// reader and applied by its own Apply calls at the same time. The target
// must be safe for concurrent Apply calls (the PostgreSQL sink: one
// session each). Every row is still stamped with the one captured
// version, and the stream still resumes at the capture, so the ranges'
// order does not matter (the overlap is absorbed by the version guard).
// Memory: up to ReadAhead chunks per range.
func (c *CatchUp) SetReaders(extra []tidemark.SnapshotSource) { c.readers = extra }

// The defaults of Config's zero fields.
const (
	// DefaultLookback is Lookback's default (fallback.lookback).
	DefaultLookback = 15 * time.Minute
	// DefaultChunkRows is ChunkRows' default (fallback.chunk_rows).
	DefaultChunkRows = 5000
	// DefaultReadAhead is ReadAhead's default.
	DefaultReadAhead = 2
	// DefaultKeyChunkRows is KeyChunkRows' default.
	DefaultKeyChunkRows = 10000
	// DefaultFutureTolerance is FutureTolerance's default
	// (fallback.future_tolerance).
	DefaultFutureTolerance = 5 * time.Minute
)

// Validate checks the config and fills in defaults; errors name the field.
func (cfg *Config) Validate() error {
	if cfg.Source == "" {
		return errors.New("fallback config: source: required")
	}
	if cfg.Lookback < 0 {
		return fmt.Errorf("fallback config: lookback: must be ≥ 0, got %s", cfg.Lookback)
	}
	if cfg.Lookback == 0 {
		cfg.Lookback = DefaultLookback
	}
	if cfg.ChunkRows < 0 || cfg.KeyChunkRows < 0 {
		return errors.New("fallback config: chunk_rows: must be ≥ 0")
	}
	if cfg.ChunkRows == 0 {
		cfg.ChunkRows = DefaultChunkRows
	}
	if cfg.ReadAhead < 0 {
		return fmt.Errorf("fallback config: read_ahead: must be ≥ 0, got %d", cfg.ReadAhead)
	}
	if cfg.ReadAhead == 0 {
		cfg.ReadAhead = DefaultReadAhead
	}
	if cfg.KeyChunkRows == 0 {
		cfg.KeyChunkRows = DefaultKeyChunkRows
	}
	if cfg.ProgressEvery < 0 {
		return fmt.Errorf("fallback config: progress_every: must be ≥ 0, got %s", cfg.ProgressEvery)
	}
	if cfg.ProgressEvery == 0 {
		cfg.ProgressEvery = tidemark.DefaultSnapshotProgressEvery
	}
	if cfg.FutureTolerance < 0 {
		return fmt.Errorf("fallback config: future_tolerance: must be ≥ 0, got %s", cfg.FutureTolerance)
	}
	if cfg.FutureTolerance == 0 {
		cfg.FutureTolerance = DefaultFutureTolerance
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	for name, tc := range cfg.Tables {
		if strings.Count(name, ".") != 1 {
			return fmt.Errorf("fallback config: tables: key %q must be db.table", name)
		}
		if tc.Column != "" {
			if err := tidemark.CheckIdentifier("fallback config: tables."+name+".column", tc.Column); err != nil {
				return err
			}
		}
		if tc.Lookback < 0 {
			return fmt.Errorf("fallback config: tables.%s.lookback: must be ≥ 0", name)
		}
		switch tc.DeleteDetection {
		case DeletesNone, DeletesKeyDiff:
		default:
			return fmt.Errorf("fallback config: tables.%s.delete_detection: must be %q or empty, got %q", name, DeletesKeyDiff, tc.DeleteDetection)
		}
	}
	return nil
}

// New validates cfg and returns a CatchUp. The key target lists the
// target's keys for delete detection (the PostgreSQL sink); by default the
// target itself when it can. It may be missing when no table is configured
// with delete_detection: keydiff. Deletes found are applied
// through target, so every sink behind it receives them.
func New(cfg Config, src tidemark.SnapshotSource, target Target, keyTargets ...tidemark.KeyTarget) (*CatchUp, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var keys tidemark.KeyTarget
	if len(keyTargets) > 0 {
		keys = keyTargets[0]
	} else if kt, ok := target.(tidemark.KeyTarget); ok {
		keys = kt
	}
	if src == nil || target == nil {
		return nil, errors.New("fallback: source and target are required")
	}
	if keys == nil {
		for name, tc := range cfg.Tables {
			if tc.DeleteDetection == DeletesKeyDiff {
				return nil, fmt.Errorf("fallback config: tables.%s.delete_detection: keydiff needs a PostgreSQL target to list keys", name)
			}
		}
	}
	return &CatchUp{cfg: cfg, src: src, target: target, keys: keys}, nil
}

// Run catches every table up and stores the captured position as the
// checkpoint, which it returns: streaming resumes there.
func (c *CatchUp) Run(ctx context.Context) (tidemark.Position, error) {
	rep, err := c.RunReport(ctx, nil)
	return rep.Snapshot.Position, err
}

// RunReport is Run with a report. only, when not empty, restricts the run
// to those tables and does not move the checkpoint (a manual catch-up of
// some tables while streaming runs elsewhere, or a resync: its caller
// encloses it and handles a *tidemark.TableError). A table that no longer
// exists when its turn comes (renamed or dropped after the capture; its
// report's Mode is "gone") is left out: the binlog carries the statement.
func (c *CatchUp) RunReport(ctx context.Context, only []tidemark.TableID) (Report, error) {
	if len(only) > 0 {
		return c.run(ctx, runPlan{only: only})
	}
	return c.run(ctx, runPlan{checkpoint: c.target})
}

// runPlan says what one catch-up run covers.
type runPlan struct {
	// only restricts the run to those tables, a catch-up of some tables
	// (a resync) that stores no checkpoint and is enclosed by its
	// caller. Empty: every table the source lists, but skip.
	only []tidemark.TableID
	skip map[tidemark.TableID]bool
	// quarantine, if set, takes a table the run cannot follow (a
	// *tidemark.TableError, or a *tidemark.ValueError of one table) out
	// of the run, which goes on with the next table; nil, the run stops
	// with the error.
	quarantine func(ctx context.Context, te *tidemark.TableError) error
	// checkpoint stores the captured position at the end (not with only).
	checkpoint tidemark.Sink
	// record, when set, records a first run's progress there (states: the
	// recorded states when the run began), and a first run resumes an
	// interrupted one's (firstrun.go).
	record tidemark.TableRegistry
	states []tidemark.TableState
}

// run is one catch-up: one capture, then each table in turn, then the
// checkpoint. Every table is read after the same capture, so that the
// stream resumes at one position that is before every read; a table left
// out of the middle of a run (quarantined, gone) changes nothing for the
// others.
func (c *CatchUp) run(ctx context.Context, plan runPlan) (Report, error) {
	start := time.Now()
	var rep Report
	// No checkpoint: a first-run snapshot. Rows the target already holds
	// of this source come from a first snapshot that did not finish (a
	// process killed during it): nothing after its capture was streamed,
	// so they are not trusted (first), unless the first run resumes the
	// interrupted one's recorded progress with its capture (firstrun.go).
	initial := false
	if len(plan.only) == 0 {
		_, has, err := c.target.Checkpoint(ctx, c.cfg.Source)
		if err != nil {
			return rep, fmt.Errorf("catch up %s: read checkpoint: %w", c.cfg.Source, err)
		}
		initial = !has
	}
	var snap tidemark.Snapshot
	var err error
	if initial && plan.record != nil && c.cfg.Boundaries == nil {
		if rep.firstRun, err = c.openFirstRun(ctx, plan.record, plan.states); err == nil {
			snap = rep.firstRun.snap
		}
	} else {
		snap, err = c.src.Capture(ctx)
	}
	if err != nil {
		return rep, fmt.Errorf("catch up %s: %w", c.cfg.Source, err)
	}
	rep.Snapshot = snap
	forgetTables(c.readers)
	if rep.firstRun != nil && rep.firstRun.resumed {
		// No capture cleared the schemas c.src cached either.
		forgetTables([]tidemark.SnapshotSource{c.src})
	}
	tables := plan.only
	if len(tables) == 0 {
		if tables, err = c.src.Tables(ctx); err != nil {
			return rep, fmt.Errorf("catch up %s: %w", c.cfg.Source, err)
		}
	}
	c.cfg.Logger.Info("catch-up started", "source", c.cfg.Source, "position", snap.Position.String(), "tables", len(tables), "first_run", initial)
	// A catch-up of some tables (a resync: tidemark.Resnapshot) is
	// enclosed by its caller, in the same boundaries (enclosed): its
	// full read is not enclosed again, and it finds the deleted rows.
	bound, enclosed := c.cfg.Boundaries, false
	if len(plan.only) > 0 {
		bound, enclosed = nil, c.cfg.Boundaries != nil
	}
	if c.tablesAtOnce(plan, tables) {
		if err := c.runTables(ctx, snap, tables, initial, bound, enclosed, plan, &rep); err != nil {
			return rep, err
		}
	} else {
		for _, id := range tables {
			if plan.skip[id] {
				continue
			}
			tr, err := c.table(ctx, snap, id, initial, bound, enclosed, rep.firstRun)
			if err := c.tableDone(ctx, id, tr, err, plan, &rep); err != nil {
				return rep, err
			}
		}
	}
	if plan.checkpoint != nil {
		b := &tidemark.Batch{Source: c.cfg.Source, Checkpoint: snap.Position}
		if _, err := plan.checkpoint.Apply(ctx, b); err != nil {
			return rep, fmt.Errorf("catch up %s: store checkpoint %s: %w", c.cfg.Source, snap.Position, err)
		}
	}
	rep.Took = time.Since(start)
	c.cfg.Logger.Info("catch-up finished", "source", c.cfg.Source, "resume_at", snap.Position.String(), "took", rep.Took.Round(time.Millisecond))
	return rep, nil
}

// tableDone records what the catch-up of one table ended with (tr, err)
// in rep: a table gone from the source is left out, a table the run cannot
// follow is quarantined (plan.quarantine), and any other error stops the
// run (returned).
func (c *CatchUp) tableDone(ctx context.Context, id tidemark.TableID, tr TableReport, err error, plan runPlan, rep *Report) error {
	if errors.Is(err, tidemark.ErrTableGone) && ctx.Err() == nil {
		// Listed after the capture, so the RENAME or DROP that took
		// it away is in the binlog after the position the stream
		// resumes at: the stream follows it (a table renamed into
		// the stream is snapshotted under its new name then).
		c.cfg.Logger.Info("table left out of the catch-up: it no longer exists on the source (renamed or dropped after the capture; the binlog carries the statement and the stream follows it)",
			"table", id.String(), "rows_read", tr.Rows, "err", err)
		tr.Mode = "gone"
		rep.Tables = append(rep.Tables, tr)
		return nil
	}
	if te := tableErrorOf(err); te != nil && plan.quarantine != nil && ctx.Err() == nil {
		return plan.quarantine(ctx, te)
	}
	rep.Tables = append(rep.Tables, tr)
	if err != nil {
		return fmt.Errorf("catch up %s: %w", id, err)
	}
	args := []any{"table", id.String(), "mode", tr.Mode, "rows", tr.Rows, "chunks", tr.Chunks,
		"inserted", tr.Applied.Inserted, "updated", tr.Applied.Updated, "skipped", tr.Applied.Skipped}
	if tr.BeyondUpper > 0 {
		args = append(args, "beyond_upper_bound", tr.BeyondUpper)
	}
	if tr.Undated > 0 {
		args = append(args, "undated_rows", tr.Undated)
	}
	if tr.DeletesChecked {
		args = append(args, "deletes", tr.Deletes)
	}
	if tr.Reason != "" {
		args = append(args, "reason", tr.Reason)
	}
	if tr.Resumed != "" {
		args = append(args, "resumed", tr.Resumed)
	}
	c.cfg.Logger.Info("table caught up", args...)
	return nil
}

// tableErrorOf returns the table a catch-up cannot follow, nil when err is
// not one table's: a *tidemark.TableError (no key, an unsupported type, a
// missing watermark column, rows violating a mirrored constraint), or a
// *tidemark.ValueError of one table (a value the reader cannot convert: a
// key DATETIME in a DST gap, zero_dates: error, text that is not UTF-8…),
// which is its table's problem as on the binlog path.
func tableErrorOf(err error) *tidemark.TableError {
	var te *tidemark.TableError
	var ve *tidemark.ValueError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &te):
		return te
	case errors.As(err, &ve) && ve.Table.Name != "":
		return &tidemark.TableError{Table: ve.Table, Err: ve}
	}
	return nil
}

func (c *CatchUp) tableConfig(id tidemark.TableID) TableConfig {
	tc := c.cfg.Tables[id.String()]
	if tc.Lookback == 0 {
		tc.Lookback = c.cfg.Lookback
	}
	return tc
}

// table catches one table up.
//
// Rows whose watermark column is NULL (or a zero date) have no time to bound
// them: a snapshot reads the whole table in key order whatever the column
// holds, and every window also reads the undated rows again (through the
// column's index: `column IS NULL OR column < '0001-01-01'`), so that an
// update to one of them during a gap is not lost. A column with no value in
// any row stores no watermark: the next catch-up reads the table in full
// again.
//
// A full read (no watermark column, or a table's first snapshot) into a
// target that already holds rows of the table is followed by a key diff
// whatever delete_detection says: the read carried every source row, and
// the diff removes the target rows it did not carry (deleted at the source
// while tidemark did not stream), so the table ends exactly as an
// uninterrupted load into an empty target would. In a first run (initial:
// no checkpoint) every table is read in full, a stored watermark
// notwithstanding: it belongs to a first snapshot that did not finish,
// whose capture position the stream never started from.
//
// Where the key diff cannot run because the target lists no keys, a full
// read into a target that may hold rows is enclosed in bound's snapshot
// boundaries instead (when set): the consumers remove the rows it did not
// carry.
//
// fr, when set, records the progress of a first run's full read, and
// resumes a table an interrupted first run recorded (resumeTable).
//
// A read that fails because the table's layout changed meanwhile (a RENAME
// or DROP COLUMN after the schema was read: the chunks' SELECT names a
// column the table no longer has) restarts from its first chunk with the
// layout read again (tableRead), as a schema change during a snapshot
// beside the stream does (docs/SNAPSHOTS.md); the other tables go on.
func (c *CatchUp) table(ctx context.Context, snap tidemark.Snapshot, id tidemark.TableID, initial bool, bound tidemark.SnapshotBoundary, enclosed bool, fr *firstRun) (TableReport, error) {
	var held *bool
	for restarts := 0; ; restarts++ {
		before, err := c.src.Table(ctx, id)
		if err != nil {
			return TableReport{Table: id}, err
		}
		tr, err := c.tableRead(ctx, snap, id, initial, bound, enclosed, fr, &held)
		if ctx.Err() != nil || errors.Is(err, tidemark.ErrTableGone) || errors.Is(err, tidemark.ErrRetriesExhausted) {
			// (A source that did not answer for the retries' time
			// would not answer the layout's query either: the error is
			// returned at once instead of after as long again.)
			return tr, err
		}
		// A read that succeeded may still have read rows of two layouts
		// (an ADD COLUMN … NOT NULL DEFAULT during it raises no error, and
		// a range read after it carries the new column while the rows
		// read before lack it, though the source now holds the default
		// in each): the layout is read again after every read, and a
		// changed one restarts the read as a failed read does.
		c.forget(id)
		after, aerr := c.src.Table(ctx, id)
		if aerr != nil {
			if errors.Is(aerr, tidemark.ErrTableGone) {
				return tr, aerr
			}
			if err == nil {
				return tr, fmt.Errorf("read the layout of %s after its read: %w", id, aerr)
			}
			return tr, err
		}
		if after.Fingerprint() == before.Fingerprint() {
			return tr, err
		}
		cause := err
		if cause == nil {
			cause = fmt.Errorf("the layout of %s changed while it was read", id)
		}
		if restarts == maxSchemaRestarts {
			return tr, fmt.Errorf("read %s: its schema changed during each of %d reads: %w", id, restarts+1, cause)
		}
		c.cfg.Logger.Warn("restarting the snapshot of a table from its first chunk", "table", id.String(),
			"reason", "schema change during its snapshot", "rows_read", tr.Rows, "err", cause)
		if fr != nil && held != nil && !*held {
			// Every row of the target table is the read's before: drop
			// it, so that the new layout's target is made from empty
			// (the older layout's rows lack a column added NOT NULL).
			if rerr := fr.reg.ResetTable(ctx, c.cfg.Source, id); rerr != nil {
				return tr, fmt.Errorf("reset %s before its snapshot restarts: %w", id, rerr)
			}
		}
		fr.restart(id)
	}
}

// maxSchemaRestarts bounds the restarts of one table's read for schema
// changes during it.
const maxSchemaRestarts = 5

// forget drops the schema of a table that every reader of the catch-up
// cached (the ranges of a read may run on any of them).
func (c *CatchUp) forget(id tidemark.TableID) {
	srcs := append([]tidemark.SnapshotSource{c.src}, c.readers...)
	if c.pool != nil {
		srcs = c.pool.srcs
	}
	for _, src := range srcs {
		if f, ok := src.(interface{ Forget(tidemark.TableID) }); ok {
			f.Forget(id)
		}
	}
}

// tableRead is one read of table (see table). *held is whether the target
// held rows of the table before the first read began: a read restarted
// after a schema change finds the rows of the read before it, which are
// this run's (read after the capture, every later change of them in the
// stream), and keeps the first read's answer.
func (c *CatchUp) tableRead(ctx context.Context, snap tidemark.Snapshot, id tidemark.TableID, initial bool, bound tidemark.SnapshotBoundary, enclosed bool, fr *firstRun, heldBefore **bool) (TableReport, error) {
	tr := TableReport{Table: id}
	tc := c.tableConfig(id)
	var wm *tidemark.Watermark
	req := tidemark.ReadRequest{Table: id, Limit: c.cfg.ChunkRows, Snapshot: snap}
	var tbl *tidemark.Table
	if fr != nil {
		var err error
		if tbl, err = c.src.Table(ctx, id); err != nil {
			return tr, err
		}
		if rec := fr.resumable(tbl); rec != nil {
			same, err := fr.sameTarget(ctx, tbl, rec)
			if err != nil {
				return tr, err
			}
			if same {
				return tr, c.resumeTable(ctx, snap, tbl, tc, rec, fr, &tr)
			}
			fr.restart(id)
		}
		if rec := fr.keyChanged(tbl); rec != nil && rec.Fresh && *heldBefore == nil {
			// The interrupted run created the target table with the
			// old key, and every row in it is that run's: drop it, so
			// the new key's target is made from empty, as a resync
			// would (its business key cannot change in place: the
			// table was quarantined, "business key changed"; nemesis
			// soak seed 343743032218, a DROP + CREATE with another key
			// after the capture).
			c.cfg.Logger.Warn("dropping the target table an interrupted first run made with the table's old key, before reading it again", "table", id.String(), "recorded_key", rec.Key, "key", keyNames(tbl))
			if err := fr.reg.ResetTable(ctx, c.cfg.Source, id); err != nil {
				return tr, fmt.Errorf("reset %s before its snapshot reads it again: %w", id, err)
			}
		}
	}
	if *heldBefore == nil {
		h, err := c.targetHeldRows(ctx, id, tc)
		if err != nil {
			return tr, err
		}
		*heldBefore = &h
	}
	held := **heldBefore
	fresh, err := c.targetFresh(ctx, fr, tbl)
	if err != nil {
		return tr, err
	}
	// fullDiff is the delete detection of a full read.
	fullDiff, err := c.fullReadDiff(ctx, id, tc, held, initial)
	if err != nil {
		return tr, err
	}
	if !held || fullDiff.DeleteDetection == DeletesKeyDiff || c.keys != nil {
		bound = nil // nothing to remove, or the key diff removes it
	}
	if tc.Column == "" {
		tr.Mode = "full"
		if err := c.deletesFindable(id, held, fullDiff, bound != nil || enclosed); err != nil {
			return tr, err
		}
		prog := fr.track(tbl, fullDiff.DeleteDetection == DeletesKeyDiff, fresh, nil, nil)
		if err := c.fullRead(ctx, snap, req, nil, &tr, initial, bound, prog); err != nil {
			return tr, err
		}
		return tr, c.endFullRead(ctx, snap, id, fullDiff, &tr, prog)
	}
	if err := c.checkColumn(ctx, id, tc.Column); err != nil {
		return tr, err
	}
	upper, dated, err := c.src.MaxTime(ctx, id, tc.Column)
	if err != nil {
		return tr, err
	}
	if dated {
		if limit := snap.ServerTime.Add(c.cfg.FutureTolerance); upper.After(limit) {
			n, err := c.src.CountAbove(ctx, id, tc.Column, limit)
			if err != nil {
				return tr, err
			}
			tr.BeyondUpper = n
			c.cfg.Logger.Warn("rows with far-future watermark values are beyond the captured upper bound; the watermark is clamped to the source clock + tolerance",
				"table", id.String(), "column", tc.Column, "rows", n, "max", upper, "bound", limit)
			upper = limit
		}
		tr.Upper = upper
		wm = &tidemark.Watermark{Table: id, Value: upper}
	}
	w, has, err := c.target.Watermark(ctx, c.cfg.Source, id)
	if err != nil {
		return tr, err
	}
	if initial {
		has = false
	}
	// A window cannot see the rows deleted in the gap. Where the target
	// holds rows of the table, a key diff finds them (delete_detection:
	// keydiff, or taken whenever the target lists keys and the key
	// columns allow it); where no key diff can run (the scale-out
	// tailer), the table is read in full between snapshot boundaries
	// instead, whose end removes the rows the read did not carry.
	windowDiff := tc
	if has && held && tc.DeleteDetection != DeletesKeyDiff {
		if windowDiff, err = c.fullReadDiff(ctx, id, tc, held, initial); err != nil {
			return tr, err
		}
		if windowDiff.DeleteDetection != DeletesKeyDiff {
			if bound == nil && !enclosed {
				return tr, c.deletesFindable(id, held, windowDiff, false)
			}
			has = false
			tr.Reason = "a window cannot see the rows deleted while the binlog was unavailable, and the target lists no keys to diff: read in full between snapshot boundaries"
		}
	}
	if !has {
		// First sight: a full snapshot in key order; the window
		// afterwards starts at the bound captured before reading.
		tr.Mode = "snapshot"
		if err := c.deletesFindable(id, held, fullDiff, bound != nil || enclosed); err != nil {
			return tr, err
		}
		prog := fr.track(tbl, fullDiff.DeleteDetection == DeletesKeyDiff, fresh, wm, nil)
		if err := c.fullRead(ctx, snap, req, wm, &tr, initial, bound, prog); err != nil {
			return tr, err
		}
		if tr.Rows == 0 {
			tr.Mode = "empty"
		} else if !dated {
			c.cfg.Logger.Warn("the watermark column is NULL (or a zero date) in every row: the table was read in full, and the next catch-up reads it in full again",
				"table", id.String(), "column", tc.Column, "rows", tr.Rows)
		}
		return tr, c.endFullRead(ctx, snap, id, fullDiff, &tr, prog)
	}
	tr.Mode = "window"
	undated := req
	undated.Column, undated.Undated = tc.Column, true
	if err := c.read(ctx, undated, nil, &tr, nil); err != nil {
		return tr, err
	}
	tr.Undated = tr.Rows
	if dated {
		tr.Lower = w.Add(-tc.Lookback)
		req.Column, req.Lower, req.Upper = tc.Column, tr.Lower, upper
		if err := c.read(ctx, req, wm, &tr, nil); err != nil {
			return tr, err
		}
	}
	return tr, c.keyDiff(ctx, snap, id, windowDiff, &tr)
}

// deletesFindable returns an error when a read into a target that holds
// rows of the table (held) is followed neither by a key diff (tc) nor
// enclosed in snapshot boundaries (bounded: its own or its caller's): rows deleted at the source while
// the binlog was unavailable would stay in the target, and nothing else
// finds them. Only a target without keys and without boundaries gets here
// (Kafka alone without control records), which keeps no table states: a
// quarantine would end with the process and the next start would stream
// the table past the gap, so the catch-up stops instead (the checkpoint
// stays before the gap).
func (c *CatchUp) deletesFindable(id tidemark.TableID, held bool, tc TableConfig, bounded bool) error {
	if !held || tc.DeleteDetection == DeletesKeyDiff || bounded {
		return nil
	}
	return fmt.Errorf("rows deleted at the source while the binlog was unavailable cannot be found: the target lists no keys to diff and takes no snapshot boundaries "+
		"(fallback.tables.%s.delete_detection: keydiff needs a PostgreSQL target; with Kafka alone set target.kafka.control_records: true, whose snapshot_end tells consumers to remove the rows a full read did not carry)", id)
}

// fullReadDiff returns tc with the delete detection a full read of the
// table needs: a key diff when the target holds rows of it (deleted source
// rows among them would stay otherwise) and the key diff can run (a target
// that lists keys, integer and text key columns). In a first run a table
// the key diff cannot clean is a *tidemark.TableError (quarantine; a
// resync empties the target table first) rather than a load that keeps
// deleted rows.
func (c *CatchUp) fullReadDiff(ctx context.Context, id tidemark.TableID, tc TableConfig, held, initial bool) (TableConfig, error) {
	if !held || tc.DeleteDetection == DeletesKeyDiff {
		return tc, nil
	}
	if c.keys == nil {
		return tc, nil // Kafka alone: no target rows to list
	}
	tbl, err := c.src.Table(ctx, id)
	if err != nil {
		return tc, err
	}
	for _, k := range tbl.Key {
		switch col := tbl.Columns[k]; col.Kind {
		case tidemark.KindInt, tidemark.KindUint, tidemark.KindText:
		default:
			why := "the target holds rows of a first snapshot that did not finish, and rows deleted at the source since"
			if !initial {
				why = "the target holds rows of the table, and rows deleted at the source while the binlog was unavailable"
			}
			return tc, &tidemark.TableError{Table: id, Err: fmt.Errorf("%s "+
				"cannot be found: the key diff (fallback.tables.%s.delete_detection: keydiff) supports integer and text keys, key column %q is %s; resync the table (it empties the target table first)", why, id, col.Name, col.Kind)}
		}
	}
	tc.DeleteDetection = DeletesKeyDiff
	return tc, nil
}

// targetFresh reports, for a first run's read of tbl (fr), whether the
// target held no rows of it when the run first read it (asked once per
// run: a read restarted after a schema change finds the first read's
// rows, which are the run's). The run's record keeps the answer
// (firstRunJSON.Fresh). False when the target cannot tell.
func (c *CatchUp) targetFresh(ctx context.Context, fr *firstRun, tbl *tidemark.Table) (bool, error) {
	if fr == nil || tbl == nil {
		return false, nil
	}
	fr.mu.Lock()
	f, ok := fr.fresh[tbl.ID]
	fr.mu.Unlock()
	if ok {
		return f, nil
	}
	tgt, ok := c.keys.(tidemark.TargetRows)
	if !ok && c.cfg.HeldRows != nil {
		tgt, ok = c.cfg.HeldRows, true
	}
	if !ok {
		return false, nil
	}
	has, err := tgt.HasRows(ctx, tbl)
	if err != nil {
		return false, err
	}
	fr.mu.Lock()
	if fr.fresh == nil {
		fr.fresh = map[tidemark.TableID]bool{}
	}
	fr.fresh[tbl.ID] = !has
	fr.mu.Unlock()
	return !has, nil
}

// targetHeldRows reports, before a table is read, whether the target holds
// rows of it that a hard delete in the gap could have left behind: not
// asked with delete detection (the key diff finds them), true when the
// target cannot tell.
func (c *CatchUp) targetHeldRows(ctx context.Context, id tidemark.TableID, tc TableConfig) (bool, error) {
	tgt, ok := c.keys.(tidemark.TargetRows)
	if !ok && c.cfg.HeldRows != nil {
		tgt, ok = c.cfg.HeldRows, true
	}
	if tc.DeleteDetection == DeletesKeyDiff || !ok {
		return true, nil
	}
	tbl, err := c.src.Table(ctx, id)
	if err != nil {
		return false, err
	}
	return tgt.HasRows(ctx, tbl)
}

// checkColumn refuses a watermark column that is not in the source table or
// is not a time: a *tidemark.TableError, which quarantines the table (the
// others go on) instead of failing every catch-up of the source.
func (c *CatchUp) checkColumn(ctx context.Context, id tidemark.TableID, column string) error {
	tbl, err := c.src.Table(ctx, id)
	if err != nil {
		return err
	}
	i := tbl.ColumnIndex(column)
	if i < 0 {
		return &tidemark.TableError{Table: id, Err: fmt.Errorf("watermark column %q (fallback.tables.%s.column) is not in the source table: dropped, renamed, or misspelt in the config", column, id)}
	}
	if k := tbl.Columns[i].Kind; k != tidemark.KindDateTime && k != tidemark.KindTimestamp {
		return &tidemark.TableError{Table: id, Err: fmt.Errorf("watermark column %q (fallback.tables.%s.column) is %s in the source table, want DATETIME or TIMESTAMP", column, id, k)}
	}
	return nil
}

// fullRead reads a whole table (req, wm as read takes them), enclosed in
// bound's snapshot boundaries when bound is set: the end boundary carries
// the version the rows are stamped with, and the consumers remove the
// table's rows older than it (the ones the read did not carry).
func (c *CatchUp) fullRead(ctx context.Context, snap tidemark.Snapshot, req tidemark.ReadRequest, wm *tidemark.Watermark, tr *TableReport, initial bool, bound tidemark.SnapshotBoundary, prog *tableProgress) error {
	if bound == nil {
		return c.read(ctx, req, wm, tr, prog)
	}
	reason := "full re-read after the binlog was unavailable (rows deleted meanwhile are removed at the end)"
	if initial {
		reason = "first-run snapshot (rows of an earlier one that did not finish and are gone from the source are removed at the end)"
	}
	if err := bound.BeginSnapshot(ctx, c.cfg.Source, req.Table, reason); err != nil {
		return fmt.Errorf("begin snapshot of %s: %w", req.Table, err)
	}
	if err := c.read(ctx, req, wm, tr, nil); err != nil {
		return err
	}
	if err := bound.EndSnapshot(ctx, c.cfg.Source, req.Table, snap.Version); err != nil {
		return fmt.Errorf("end snapshot of %s: %w", req.Table, err)
	}
	return nil
}

// read reads req to the end, chunk by chunk, applying each; wm, if set,
// commits with the last chunk. A full read with extra readers (SetReaders)
// reads the table's key ranges at once (readParallel). prog, when set,
// records the read's progress (a first run), and resumes the ranges it
// holds.
func (c *CatchUp) read(ctx context.Context, req tidemark.ReadRequest, wm *tidemark.Watermark, tr *TableReport, prog *tableProgress) error {
	if prog != nil && prog.resumed {
		return c.readParallel(ctx, req, slices.Clone(prog.ranges), wm, tr, prog)
	}
	ranges := []tidemark.SnapshotRange{{}}
	if req.Column == "" && (len(c.readers) > 0 || c.pool != nil) {
		var err error
		if ranges, err = splitTable(ctx, c.src, req.Table, c.readerCount()); err != nil {
			return fmt.Errorf("split %s for a parallel read: %w", req.Table, err)
		}
	}
	if prog != nil {
		if err := prog.begin(ctx, ranges); err != nil {
			return err
		}
	}
	if len(ranges) > 1 || prog != nil {
		return c.readParallel(ctx, req, ranges, wm, tr, prog)
	}
	return c.readRange(ctx, c.src, req, wm, tr, nil, nil, nil)
}

// readParallel reads the ranges not done, each after its cursor, applying
// their chunks as they come: with the pool's free workers (tables at once)
// or with the readers (c.src first, then c.readers), each reading one
// range at a time (a resumed read may have more ranges than readers); wm
// commits once every range is in. prog, when set, records each range's
// progress.
func (c *CatchUp) readParallel(ctx context.Context, req tidemark.ReadRequest, ranges []tidemark.SnapshotRange, wm *tidemark.Watermark, tr *TableReport, prog *tableProgress) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var todo []int
	for i, r := range ranges {
		if !r.Done {
			todo = append(todo, i)
		}
	}
	var mu sync.Mutex
	errs := make([]error, len(ranges))
	// first is the error of the range that failed first: the others'
	// errors after it are its consequence (the cancel ends their reads
	// mid-retry, with the last error they saw, not context.Canceled).
	var first error
	readOne := func(k int, src tidemark.SnapshotSource) {
		i := todo[k]
		rq := req
		rq.KeyFrom, rq.KeyTo, rq.After = ranges[i].From, ranges[i].To, ranges[i].After
		var applied func(next []any) error
		var fresh func() bool
		if prog != nil {
			applied = func(next []any) error { return prog.advance(ctx, i, next) }
			fresh = prog.freshLoad
		}
		if errs[i] = c.readRange(ctx, src, rq, nil, tr, &mu, applied, fresh); errs[i] != nil {
			mu.Lock()
			if first == nil && ctx.Err() == nil {
				first = errs[i]
			}
			mu.Unlock()
			cancel()
		}
	}
	switch {
	case len(todo) == 0:
	case c.pool != nil:
		c.pool.share(ctx, c.src, len(todo), readOne)
	default:
		srcs := append([]tidemark.SnapshotSource{c.src}, c.readers...)
		next := make(chan int, len(todo))
		for k := range todo {
			next <- k
		}
		close(next)
		var wg sync.WaitGroup
		for _, src := range srcs[:min(len(srcs), len(todo))] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := range next {
					if readOne(k, src); ctx.Err() != nil {
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	if first != nil {
		return first
	}
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if wm != nil {
		if _, err := c.target.Apply(ctx, &tidemark.Batch{Source: c.cfg.Source, Watermarks: []tidemark.Watermark{*wm}}); err != nil {
			return err
		}
	}
	if c.cfg.Progress != nil {
		c.cfg.Progress(Progress{Table: tr.Table, Rows: tr.Rows, Chunks: tr.Chunks, Done: true, BeyondUpper: tr.BeyondUpper})
	}
	if len(ranges) > 1 {
		c.cfg.Logger.Info("table read in parallel key ranges", "table", req.Table.String(), "ranges", len(ranges), "readers", c.readerCount())
	}
	return nil
}

// readRange reads req to the end from src, chunk by chunk, applying each;
// wm, if set, commits with the last chunk. With mu (a range of a parallel
// read) tr is updated under it, and the progress never says done.
// applied, if set, is called after each chunk is applied with the
// range's cursor after it (nil after its last chunk). fresh, if set,
// tells whether a chunk's batch is a fresh load's (tidemark.Batch.FreshLoad,
// tableProgress.freshLoad), asked at each chunk.
func (c *CatchUp) readRange(ctx context.Context, src tidemark.SnapshotSource, req tidemark.ReadRequest, wm *tidemark.Watermark, tr *TableReport, mu *sync.Mutex, applied func(next []any) error, fresh func() bool) error {
	type chunk struct {
		res  tidemark.ReadResult
		took time.Duration
		err  error
	}
	lock := func() {}
	unlock := lock
	if mu != nil {
		lock, unlock = mu.Lock, mu.Unlock
	}
	ctx, cancel := context.WithCancel(ctx)
	chunks := make(chan chunk, c.cfg.ReadAhead-1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(chunks)
		for {
			t0 := time.Now()
			res, err := src.Read(ctx, req)
			select {
			case chunks <- chunk{res: res, took: time.Since(t0), err: err}:
			case <-ctx.Done():
				return
			}
			if err != nil || res.Next == nil {
				return
			}
			req.After = res.Next
		}
	}()
	defer func() {
		cancel()
		<-done
	}()
	for ch := range chunks {
		lock()
		tr.ReadTime += ch.took
		unlock()
		if ch.err != nil {
			return ch.err
		}
		res := ch.res
		lock()
		tr.Rows += int64(len(res.Changes))
		tr.Chunks++
		unlock()
		b := &tidemark.Batch{Source: c.cfg.Source, Changes: res.Changes, FreshLoad: fresh != nil && fresh()}
		last := res.Next == nil
		if last && wm != nil {
			// The watermark commits with the window's last chunk.
			b.Watermarks = []tidemark.Watermark{*wm}
		}
		if len(b.Changes) > 0 || len(b.Watermarks) > 0 {
			t0 := time.Now()
			st, err := c.target.Apply(ctx, b)
			lock()
			tr.ApplyTime += time.Since(t0)
			unlock()
			if err != nil {
				return err
			}
			lock()
			tr.Applied.Add(st)
			unlock()
		}
		if applied != nil {
			if err := applied(res.Next); err != nil {
				return err
			}
		}
		if c.cfg.Progress != nil {
			lock()
			c.cfg.Progress(Progress{Table: tr.Table, Rows: tr.Rows, Chunks: tr.Chunks, Done: last && mu == nil, BeyondUpper: tr.BeyondUpper})
			unlock()
		}
		if last {
			return nil
		}
	}
	return ctx.Err()
}

// endFullRead ends a full read: the key diff tc asks for, then the first
// run's record of the table as done (prog, when set).
func (c *CatchUp) endFullRead(ctx context.Context, snap tidemark.Snapshot, id tidemark.TableID, tc TableConfig, tr *TableReport, prog *tableProgress) error {
	if err := c.keyDiff(ctx, snap, id, tc, tr); err != nil {
		return err
	}
	if prog == nil {
		return nil
	}
	return prog.done(ctx)
}

// resumeTable goes on with a table an interrupted first run recorded, with
// its capture (snap): nothing when it was done; otherwise each range not
// done is read after its cursor, committing the recorded watermark, and
// the recorded key diff follows. The table's target held rows of the
// interrupted run only (or its key diff was recorded): every change of
// them after the capture is in the stream that resumes there.
func (c *CatchUp) resumeTable(ctx context.Context, snap tidemark.Snapshot, tbl *tidemark.Table, tc TableConfig, rec *firstRunRecord, fr *firstRun, tr *TableReport) error {
	tr.Mode = "snapshot"
	if tc.Column == "" {
		tr.Mode = "full"
	}
	if rec.Done {
		tr.Resumed = "done"
		return nil
	}
	tr.Resumed = "ranges"
	var wm *tidemark.Watermark
	if rec.Upper != "" {
		upper, err := time.Parse(time.RFC3339Nano, rec.Upper)
		if err != nil {
			return fmt.Errorf("resume the first-run snapshot of %s: watermark %q: %w", tbl.ID, rec.Upper, err)
		}
		wm, tr.Upper = &tidemark.Watermark{Table: tbl.ID, Value: upper}, upper
	}
	diff := tc
	if rec.KeyDiff {
		diff.DeleteDetection = DeletesKeyDiff
	}
	prog := fr.track(tbl, rec.KeyDiff, rec.Fresh, wm, rec)
	req := tidemark.ReadRequest{Table: tbl.ID, Limit: c.cfg.ChunkRows, Snapshot: snap}
	if err := c.read(ctx, req, wm, tr, prog); err != nil {
		return err
	}
	return c.endFullRead(ctx, snap, tbl.ID, diff, tr, prog)
}

// keyDiff finds keys present in the target but not in the source and
// deletes them (stamped with the snapshot version, so a re-insert streamed
// later wins).
func (c *CatchUp) keyDiff(ctx context.Context, snap tidemark.Snapshot, id tidemark.TableID, tc TableConfig, tr *TableReport) error {
	if tc.DeleteDetection != DeletesKeyDiff {
		return nil
	}
	tr.DeletesChecked = true
	tbl, err := c.src.Table(ctx, id)
	if err != nil {
		return err
	}
	same, err := c.sameKeys(ctx, id, tbl)
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		// One statement over the whole table may outlast
		// source.query_timeout on a very big table (a billion keys):
		// the chunk pass, of bounded statements, decides instead.
		c.cfg.Logger.Warn("the whole-table key checksum failed; comparing the keys chunk by chunk", "table", id.String(), "err", err)
	case same:
		return nil
	}
	var after []any
	for {
		kc, err := c.src.KeyChunk(ctx, id, after, c.cfg.KeyChunkRows)
		if err != nil {
			return err
		}
		upTo := kc.Last // nil on the last chunk: to the end of the target
		ts, err := c.keys.KeyRangeSum(ctx, tbl, after, upTo)
		if err != nil {
			return err
		}
		if ts != kc.Sum {
			keys, err := c.keys.KeysInRange(ctx, tbl, after, upTo)
			if err != nil {
				return err
			}
			have := make(map[string]bool, len(kc.Keys))
			for _, k := range kc.Keys {
				have[keyString(k)] = true
			}
			var dels []tidemark.Change
			for _, k := range keys {
				if have[keyString(k)] {
					continue
				}
				before, err := keyRow(tbl, k)
				if err != nil {
					return err
				}
				dels = append(dels, tidemark.Change{Op: tidemark.OpDelete, Table: tbl, Before: before, KeyOnly: true,
					Version: snap.Version, CommitTime: snap.ServerTime, Size: 128})
			}
			if len(dels) > 0 {
				st, err := c.target.Apply(ctx, &tidemark.Batch{Source: c.cfg.Source, Changes: dels})
				if err != nil {
					return err
				}
				tr.Deletes += int64(st.Deleted)
				tr.Applied.Add(st)
			}
		}
		if kc.Last == nil {
			return nil
		}
		after = kc.Last
	}
}

// sameKeys compares the checksum of all the source's keys with the
// target's, both computed by their server (no key leaves either) and at
// the same time. Equal, the key sets are equal but with the probability of
// a 60-bit hash collision (see tidemark.KeySum): the diff is done without
// listing a key, which is the usual catch-up, where nothing was
// hard-deleted. Different, the chunk pass finds the chunks that differ.
func (c *CatchUp) sameKeys(ctx context.Context, id tidemark.TableID, tbl *tidemark.Table) (bool, error) {
	var (
		src    tidemark.KeySum
		srcErr error
		wg     sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		src, srcErr = c.src.KeyRangeSum(ctx, id, nil, nil)
	}()
	tgt, err := c.keys.KeyRangeSum(ctx, tbl, nil, nil)
	wg.Wait()
	if srcErr != nil {
		return false, srcErr
	}
	if err != nil {
		return false, err
	}
	return src == tgt, nil
}

// keyString is the canonical text of a key on either side.
func keyString(k []any) string {
	parts := make([]string, len(k))
	for i, v := range k {
		switch x := v.(type) {
		case string:
			parts[i] = x
		case []byte:
			parts[i] = string(x)
		default:
			parts[i] = fmt.Sprint(x)
		}
	}
	return strings.Join(parts, "\x00")
}

// keyRow builds a delete's before image from a target key (text values):
// the key columns typed as the source schema says, other columns NULL (the
// change is KeyOnly: they are unknown, and a soft-deleting sink keeps its
// own).
func keyRow(t *tidemark.Table, key []any) ([]any, error) {
	row := make([]any, len(t.Columns))
	for i, ci := range t.Key {
		s := keyString([]any{key[i]})
		switch t.Columns[ci].Kind {
		case tidemark.KindInt:
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("key diff of %s: key %s = %q: %w", t.ID, t.Columns[ci].Name, s, err)
			}
			row[ci] = n
		case tidemark.KindUint:
			n, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("key diff of %s: key %s = %q: %w", t.ID, t.Columns[ci].Name, s, err)
			}
			row[ci] = n
		default:
			row[ci] = s
		}
	}
	return row, nil
}

// SortReport orders a report's tables by name (for stable output).
func SortReport(r *Report) {
	sort.Slice(r.Tables, func(i, j int) bool { return r.Tables[i].Table.String() < r.Tables[j].Table.String() })
}
