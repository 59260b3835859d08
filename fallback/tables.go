package fallback

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"tidemark"
)

// Registry is a target that keeps per-table replication state and mirrors
// the source's secondary indexes (the PostgreSQL sink). A catch-up that
// honours table states (RunStreaming, Snapshotter) needs one; a target
// without one (Kafka alone) is caught up with RunReport.
type Registry interface {
	tidemark.TableRegistry
	tidemark.IndexMirror
}

// Snapshotter returns the pipeline's tidemark.SnapshotFunc: the catch-up of
// just those tables (it does not move the checkpoint), stamping rows with
// the captured version. A table that has no rows gets its empty target
// table; a table that no longer exists in the source (also one renamed or
// dropped during the read) has nothing to snapshot (its target was dropped
// by the caller; the stream carries the statement that took it away). The secondary indexes
// (idx, the source's) are mirrored once the rows are in; a constraint the
// rows violate fails the snapshot, and the pipeline quarantines the table.
// report, if set, receives each run's report.
func (c *CatchUp) Snapshotter(idx tidemark.IndexLister, reg Registry, report func(Report)) tidemark.SnapshotFunc {
	return func(ctx context.Context, tables []tidemark.TableID) (tidemark.Version, error) {
		present, err := c.src.Tables(ctx)
		if err != nil {
			return tidemark.Version{}, err
		}
		var only []tidemark.TableID
		for _, id := range tables {
			if slices.Contains(present, id) {
				only = append(only, id)
			}
		}
		if len(only) == 0 {
			snap, err := c.src.Capture(ctx)
			return snap.Version, err
		}
		rep, err := c.RunReport(ctx, only)
		if report != nil {
			report(rep)
		}
		if err != nil {
			return tidemark.Version{}, err
		}
		for _, tr := range rep.Tables {
			if tr.Rows > 0 || tr.Mode == "gone" {
				continue
			}
			t, err := c.src.Table(ctx, tr.Table)
			if err != nil {
				return tidemark.Version{}, err
			}
			if err := reg.EnsureTable(ctx, t); err != nil {
				return tidemark.Version{}, err
			}
		}
		for _, tr := range rep.Tables {
			if tr.Mode == "gone" {
				continue
			}
			if err := mirrorIndexes(ctx, idx, reg, tr.Table); err != nil {
				return tidemark.Version{}, err
			}
		}
		return rep.Snapshot.Version, nil
	}
}

// RunStreaming is the automatic catch-up (first start, purged position)
// without the tables that are not streaming: a quarantined table's changes
// are skipped until it is resynced, and reading it could only fail on the
// schema change that quarantined it. A table the run finds it cannot
// follow (a *tidemark.TableError: no primary key and no business_keys, an
// unsupported type, a missing watermark column…) is quarantined in reg,
// with one log line naming it, the reason and the way back, and the run
// goes on with the next table — after the same capture, as a first run
// still (every table read in full), so the other tables end exactly as
// without it. After the rows, the secondary indexes (idx, the source's)
// are mirrored; a table whose rows violate a mirrored constraint is
// quarantined too.
//
// Like a catch-up of every table it stores the captured position as the
// checkpoint, after the mirroring, through checkpoint (the pipeline's
// target, so that with a fan-out every sink moves).
//
// With a nil reg (a target without table states: Kafka alone) a table the
// run cannot follow is left out the same way and logged; the stream
// quarantines it (for the process's life, as every quarantine without
// table states) when its rows arrive.
func (c *CatchUp) RunStreaming(ctx context.Context, idx tidemark.IndexLister, reg Registry, checkpoint tidemark.Sink) (Report, error) {
	source, log := c.cfg.Source, c.cfg.Logger
	skip := map[tidemark.TableID]bool{}
	if reg != nil {
		states, err := reg.TableStates(ctx, source)
		if err != nil {
			return Report{}, err
		}
		for _, st := range states {
			if st.Mode != tidemark.TableStreaming {
				skip[st.Table] = true
				log.Warn("catch-up leaves out a table that is not streaming", "table", st.Table.String(), "state", string(st.Mode), "reason", st.Reason)
			}
		}
	}
	var tr tidemark.TableRegistry
	if reg != nil {
		tr = reg
	}
	quarantine := func(ctx context.Context, te *tidemark.TableError) error {
		return c.quarantine(ctx, te, tr, skip)
	}
	rep, err := c.run(ctx, runPlan{skip: skip, quarantine: quarantine})
	if err != nil {
		return rep, err
	}
	if reg != nil {
		if err := c.mirrorAfterLoad(ctx, rep, idx, reg, skip); err != nil {
			return rep, err
		}
	}
	if _, err := checkpoint.Apply(ctx, &tidemark.Batch{Source: source, Checkpoint: rep.Snapshot.Position}); err != nil {
		return rep, fmt.Errorf("catch up %s: store checkpoint %s: %w", source, rep.Snapshot.Position, err)
	}
	return rep, nil
}

