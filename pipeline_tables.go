package tidemark

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"
)

// tableSet is a pipeline's per-table state in memory: the TableState of
// every table it has admitted, and how many changes those states made it
// skip. The zero value is empty and ready; it is safe for concurrent use
// (a batch applying in the background reads it while the loop updates it).
type tableSet struct {
	mu     sync.Mutex
	tables map[TableID]TableState
	// applying: tables snapshotted beside the stream whose changes are
	// applied although they are not streaming (pipeline_beside.go).
	applying map[TableID]bool
	skipped  uint64
	// gen counts the changes of tables (put, forget); changedAt holds
	// each table's last one, so that a state read from the registry
	// before a change made in memory meanwhile does not undo it
	// (putIfUnchanged).
	gen       uint64
	changedAt map[TableID]uint64
}

// touch records a change of id's state. Callers hold s.mu.
func (s *tableSet) touch(id TableID) {
	if s.changedAt == nil {
		s.changedAt = map[TableID]uint64{}
	}
	s.gen++
	s.changedAt[id] = s.gen
}

// generation returns the count of changes so far, for putIfUnchanged.
func (s *tableSet) generation() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen
}

// setApplying marks a table's changes as applied (or not) while it is
// snapshotted beside the stream.
func (s *tableSet) setApplying(id TableID, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !on {
		delete(s.applying, id)
		return
	}
	if s.applying == nil {
		s.applying = map[TableID]bool{}
	}
	s.applying[id] = true
}

// skips reports whether a change (or DDL event) of a known table at
// version v is skipped; known is false for a table the set does not know.
func (s *tableSet) skips(id TableID, v Version) (known, skip bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.tables[id]
	return ok, ok && st.Skips(v) && !s.applying[id]
}

// get returns a table's state and whether the set knows the table.
func (s *tableSet) get(id TableID) (TableState, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.tables[id]
	return st, ok
}

// put records st and reports whether it changed what the set knew of the
// table: a table seen for the first time, another mode, floor or reason.
func (s *tableSet) put(st TableState) (changed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.putLocked(st)
}

// putLocked is put for a caller that holds s.mu.
func (s *tableSet) putLocked(st TableState) (changed bool) {
	if s.tables == nil {
		s.tables = map[TableID]TableState{}
	}
	old, had := s.tables[st.Table]
	s.tables[st.Table] = st
	s.touch(st.Table)
	return !had || old.Mode != st.Mode || old.Floor != st.Floor || old.Reason != st.Reason
}

// putIfUnchanged records st, read from the registry after generation gen,
// unless the table's state changed in memory since gen: that change is
// newer than the read (a batch applying in the background quarantined the
// table while pendingSnapshots read the states) and is kept. ok reports
// that st was recorded.
func (s *tableSet) putIfUnchanged(st TableState, gen uint64) (changed, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changedAt[st.Table] > gen {
		return false, false
	}
	return s.putLocked(st), true
}

// forget removes a table (after its DROP TABLE): a table of that name seen
// later is admitted as a new one.
func (s *tableSet) forget(id TableID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.tables, id)
	delete(s.applying, id)
	s.touch(id)
}

// reset forgets every table.
func (s *tableSet) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.tables)
	clear(s.applying)
}

// list returns every state, sorted by table name.
func (s *tableSet) list() []TableState {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]TableState, 0, len(s.tables))
	for _, st := range s.tables {
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Table.String() < out[j].Table.String() })
	return out
}

// skippedChanges returns how many changes filter removed so far.
func (s *tableSet) skippedChanges() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.skipped
}

// filter removes from b the changes of tables that are not streaming and
// the changes older than their table's last snapshot (TableState.Skips),
// and counts them. Changes of tables the set does not know are kept.
func (s *tableSet) filter(b *Batch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := b.Changes[:0]
	for _, c := range b.Changes {
		if st, ok := s.tables[c.Table.ID]; ok && st.Skips(c.Version) && !s.applying[c.Table.ID] {
			s.skipped++
			continue
		}
		kept = append(kept, c)
	}
	clear(b.Changes[len(kept):])
	b.Changes = kept
}

// hasUnknown reports whether b has changes of a table the set does not
// know.
func (s *tableSet) hasUnknown(b *Batch) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range b.Changes {
		if _, ok := s.tables[b.Changes[i].Table.ID]; !ok {
			return true
		}
	}
	return false
}

// loadStates reads the recorded table states, when the sink keeps them.
func (p *Pipeline) loadStates(ctx context.Context) error {
	reg, ok := p.sink.(TableRegistry)
	if !ok {
		return nil
	}
	states, err := reg.TableStates(ctx, p.cfg.Source)
	if errors.Is(err, errors.ErrUnsupported) {
		p.cfg.Logger.Info("the sink does not record table states: quarantines last until the process stops", "source", p.cfg.Source)
		return nil
	}
	if err != nil {
		return fmt.Errorf("read table states of %s: %w", p.cfg.Source, err)
	}
	p.reg = reg
	p.tables.reset()
	for _, st := range states {
		p.remember(st)
	}
	for _, st := range states {
		if st.Mode == TableQuarantined {
			p.cfg.Logger.Error("table is quarantined: its changes are skipped until it is resynced (tidemark resync --table "+st.Table.String()+")",
				"source", p.cfg.Source, "table", st.Table.String(), "reason", st.Reason, "since", st.UpdatedAt)
		}
	}
	return nil
}

