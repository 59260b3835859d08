package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"tidemark"
	"tidemark/fallback"
)

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
	var ids []tidemark.TableID
	for _, t := range tables {
		id, err := tidemark.ParseTableID(t)
		if err != nil {
			fmt.Fprintf(stderr, "tidemark resync: --table: %v\n", err)
			return exitUsage
		}
		ids = append(ids, id)
	}
	log := newLogger(cfg.Log, stderr)
	d, err := wire(ctx, cfg, log, nil)
	if err != nil {
		log.Error("start failed", "err", err)
		return exitFailed
	}
	defer d.Close()
	catchUp, err := d.needCatchUp("tidemark resync")
	reg, err2 := need[fallback.Registry](d.state, "tidemark resync")
	locker, err3 := need[tidemark.SourceLocker](d.state, "tidemark resync")
	clock, err4 := need[tidemark.Clock](d.state, "tidemark resync")
	if tt, ok := d.target.(tailerTarget); ok {
		// The scale-out topology: the tailer's states, lock and clock;
		// its snapshot boundaries carry the resync to the appliers.
		reg, locker, clock, err2, err3, err4 = tt, tt, tt, nil, nil, nil
	}
	if err := errors.Join(err, err2, err3, err4); err != nil {
		fmt.Fprintln(stderr, err)
		return exitUsage
	}
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

	release, free, err := locker.TryLockSource(ctx, source)
	if err != nil {
		log.Error("resync failed", "err", err)
		return exitFailed
	}
	if free {
		// No daemon: resync here, holding the source's lock (a daemon
		// starting meanwhile waits for it).
		defer release()
		snap := catchUp.Snapshotter(d.reader, reg, func(rep fallback.Report) { printCatchupReport(stdout, rep) })
		for _, id := range ids {
			st, err := tidemark.Resnapshot(ctx, reg, source, id, snap, "resync requested")
			if err != nil {
				log.Error("resync failed; the table stays out of streaming until a resync succeeds", "table", id.String(), "err", err)
				return exitFailed
			}
			fmt.Fprintf(stdout, "%s: resynced; the daemon streams it from version %s on\n", id, st.Floor)
		}
		return exitOK
	}

	// A daemon is running: it performs the resync between two batches.
	requested, err := clock.Now(ctx)
	if err != nil {
		log.Error("resync failed", "err", err)
		return exitFailed
	}
	for _, id := range ids {
		st := tidemark.TableState{Table: id, Mode: tidemark.TableResyncRequested, Reason: "requested by tidemark resync"}
		if err := reg.SetTableState(ctx, source, st); err != nil {
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
		states, err := reg.TableStates(ctx, source)
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