// mirrorIndexes mirrors the source's current secondary indexes of a table
// onto its target (a no-op when they are already there).
func mirrorIndexes(ctx context.Context, idx tidemark.IndexLister, reg tidemark.IndexMirror, id tidemark.TableID) error {
	ix, err := idx.Indexes(ctx, id)
	if err != nil {
		return err
	}
	if err := reg.MirrorIndexes(ctx, id, ix); err != nil {
		return fmt.Errorf("mirror the indexes of %s: %w", id, err)
	}
	return nil
}

// mirrorAfterLoad mirrors the indexes of the tables a catch-up loaded. A
// table whose rows violate a mirrored constraint is quarantined.
func (c *CatchUp) mirrorAfterLoad(ctx context.Context, rep Report, idx tidemark.IndexLister, reg Registry, skip map[tidemark.TableID]bool) error {
	for _, tr := range rep.Tables {
		if skip[tr.Table] || tr.Mode == "gone" {
			continue
		}
		err := mirrorIndexes(ctx, idx, reg, tr.Table)
		if te := tableErrorOf(err); te != nil && !skip[te.Table] {
			if err := c.quarantine(ctx, te, reg, skip); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// quarantine records te's table as quarantined in reg (when there is
// one: without, the quarantine lasts for this run) and adds it to skip,
// with one log line naming the table, why, and the way back.
func (c *CatchUp) quarantine(ctx context.Context, te *tidemark.TableError, reg tidemark.TableRegistry, skip map[tidemark.TableID]bool) error {
	c.cfg.Logger.Error("table quarantined: its changes are skipped from now on; the other tables continue. Resync it with `tidemark resync --table "+te.Table.String()+"` once the cause is fixed",
		"table", te.Table.String(), "reason", te.Err.Error())
	skip[te.Table] = true
	if reg == nil {
		return nil
	}
	st := tidemark.TableState{Table: te.Table, Mode: tidemark.TableQuarantined, Reason: te.Err.Error()}
	if err := reg.SetTableState(ctx, c.cfg.Source, st); err != nil {
		return fmt.Errorf("quarantine %s: %w", te.Table, err)
	}
	return nil
}

// Chunks returns the pipeline's tidemark.ChunkSnapshotter (snapshots
// beside the stream): chunks of ChunkRows rows in key order, read from src
// after a capture and stamped with its version; at the end the target
// table is created if the table had no rows, and the source's secondary
// indexes (idx) are mirrored onto it. src and idx must be used by nothing
// else (a reader of its own: its chunks are read while the pipeline uses
// the catch-up's reader); the calls are serialized.
func (c *CatchUp) Chunks(src tidemark.SnapshotSource, idx tidemark.IndexLister, reg Registry) tidemark.ChunkSnapshotter {
	return &chunks{chunkRows: c.cfg.ChunkRows, src: src, idx: idx, reg: reg}
}

type chunks struct {
	chunkRows int
	src       tidemark.SnapshotSource
	idx       tidemark.IndexLister
	reg       Registry

	mu sync.Mutex // one statement at a time on src
}

// Chunkable implements tidemark.ChunkSnapshotter.
func (s *chunks) Chunkable(ctx context.Context, id tidemark.TableID) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	present, err := s.src.Tables(ctx)
	if err != nil || !slices.Contains(present, id) {
		return false, err
	}
	t, err := s.src.Table(ctx, id)
	if errors.Is(err, tidemark.ErrTableGone) {
		return false, nil // gone since the listing: nothing to read in chunks
	}
	if err != nil {
		return false, err
	}
	return len(t.Key) > 0, nil
}

// Capture implements tidemark.ChunkSnapshotter.
func (s *chunks) Capture(ctx context.Context) (tidemark.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.src.Capture(ctx)
}

// ReadChunk implements tidemark.ChunkSnapshotter.
func (s *chunks) ReadChunk(ctx context.Context, id tidemark.TableID, after []any, snap tidemark.Snapshot) ([]tidemark.Change, []any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	res, err := s.src.Read(ctx, tidemark.ReadRequest{Table: id, After: after, Limit: s.chunkRows, Snapshot: snap})
	if err != nil {
		return nil, nil, err
	}
	return res.Changes, res.Next, nil
}

// FinishSnapshot implements tidemark.ChunkSnapshotter.
func (s *chunks) FinishSnapshot(ctx context.Context, id tidemark.TableID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, err := s.src.Table(ctx, id)
	if err != nil {
		return err
	}
	if err := s.reg.EnsureTable(ctx, t); err != nil {
		return err
	}
	return mirrorIndexes(ctx, s.idx, s.reg, id)
}
