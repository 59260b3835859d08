package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"tidemark"
	"tidemark/fallback"
	"tidemark/sink/postgres"
)

// The scale-out tailer (tailerTarget) keeps table states in PostgreSQL
// like `tidemark run` does, so that a resync (requested from a running
// tailer, or run by `tidemark resync` while none runs) and the backfill
// after an ALTER TABLE re-snapshot a table for the appliers: the snapshot's
// rows go to Kafka between a begin and an end boundary
// (tidemark.SnapshotBoundary), and at the end boundary each partition's
// applier removes the target rows the snapshot did not carry. The target
// table itself belongs to the appliers: the tailer never drops or creates
// it.

var (
	_ fallback.Registry         = tailerTarget{}
	_ tidemark.SnapshotBoundary = tailerTarget{}
	_ tidemark.Clock            = tailerTarget{}
)

// resetTables are the tables whose watermark the tailer ignores until
// their snapshot ends, so that the snapshot reads them in full.
type resetTables struct {
	mu  sync.Mutex
	ids map[tidemark.TableID]bool
}

func (r *resetTables) set(id tidemark.TableID, on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if on {
		r.ids[id] = true
	} else {
		delete(r.ids, id)
	}
}

func (r *resetTables) has(id tidemark.TableID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ids[id]
}

// Apply implements tidemark.Sink: the batch goes to Kafka, unless a table
// of it has a name the appliers' PostgreSQL target cannot hold (a system
// column name, the _tm_ prefix, more than 63 bytes): that is a
// *tidemark.TableError, which quarantines the table here, before any of
// its changes is published (an applier would stop at it, every member in
// turn).
func (t tailerTarget) Apply(ctx context.Context, b *tidemark.Batch) (tidemark.ApplyStats, error) {
	var last *tidemark.Table
	for i := range b.Changes {
		if tb := b.Changes[i].Table; tb != nil && tb != last {
			if err := postgres.CheckNames(tb, t.schema); err != nil {
				return tidemark.ApplyStats{}, err
			}
			last = tb
		}
	}
	return t.Sink.Apply(ctx, b)
}

// TableStates implements tidemark.TableRegistry with the states stored in
// PostgreSQL (the lock's sink).
func (t tailerTarget) TableStates(ctx context.Context, source string) ([]tidemark.TableState, error) {
	return t.lock.TableStates(ctx, source)
}

// SetTableState implements tidemark.TableRegistry.
func (t tailerTarget) SetTableState(ctx context.Context, source string, st tidemark.TableState) error {
	return t.lock.SetTableState(ctx, source, st)
}

// SwapTableState implements tidemark.TableRegistry.
func (t tailerTarget) SwapTableState(ctx context.Context, source string, old tidemark.TableMode, st tidemark.TableState) (bool, error) {
	return t.lock.SwapTableState(ctx, source, old, st)
}

// HasTable implements tidemark.TableRegistry: always true. The tailer
// publishes a table from its first change (after the first start's
// catch-up, which publishes every table); the appliers' target tables lag
// behind and cannot tell whether a table was published, so a table seen
// for the first time is not snapshotted again.
func (t tailerTarget) HasTable(context.Context, tidemark.TableID) (bool, error) { return true, nil }

// ResetTable implements tidemark.TableRegistry for a snapshot: the table's
// watermark is ignored until the snapshot ends, so the snapshot reads it in
// full. The target table is left to the appliers (the snapshot's end
// boundary removes the rows it did not carry).
func (t tailerTarget) ResetTable(_ context.Context, _ string, id tidemark.TableID) error {
	t.resets.set(id, true)
	return nil
}

// EnsureTable implements tidemark.TableRegistry: nothing to do; the
// appliers create a target table from the schema record before its first
// row (an empty table gets none).
func (t tailerTarget) EnsureTable(context.Context, *tidemark.Table) error { return nil }

// MirrorIndexes implements tidemark.IndexMirror: nothing to do (the
// appliers' target tables get no mirrored indexes).
func (t tailerTarget) MirrorIndexes(context.Context, tidemark.TableID, []tidemark.Index) error {
	return nil
}

// BeginSnapshot implements tidemark.SnapshotBoundary (the Kafka sink's).
func (t tailerTarget) BeginSnapshot(ctx context.Context, source string, id tidemark.TableID, reason string) error {
	if t.snap == nil {
		return errors.New("begin snapshot: the tailer's sink is not the Kafka sink")
	}
	return t.snap.BeginSnapshot(ctx, source, id, reason)
}

// EndSnapshot implements tidemark.SnapshotBoundary; the table's watermark
// counts again.
func (t tailerTarget) EndSnapshot(ctx context.Context, source string, id tidemark.TableID, v tidemark.Version) error {
	if t.snap == nil {
		return errors.New("end snapshot: the tailer's sink is not the Kafka sink")
	}
	if err := t.snap.EndSnapshot(ctx, source, id, v); err != nil {
		return err
	}
	t.resets.set(id, false)
	return nil
}

// Now returns PostgreSQL's clock (the table states' time).
func (t tailerTarget) Now(ctx context.Context) (time.Time, error) { return t.lock.Now(ctx) }

// resyncRenamed requests a resync of each table whose columns an ALTER
// TABLE of events renamed. A schema record carries the new layout, not the
// rename: the appliers add the new column (NULL in the rows they have) and
// keep the old one, so the table is snapshotted again, between boundaries,
// as soon as the pipeline looks at its states (pendingSnapshots); the
// rename's rows stream meanwhile. The request is recorded before the
// events are published, so a crash in between still resyncs.
func (t tailerTarget) resyncRenamed(ctx context.Context, source string, events []tidemark.DDLEvent) error {
	for _, ev := range events {
		if ev.Op != tidemark.DDLAlterTable || len(ev.Renames) == 0 {
			continue
		}
		st := tidemark.TableState{Table: ev.Table, Mode: tidemark.TableResyncRequested,
			Reason: fmt.Sprintf("column %s renamed to %s: the appliers get the renamed column's values from a snapshot", ev.Renames[0].From, ev.Renames[0].To)}
		if err := t.lock.SetTableState(ctx, source, st); err != nil {
			return fmt.Errorf("request resync of %s after a column rename: %w", ev.Table, err)
		}
	}
	return nil
}
