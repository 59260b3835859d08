package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"tidemark"
	"tidemark/binlog"
	"tidemark/fallback"
	"tidemark/sink/postgres"
)

// DDLConfig is target.postgres.ddl: what the source's DROP TABLE and
// TRUNCATE do to the target ("apply" or "refuse"; refuse quarantines the
// table). Defaults: drop_table refuse, truncate apply.
type DDLConfig struct {
	DropTable string `yaml:"drop_table"`
	Truncate  string `yaml:"truncate"`
}

// snapshotTables is the pipeline's tidemark.SnapshotFunc: the fallback
// catch-up of just those tables (it does not move the checkpoint), stamping
// rows with the captured version. A table that has no rows gets its empty
// target table; a table that no longer exists in the source has nothing to
// snapshot (its target was dropped by the caller). report, if set, receives
// each run's report.
func snapshotTables(c *fallback.CatchUp, r *binlog.Reader, s *postgres.Sink, report func(fallback.Report)) tidemark.SnapshotFunc {
	return func(ctx context.Context, tables []tidemark.TableID) (tidemark.Version, error) {
		present, err := r.Tables(ctx)
		if err != nil {
			return tidemark.Version{}, err
		}
		var only []tidemark.TableID
		for _, id := range tables {
			for _, p := range present {
				if p == id {
					only = append(only, id)
					break
				}
			}
		}
		if len(only) == 0 {
			snap, err := r.Capture(ctx)
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
			if tr.Rows > 0 {
				continue
			}
			t, err := r.Table(ctx, tr.Table)
			if err != nil {
				return tidemark.Version{}, err
			}
			if err := s.EnsureTable(ctx, t); err != nil {
				return tidemark.Version{}, err
			}
		}
		// The secondary indexes, now that the rows are in. A constraint
		// the rows violate fails the snapshot: the pipeline quarantines
		// the table.
		for _, tr := range rep.Tables {
			if err := mirrorIndexes(ctx, r, s, tr.Table); err != nil {
				return tidemark.Version{}, err
			}
		}
		return rep.Snapshot.Version, nil
	}
}

// catchUpStreaming is the automatic catch-up (first start, purged
// position) without the tables that are not streaming: a quarantined
// table's changes are skipped until it is resynced, and reading it could
// only fail on the schema change that quarantined it. It stores the
// captured position as the checkpoint, like a catch-up of every table.
func catchUpStreaming(ctx context.Context, c *fallback.CatchUp, r *binlog.Reader, s *postgres.Sink, target tidemark.Sink, source string, log *slog.Logger) (fallback.Report, error) {
	states, err := s.TableStates(ctx, source)
	if err != nil {
		return fallback.Report{}, err
	}
	skip := map[tidemark.TableID]bool{}
	for _, st := range states {
		if st.Mode != tidemark.TableStreaming {
			skip[st.Table] = true
			log.Warn("catch-up leaves out a table that is not streaming", "table", st.Table.String(), "state", string(st.Mode), "reason", st.Reason)
		}
	}
	for {
		if len(skip) == 0 {
			rep, err := c.RunReport(ctx, nil)
			if ok, qerr := quarantineOn(ctx, err, s, source, skip, log); ok {
				continue
			} else if qerr != nil {
				return rep, qerr
			}
			if err == nil {
				err = mirrorAfterLoad(ctx, rep, r, s, source, skip, log)
			}
			return rep, err
		}
		all, err := r.Tables(ctx)
		if err != nil {
			return fallback.Report{}, err
		}
		var only []tidemark.TableID
		for _, id := range all {
			if !skip[id] {
				only = append(only, id)
			}
		}
		var rep fallback.Report
		if len(only) == 0 {
			if rep.Snapshot, err = r.Capture(ctx); err != nil {
				return rep, err
			}
		} else if rep, err = c.RunReport(ctx, only); err != nil {
			if ok, qerr := quarantineOn(ctx, err, s, source, skip, log); ok {
				continue
			} else if qerr != nil {
				return rep, qerr
			}
			return rep, err
		}
		if err := mirrorAfterLoad(ctx, rep, r, s, source, skip, log); err != nil {
			return rep, err
		}
		// RunReport with a table list leaves the checkpoint alone. It is
		// stored through the pipeline's target, so that with Kafka as well
		// both sinks move (the fan-out resumes from the older one).
		if _, err := target.Apply(ctx, &tidemark.Batch{Source: source, Checkpoint: rep.Snapshot.Position}); err != nil {
			return rep, fmt.Errorf("catch up %s: store checkpoint %s: %w", source, rep.Snapshot.Position, err)
		}
		return rep, nil
	}
}