// state returns the state of a table and whether the pipeline knows it.
func (p *Pipeline) state(id TableID) (TableState, bool) {
	return p.tables.get(id)
}

// setState records a table's state (in the target when the sink keeps
// states) and reports the change.
func (p *Pipeline) setState(ctx context.Context, st TableState) error {
	if p.reg != nil {
		if err := p.reg.SetTableState(ctx, p.cfg.Source, st); err != nil {
			return fmt.Errorf("record state of %s: %w", st.Table, err)
		}
	}
	p.remember(st)
	return nil
}

// remember records a table's state in memory and reports a change to
// OnTableState.
func (p *Pipeline) remember(st TableState) {
	if p.tables.put(st) && p.cfg.OnTableState != nil {
		p.cfg.OnTableState(st)
	}
}

// rememberRead is remember for a state read from the registry after
// generation gen of the tables in memory (tableSet.putIfUnchanged).
func (p *Pipeline) rememberRead(st TableState, gen uint64) {
	if changed, _ := p.tables.putIfUnchanged(st, gen); changed && p.cfg.OnTableState != nil {
		p.cfg.OnTableState(st)
	}
}

// quarantine stops applying a table's changes. The reason goes to the log
// (once, at error level), the recorded state and OnTableState.
func (p *Pipeline) quarantine(ctx context.Context, id TableID, cause error) error {
	p.removeBeside(id)
	st := TableState{Table: id, Mode: TableQuarantined, Reason: cause.Error()}
	p.cfg.Logger.Error("table quarantined: its changes are skipped from now on; the other tables continue. Resync it with `tidemark resync --table "+id.String()+"` once the cause is fixed",
		"source", p.cfg.Source, "table", id.String(), "reason", st.Reason)
	return p.setState(ctx, st)
}

// writerGone says whether a snapshot failed because this process may no
// longer write for the source: the sink fenced it (another instance took
// over) or the source lock was lost. That is no table's fault: the
// pipeline stops with it instead of quarantining the table (nemesis seed
// 25: a tailer a standby had just fenced quarantined the table it was
// re-snapshotting).
func writerGone(err error) bool {
	return errors.Is(err, ErrFenced) || errors.Is(err, ErrSourceLockLost)
}

