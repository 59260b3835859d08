package tidemark

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// handleDDL applies a chunk's schema changes. DROP TABLE, TRUNCATE and
// ALTER TABLE go to the sink (with the chunk's checkpoint when the chunk
// holds nothing else: committed reports that); a refused or inapplicable one
// quarantines its table. CREATE TABLE admits the table (streamed from here;
// a table renamed into the stream is snapshotted); an ALTER TABLE that
// needs a backfill re-snapshots it.
func (p *Pipeline) handleDDL(ctx context.Context, ch *Chunk) (committed bool, err error) {
	events, creates, backfills, err := p.sortDDL(ctx, ch.DDL)
	if err != nil {
		return false, err
	}
	if len(events) > 0 && p.ddl != nil {
		var cp Position
		if len(ch.Changes) == 0 && len(ch.Watermarks) == 0 {
			cp = ch.Commit
		}
		if committed, err = p.applyDDL(ctx, events, cp); err != nil {
			return false, err
		}
	} else if len(events) > 0 {
		p.cfg.Logger.Debug("the sink does not apply DDL; ignoring", "source", p.cfg.Source, "events", len(events))
	}
	if err := p.besideDDL(ctx, events, backfills); err != nil {
		return committed, err
	}
	for _, id := range backfills {
		if st, _ := p.state(id); st.Mode == TableQuarantined {
			continue
		}
		if err := p.resnapshot(ctx, id, "backfill after ALTER TABLE"); err != nil {
			return committed, err
		}
	}
	for _, ev := range creates {
		if _, ok := p.state(ev.Table); ok {
			continue
		}
		if ev.From == (TableID{}) {
			// Created here: every row of it follows in the stream.
			if err := p.setState(ctx, TableState{Table: ev.Table, Mode: TableStreaming}); err != nil {
				return committed, err
			}
			continue
		}
		// Renamed into the stream: its rows are not in it, and a target
		// table under its name holds another table's rows. Snapshot it
		// whatever the target says: the scale-out tailer cannot tell
		// which tables the appliers have (the gh-ost / pt-osc cut-over,
		// RENAME TABLE t TO _t_del, _t_gho TO t, emptied their t).
		if err := p.resnapshot(ctx, ev.Table, "renamed from "+ev.From.String()); err != nil {
			return committed, err
		}
	}
	return committed, nil
}

// sortDDL sorts a chunk's DDL events by what the pipeline does with them:
// events for the sink (DROP TABLE, TRUNCATE, ALTER TABLE), creates to
// admit, and the tables an ALTER TABLE left needing a backfill (recorded as
// snapshotting before anything is applied, so that a crash after the
// ALTER's checkpoint commits still redoes the backfill). Events of a table
// the pipeline skips (quarantined, or older than its snapshot) are dropped;
// an undecodable statement quarantines its table.
func (p *Pipeline) sortDDL(ctx context.Context, ddl []DDLEvent) (events, creates []DDLEvent, backfills []TableID, err error) {
	for _, ev := range ddl {
		if _, skip := p.tables.skips(ev.Table, ev.Version); skip {
			continue // quarantined, or older than the table's snapshot
		}
		switch ev.Op {
		case DDLUndecodable:
			if err := p.quarantine(ctx, ev.Table, &TableError{Table: ev.Table, Err: fmt.Errorf("%s: %w", ev.Reason, ErrUndecodable)}); err != nil {
				return nil, nil, nil, err
			}
		case DDLCreateTable:
			creates = append(creates, ev)
		default:
			if ev.Op == DDLAlterTable && ev.Backfill && p.cfg.Snapshot != nil && p.reg != nil {
				st := TableState{Table: ev.Table, Mode: TableSnapshotting, Reason: "backfill after ALTER TABLE (existing rows got values the binlog does not carry)"}
				if err := p.setState(ctx, st); err != nil {
					return nil, nil, nil, err
				}
				backfills = append(backfills, ev.Table)
			}
			events = append(events, ev)
		}
	}
	return events, creates, backfills, nil
}

// applyDDL hands events to the DDLSink with checkpoint cp (committed
// reports that cp was stored with them). A *TableError quarantines its
// table and the remaining events are applied without it; any other error
// stops. The state of a table whose DROP TABLE applied is forgotten.
func (p *Pipeline) applyDDL(ctx context.Context, events []DDLEvent, cp Position) (committed bool, err error) {
	for len(events) > 0 {
		// The checkpoint is the last commit at once: the backfills and
		// snapshots that follow can take long (a lock check meanwhile
		// compares it with the stored one).
		err := p.commit(cp, func() error { return p.ddl.ApplyDDL(ctx, p.cfg.Source, events, cp) })
		var te *TableError
		if err == nil {
			committed = !cp.IsZero()
			break
		}
		if !errors.As(err, &te) {
			return false, fmt.Errorf("apply DDL of %s: %w", p.cfg.Source, err)
		}
		if err := p.quarantine(ctx, te.Table, te.Err); err != nil {
			return false, err
		}
		kept := events[:0]
		for _, ev := range events {
			if ev.Table != te.Table {
				kept = append(kept, ev)
			}
		}
		if len(kept) == len(events) {
			return false, fmt.Errorf("apply DDL of %s: %w", p.cfg.Source, err)
		}
		events = kept
		if len(events) == 0 && !cp.IsZero() {
			// Nothing left to apply: the checkpoint goes with the
			// next batch.
			break
		}
	}
	for _, ev := range events {
		if ev.Op == DDLDropTable {
			p.tables.forget(ev.Table)
			// The sink says when it dropped a target table; a DROP
			// TABLE of a table that never reached the target drops
			// nothing.
			p.cfg.Logger.Debug("DROP TABLE applied; the table's state is forgotten", "source", p.cfg.Source, "table", ev.Table.String(), "reason", ev.Reason)
		}
	}
	return committed, nil
}

// besideDDL handles the schema changes of tables snapshotted beside the
// stream, once they are applied: a DROP TABLE ends the table's snapshot;
// any other (ALTER, TRUNCATE) restarts it from its first chunk, since the
// chunks that landed may not hold what it changed (a backfill restarts it
// through resnapshot).
func (p *Pipeline) besideDDL(ctx context.Context, events []DDLEvent, backfills []TableID) error {
	for _, ev := range events {
		if p.bg.find(ev.Table) == nil || slices.Contains(backfills, ev.Table) {
			continue
		}
		if ev.Op == DDLDropTable {
			p.removeBeside(ev.Table)
			p.cfg.Logger.Warn("table dropped while it was snapshotted beside the stream: its snapshot ends", "source", p.cfg.Source, "table", ev.Table.String())
			continue
		}
		if st, _ := p.state(ev.Table); st.Mode == TableQuarantined {
			continue
		}
		if err := p.queueBeside(ctx, ev.Table, "schema change during its snapshot ("+ev.Op.String()+")", nil, Version{}); err != nil {
			return err
		}
	}
	return nil
}