// mirrorIndexes mirrors the source's current secondary indexes of a table
// onto its target (a no-op when they are already there).
func mirrorIndexes(ctx context.Context, r *binlog.Reader, s *postgres.Sink, id tidemark.TableID) error {
	idx, err := r.Indexes(ctx, id)
	if err != nil {
		return err
	}
	if err := s.MirrorIndexes(ctx, id, idx); err != nil {
		return fmt.Errorf("mirror the indexes of %s: %w", id, err)
	}
	return nil
}

// mirrorAfterLoad mirrors the indexes of the tables a catch-up loaded. A
// table whose rows violate a mirrored constraint is quarantined.
func mirrorAfterLoad(ctx context.Context, rep fallback.Report, r *binlog.Reader, s *postgres.Sink, source string, skip map[tidemark.TableID]bool, log *slog.Logger) error {
	for _, tr := range rep.Tables {
		if skip[tr.Table] {
			continue
		}
		err := mirrorIndexes(ctx, r, s, tr.Table)
		if ok, qerr := quarantineOn(ctx, err, s, source, skip, log); ok {
			continue
		} else if qerr != nil {
			return qerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// quarantineOn records the table of a *tidemark.TableError (a table whose
// schema can no longer be followed) as quarantined and adds it to skip, so
// that the catch-up is run again without it. It reports whether it did.
func quarantineOn(ctx context.Context, err error, s *postgres.Sink, source string, skip map[tidemark.TableID]bool, log *slog.Logger) (bool, error) {
	var te *tidemark.TableError
	if err == nil || !errors.As(err, &te) || skip[te.Table] {
		return false, nil
	}
	log.Error("table quarantined: its changes are skipped from now on; the other tables continue. Resync it with `tidemark resync --table "+te.Table.String()+"` once the cause is fixed",
		"table", te.Table.String(), "reason", te.Err.Error())
	st := tidemark.TableState{Table: te.Table, Mode: tidemark.TableQuarantined, Reason: te.Err.Error()}
	if err := s.SetTableState(ctx, source, st); err != nil {
		return false, err
	}
	skip[te.Table] = true
	return true, nil
}

// tableStateMetric registers tidemark_table_state{table, state} (1 for the
// table's current state, 0 for the others) and returns the pipeline's
// OnTableState callback that keeps it current.
func tableStateMetric(m *Metrics) func(tidemark.TableState) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tidemark_table_state",
		Help: "Replication state of each table: 1 for its current state (streaming, quarantined, resync, snapshotting), 0 for the others. Alert on state=\"quarantined\"."},
		[]string{"table", "state"})
	m.Registry().MustRegister(g)
	modes := []tidemark.TableMode{tidemark.TableStreaming, tidemark.TableQuarantined, tidemark.TableResyncRequested, tidemark.TableSnapshotting}
	return func(st tidemark.TableState) {
		for _, mode := range modes {
			v := 0.0
			if mode == st.Mode {
				v = 1
			}
			g.WithLabelValues(st.Table.String(), string(mode)).Set(v)
		}
	}
}