// resnapshot takes a table through Resnapshot. A failure other than
// cancellation quarantines the table instead of stopping the pipeline.
func (p *Pipeline) resnapshot(ctx context.Context, id TableID, reason string) error {
	if p.cfg.Snapshot == nil || p.reg == nil {
		// Nothing to snapshot with: stream the table from here.
		return p.setState(ctx, TableState{Table: id, Mode: TableStreaming, Reason: reason})
	}
	if p.cfg.Chunks != nil {
		ok, err := p.cfg.Chunks.Chunkable(ctx, id)
		if err != nil {
			if ctx.Err() != nil || writerGone(err) {
				return err
			}
			return p.quarantine(ctx, id, fmt.Errorf("snapshot failed: %w", err))
		}
		if ok {
			return p.queueBeside(ctx, id, reason, nil, Version{})
		}
	}
	p.cfg.Logger.Info("snapshotting table", "source", p.cfg.Source, "table", id.String(), "reason", reason)
	start := time.Now()
	p.remember(TableState{Table: id, Mode: TableSnapshotting, Reason: reason})
	st, err := Resnapshot(ctx, p.reg, p.cfg.Source, id, p.cfg.Snapshot, reason)
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		if IsRegistryError(err) || writerGone(err) {
			// Recording the state or dropping the target failed, or this
			// process may no longer write: not the table's fault. Stop;
			// the table stays snapshotting and the next start (or the
			// instance that took over) redoes the snapshot.
			return err
		}
		// Reading or loading the table failed (after the retries of the
		// reader and the sink): quarantine it, the others go on.
		return p.quarantine(ctx, id, fmt.Errorf("snapshot failed: %w", err))
	}
	p.remember(st)
	p.cfg.Logger.Info("table snapshotted; streaming it from the snapshot on", "source", p.cfg.Source, "table", id.String(),
		"version", st.Floor.String(), "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// pendingSnapshots reads the recorded states again and performs what they
// ask for: resyncs requested (tidemark resync) and snapshots a crash
// interrupted. flush, when not nil, first applies the batch in hand.
func (p *Pipeline) pendingSnapshots(ctx context.Context, flush func() error) error {
	if p.reg == nil {
		return nil
	}
	// A batch may apply in the background meanwhile and quarantine a
	// table after the read: what changed in memory since gen is newer
	// than the states read and stays.
	gen := p.tables.generation()
	states, err := p.reg.TableStates(ctx, p.cfg.Source)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("read table states of %s: %w", p.cfg.Source, err)
	}
	var todo []TableState
	for _, st := range states {
		if st.Mode == TableSnapshotting && p.bg.find(st.Table) != nil {
			continue // being snapshotted beside the stream
		}
		if st.Mode == TableResyncRequested || st.Mode == TableSnapshotting {
			todo = append(todo, st)
			continue
		}
		if cur, ok := p.state(st.Table); !ok || cur.Mode != st.Mode || cur.Floor != st.Floor {
			p.rememberRead(st, gen)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	if flush != nil {
		if err := flush(); err != nil {
			return err
		}
	}
	for _, st := range todo {
		if err := p.perform(ctx, st); err != nil {
			return err
		}
	}
	return nil
}

// perform does what a recorded state of mode resync or snapshotting asks
// for: the resync, or the snapshot a crash interrupted (resumed after its
// last chunk when it was beside the stream).
func (p *Pipeline) perform(ctx context.Context, st TableState) error {
	reason := st.Reason
	if st.Mode == TableResyncRequested {
		reason = "resync requested"
		p.cfg.Logger.Info("resync requested: re-snapshotting the table", "source", p.cfg.Source, "table", st.Table.String())
	} else if st.Cursor != "" && p.cfg.Chunks != nil {
		// A snapshot beside the stream: resume it after its last
		// chunk.
		p.remember(st)
		ranges, err := DecodeRanges(st.Cursor)
		if err != nil {
			p.cfg.Logger.Warn("the recorded chunk cursor cannot be read: redoing the snapshot from its first chunk", "source", p.cfg.Source, "table", st.Table.String(), "err", err)
		} else if same, err := p.sameTarget(ctx, st); err != nil {
			return err
		} else if same {
			return p.queueBeside(ctx, st.Table, st.Reason, ranges, st.Floor)
		}
	} else {
		p.cfg.Logger.Info("finishing an interrupted snapshot", "source", p.cfg.Source, "table", st.Table.String(), "reason", st.Reason)
	}
	p.remember(st)
	return p.resnapshot(ctx, st.Table, reason)
}

// admitTables admits the batch's tables that the pipeline sees for the
// first time. A table with a recorded state gets what that state says
// (honour) instead: after a first run, which records none, a resync asked
// for before the table's first change is recorded and nothing in memory
// knows it yet; admitting the table streaming overwrote the request, and
// the resync never happened.
func (p *Pipeline) admitTables(ctx context.Context, b *Batch) error {
	var unknown []TableID
	for i := range b.Changes {
		id := b.Changes[i].Table.ID
		if _, ok := p.state(id); ok || slices.Contains(unknown, id) {
			continue
		}
		unknown = append(unknown, id)
	}
	if len(unknown) == 0 {
		return nil
	}
	recorded, err := p.recordedStates(ctx)
	if err != nil {
		return err
	}
	for _, id := range unknown {
		if st, ok := recorded[id]; ok {
			err = p.honour(ctx, st)
		} else {
			err = p.admit(ctx, id)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// recordedStates reads the recorded table states by table (none without
// a registry).
func (p *Pipeline) recordedStates(ctx context.Context) (map[TableID]TableState, error) {
	if p.reg == nil {
		return nil, nil
	}
	states, err := p.reg.TableStates(ctx, p.cfg.Source)
	if err != nil {
		return nil, fmt.Errorf("read table states of %s: %w", p.cfg.Source, err)
	}
	out := make(map[TableID]TableState, len(states))
	for _, st := range states {
		out[st.Table] = st
	}
	return out, nil
}

// honour takes on a recorded state of a table the pipeline did not know:
// a resync or a snapshot is performed, any other state remembered.
func (p *Pipeline) honour(ctx context.Context, st TableState) error {
	if st.Mode == TableResyncRequested || st.Mode == TableSnapshotting {
		return p.perform(ctx, st)
	}
	p.remember(st)
	return nil
}

// admit starts replicating a table the pipeline has not seen before. When
// its target does not exist yet it is snapshotted first: it may hold rows
// that the stream will never show (a table renamed into the include filter,
// or newly included). A table whose target exists is streamed from here,
// recorded so only where no state is recorded: one recorded since the
// caller read them (a resync asked for meanwhile) is honoured.
func (p *Pipeline) admit(ctx context.Context, id TableID) error {
	if p.reg == nil {
		p.remember(TableState{Table: id, Mode: TableStreaming})
		return nil
	}
	has, err := p.reg.HasTable(ctx, id)
	if err != nil {
		return fmt.Errorf("look up target of %s: %w", id, err)
	}
	if !has {
		return p.resnapshot(ctx, id, "new table")
	}
	st := TableState{Table: id, Mode: TableStreaming}
	added, err := p.reg.SwapTableState(ctx, p.cfg.Source, "", st)
	if err != nil {
		return fmt.Errorf("record state of %s: %w", id, err)
	}
	if added {
		p.remember(st)
		return nil
	}
	recorded, err := p.recordedStates(ctx)
	if err != nil {
		return err
	}
	if cur, ok := recorded[id]; ok {
		return p.honour(ctx, cur)
	}
	// Recorded and forgotten again since (a DROP TABLE's): stream it.
	return p.setState(ctx, st)
}
