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
		after, err := c.highWatermark(ctx, reg, rep.Snapshot.Position)
		if err != nil {
			return tidemark.Version{}, err
		}
		for _, tr := range rep.Tables {
			if tr.Mode == "gone" {
				continue
			}
			if err := mirrorIndexes(ctx, idx, reg, tr.Table, c.cfg.Source, after); err != nil {
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
//
// A first run (no checkpoint) with a reg records its progress there and
// resumes an interrupted one's (firstrun.go); its tables are recorded
// streaming from the capture's version before the checkpoint is stored.
// The scale-out tailer's first run (Boundaries) records nothing and is
// redone after an interruption.
func (c *CatchUp) RunStreaming(ctx context.Context, idx tidemark.IndexLister, reg Registry, checkpoint tidemark.Sink) (Report, error) {
	source, log := c.cfg.Source, c.cfg.Logger
	skip := map[tidemark.TableID]bool{}
	plan := runPlan{skip: skip}
	if reg != nil {
		states, err := reg.TableStates(ctx, source)
		if err != nil {
			return Report{}, err
		}
		_, resumed, err := c.target.Checkpoint(ctx, source)
		if err != nil {
			return Report{}, fmt.Errorf("catch up %s: read checkpoint: %w", source, err)
		}
		for _, st := range states {
			if st.Mode != tidemark.TableStreaming && (resumed || !isFirstRunRecord(st)) {
				skip[st.Table] = true
				log.Warn("catch-up leaves out a table that is not streaming", "table", st.Table.String(), "state", string(st.Mode), "reason", st.Reason)
			}
		}
		plan.record, plan.states = reg, states
	}
	var tr tidemark.TableRegistry
	if reg != nil {
		tr = reg
	}
	plan.quarantine = func(ctx context.Context, te *tidemark.TableError) error {
		return c.quarantine(ctx, te, tr, skip)
	}
	rep, err := c.run(ctx, plan)
	if err != nil {
		return rep, err
	}
	if reg != nil {
		if err := c.mirrorAfterLoad(ctx, rep, idx, reg, skip); err != nil {
			return rep, err
		}
	}
	if err := rep.firstRun.finish(ctx); err != nil {
		return rep, err
	}
	if _, err := checkpoint.Apply(ctx, &tidemark.Batch{Source: source, Checkpoint: rep.Snapshot.Position}); err != nil {
		return rep, fmt.Errorf("catch up %s: store checkpoint %s: %w", source, rep.Snapshot.Position, err)
	}
	return rep, nil
}

// mirrorIndexes mirrors the source's current secondary indexes of a table
// onto its target (a no-op when they are already there). With a non-zero
// after (highWatermark) the unique constraints a load dropped wait until
// the stream of source has applied past it (tidemark.IndexMirrorAfter).
func mirrorIndexes(ctx context.Context, idx tidemark.IndexLister, reg tidemark.IndexMirror, id tidemark.TableID, source string, after tidemark.Position) error {
	ix, err := idx.Indexes(ctx, id)
	if err != nil {
		return err
	}
	if m, ok := reg.(tidemark.IndexMirrorAfter); ok && !after.IsZero() {
		err = m.MirrorIndexesAfter(ctx, source, id, ix, after)
	} else {
		err = reg.MirrorIndexes(ctx, id, ix)
	}
	if err != nil {
		return fmt.Errorf("mirror the indexes of %s: %w", id, err)
	}
	return nil
}

// highWatermark captures the source's position after a load's last read:
// the target is consistent once the stream has applied past it, and the
// unique constraints the load dropped wait for that (IndexMirrorAfter). It
// is zero when reg cannot hold them or when nothing was written since the
// load's capture (the target is consistent now: they are built at once).
func (c *CatchUp) highWatermark(ctx context.Context, reg tidemark.IndexMirror, captured tidemark.Position) (tidemark.Position, error) {
	if _, ok := reg.(tidemark.IndexMirrorAfter); !ok {
		return tidemark.Position{}, nil
	}
	snap, err := c.src.Capture(ctx)
	if err != nil {
		return tidemark.Position{}, fmt.Errorf("capture the high watermark after the load: %w", err)
	}
	if cmp, err := snap.Position.Compare(captured); err == nil && cmp <= 0 {
		return tidemark.Position{}, nil
	}
	return snap.Position, nil
}

// MirrorAfterLoad mirrors the indexes of the tables a RunReport loaded
// (`tidemark catchup --table`): a load into a target table that holds rows
// drops its mirrored unique constraints, which this builds again. A table
// whose rows violate one is quarantined in reg.
func (c *CatchUp) MirrorAfterLoad(ctx context.Context, rep Report, idx tidemark.IndexLister, reg Registry) error {
	return c.mirrorAfterLoad(ctx, rep, idx, reg, map[tidemark.TableID]bool{})
}

// mirrorAfterLoad mirrors the indexes of the tables a catch-up loaded. A
// table whose rows violate a mirrored constraint is quarantined.
func (c *CatchUp) mirrorAfterLoad(ctx context.Context, rep Report, idx tidemark.IndexLister, reg Registry, skip map[tidemark.TableID]bool) error {
	after, err := c.highWatermark(ctx, reg, rep.Snapshot.Position)
	if err != nil {
		return err
	}
	for _, tr := range rep.Tables {
		if skip[tr.Table] || tr.Mode == "gone" {
			continue
		}
		err := mirrorIndexes(ctx, idx, reg, tr.Table, c.cfg.Source, after)
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
// beside the stream): chunks of ChunkRows rows in key order, read from
// srcs (one reader per range read at once: Parallelism() is len(srcs))
// after a capture and stamped with its version; at the end the target
// table is created if the table had no rows, and the source's secondary
// indexes (idx) are mirrored onto it. srcs and idx must be used by nothing
// else (readers of their own: their chunks are read while the pipeline
// uses the catch-up's reader); the calls on one reader are serialized,
// idx is srcs[0] or used under its lock.
func (c *CatchUp) Chunks(srcs []tidemark.SnapshotSource, idx tidemark.IndexLister, reg Registry) tidemark.ChunkSnapshotter {
	s := &chunks{chunkRows: c.cfg.ChunkRows, srcs: srcs, idx: idx, reg: reg, mu: make([]sync.Mutex, len(srcs))}
	return s
}

type chunks struct {
	chunkRows int
	srcs      []tidemark.SnapshotSource
	idx       tidemark.IndexLister
	reg       Registry

	mu []sync.Mutex // per reader: one statement at a time on it
}

// Parallelism implements tidemark.ChunkSnapshotter.
func (s *chunks) Parallelism() int { return len(s.srcs) }

// Chunkable implements tidemark.ChunkSnapshotter.
func (s *chunks) Chunkable(ctx context.Context, id tidemark.TableID) (bool, error) {
	s.mu[0].Lock()
	defer s.mu[0].Unlock()
	present, err := s.srcs[0].Tables(ctx)
	if err != nil || !slices.Contains(present, id) {
		return false, err
	}
	t, err := s.srcs[0].Table(ctx, id)
	if errors.Is(err, tidemark.ErrTableGone) {
		return false, nil // gone since the listing: nothing to read in chunks
	}
	if err != nil {
		return false, err
	}
	return len(t.Key) > 0, nil
}

// Split implements tidemark.ChunkSnapshotter.
func (s *chunks) Split(ctx context.Context, id tidemark.TableID, n int) ([]tidemark.SnapshotRange, error) {
	s.mu[0].Lock()
	defer s.mu[0].Unlock()
	return splitTable(ctx, s.srcs[0], id, n)
}

// splitTable divides a table into up to n ranges with src's KeySplits (one
// range when it cannot).
func splitTable(ctx context.Context, src tidemark.SnapshotSource, id tidemark.TableID, n int) ([]tidemark.SnapshotRange, error) {
	ks, ok := src.(tidemark.KeySplitter)
	if n < 2 || !ok {
		return []tidemark.SnapshotRange{{}}, nil
	}
	splits, err := ks.KeySplits(ctx, id, n)
	if err != nil {
		return nil, err
	}
	return tidemark.SplitRanges(splits), nil
}

// forgetTables tells readers that do not capture (the extra readers of a
// parallel read) to forget the schemas they cached: a capture was just
// taken, and the reads after it decode the tables as they are now.
func forgetTables(readers []tidemark.SnapshotSource) {
	for _, r := range readers {
		if f, ok := r.(interface{ ForgetTables() }); ok {
			f.ForgetTables()
		}
	}
}

// Capture implements tidemark.ChunkSnapshotter.
func (s *chunks) Capture(ctx context.Context) (tidemark.Snapshot, error) {
	s.mu[0].Lock()
	defer s.mu[0].Unlock()
	snap, err := s.srcs[0].Capture(ctx)
	if err != nil {
		return snap, err
	}
	// Every reader reads the tables as they are now (a capture forgets
	// the cached schemas: one from before an ALTER TABLE must not decode
	// a chunk read after it).
	for i := 1; i < len(s.srcs); i++ {
		s.mu[i].Lock()
		forgetTables(s.srcs[i : i+1])
		s.mu[i].Unlock()
	}
	return snap, nil
}

// ReadChunk implements tidemark.ChunkSnapshotter.
func (s *chunks) ReadChunk(ctx context.Context, id tidemark.TableID, worker int, r tidemark.SnapshotRange, snap tidemark.Snapshot) ([]tidemark.Change, []any, error) {
	w := worker % len(s.srcs)
	s.mu[w].Lock()
	defer s.mu[w].Unlock()
	res, err := s.srcs[w].Read(ctx, tidemark.ReadRequest{Table: id, After: r.After, KeyFrom: r.From, KeyTo: r.To, Limit: s.chunkRows, Snapshot: snap})
	if err != nil {
		return nil, nil, err
	}
	return res.Changes, res.Next, nil
}

// FinishSnapshot implements tidemark.ChunkSnapshotter.
func (s *chunks) FinishSnapshot(ctx context.Context, id tidemark.TableID) error {
	s.mu[0].Lock()
	defer s.mu[0].Unlock()
	t, err := s.srcs[0].Table(ctx, id)
	if err != nil {
		return err
	}
	if err := s.reg.EnsureTable(ctx, t); err != nil {
		return err
	}
	return mirrorIndexes(ctx, s.idx, s.reg, id, "", tidemark.Position{})
}