// cmdResync re-snapshots tables and resumes streaming them: the way back
// from quarantine (and a repair for any table). When no daemon is running
// for the source (its lock is free) it does the work itself; otherwise it
// asks the running daemon (state 'resync' in the tables control table) and
// waits for it to finish.
func cmdResync(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var tables stringList
	var wait time.Duration
	cfg, _, err := loadConfigFlagWith("resync", args, stderr, func(fs *flagSet) {
		fs.Var(&tables, "table", "db.table to re-snapshot (repeatable, required)")
		fs.DurationVar(&wait, "wait", 30*time.Minute, "with a daemon running: how long to wait for it to finish (0: request and return)")
	})
	if err != nil {
		fmt.Fprintln(stderr, "tidemark:", err)
		return exitUsage
	}
	if len(tables) == 0 {
		fmt.Fprintln(stderr, "tidemark resync: --table db.table is required")
		return exitUsage
	}
	if err := cfg.needPostgres("resync"); err != nil {
		fmt.Fprintln(stderr, err)
		return exitUsage
	}
	if cfg.Apply != nil {
		fmt.Fprintln(stderr, "tidemark resync: not available in the scale-out topology yet (an apply section): a resync's reset of the target table is not carried to the appliers; stop the tailer and the appliers, resync with a config without the apply section, then start them again (docs/SCALE-OUT.md)")
		return exitUsage
	}
	var ids []tidemark.TableID
	for _, t := range tables {
		db, name, ok := strings.Cut(t, ".")
		if !ok || strings.Contains(name, ".") || !tidemark.ValidIdentifier(db) || !tidemark.ValidIdentifier(name) {
			fmt.Fprintf(stderr, "tidemark resync: --table %q: want db.table\n", t)
			return exitUsage
		}
		ids = append(ids, tidemark.TableID{Database: db, Name: name})
	}
	log := newLogger(cfg.Log, stderr)
	d, err := wire(ctx, cfg, log, nil)
	if err != nil {
		log.Error("start failed", "err", err)
		return exitFailed
	}
	defer d.Close()
	source := cfg.Source.Name
	present, err := d.reader.Tables(ctx)
	if err != nil {
		log.Error("list source tables failed", "err", err)
		return exitFailed
	}
	for _, id := range ids {
		found := false
		for _, p := range present {
			found = found || p == id
		}
		if !found {
			fmt.Fprintf(stderr, "tidemark resync: %s: no such table in source %s, or not replicated (include/exclude)\n", id, source)
			return exitUsage
		}
	}

	release, free, err := d.sink.TryLockSource(ctx, source)
	if err != nil {
		log.Error("resync failed", "err", err)
		return exitFailed
	}
	if free {
		// No daemon: resync here, holding the source's lock (a daemon
		// starting meanwhile waits for it).
		defer release()
		snap := snapshotTables(d.catchUp, d.reader, d.sink, func(rep fallback.Report) { printCatchupReport(stdout, rep) })
		for _, id := range ids {
			st, err := tidemark.Resnapshot(ctx, d.sink, source, id, snap, "resync requested")
			if err != nil {
				log.Error("resync failed; the table stays out of streaming until a resync succeeds", "table", id.String(), "err", err)
				return exitFailed
			}
			fmt.Fprintf(stdout, "%s: resynced; the daemon streams it from version %s on\n", id, st.Floor)
		}
		return exitOK
	}

	// A daemon is running: it performs the resync between two batches.
	requested, err := d.sink.Now(ctx)
	if err != nil {
		log.Error("resync failed", "err", err)
		return exitFailed
	}
	for _, id := range ids {
		st := tidemark.TableState{Table: id, Mode: tidemark.TableResyncRequested, Reason: "requested by tidemark resync"}
		if err := d.sink.SetTableState(ctx, source, st); err != nil {
			log.Error("resync request failed", "table", id.String(), "err", err)
			return exitFailed
		}
		fmt.Fprintf(stdout, "%s: resync requested from the running daemon\n", id)
	}
	if wait <= 0 {
		return exitOK
	}
	deadline := time.Now().Add(wait)
	pending := map[tidemark.TableID]bool{}
	for _, id := range ids {
		pending[id] = true
	}
	for len(pending) > 0 {
		states, err := d.sink.TableStates(ctx, source)
		if err != nil {
			log.Error("read table states failed", "err", err)
			return exitFailed
		}
		for _, st := range states {
			if !pending[st.Table] || !st.UpdatedAt.After(requested) {
				continue
			}
			switch st.Mode {
			case tidemark.TableStreaming:
				fmt.Fprintf(stdout, "%s: resynced; streaming from version %s on\n", st.Table, st.Floor)
				delete(pending, st.Table)
			case tidemark.TableQuarantined:
				fmt.Fprintf(stdout, "%s: resync failed, quarantined again: %s\n", st.Table, st.Reason)
				return exitFailed
			}
		}
		if len(pending) == 0 {
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(stdout, "still waiting after %s; the daemon performs the resync when it can (see tidemark status)\n", wait)
			return exitFailed
		}
		select {
		case <-ctx.Done():
			return exitFailed
		case <-time.After(500 * time.Millisecond):
		}
	}
	return exitOK
}
