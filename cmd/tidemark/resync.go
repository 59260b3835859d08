package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"tidemark"
	"tidemark/fallback"
)

// resyncCmd is `tidemark resync`: it re-snapshots tables and resumes
// streaming them: the way back from quarantine (and a repair for any
// table). When no daemon is running for the source (its lock is free) it
// does the work itself; otherwise it asks the running daemon (state
// 'resync' in the tables control table) and waits for it to finish.
type resyncCmd struct {
	cmdBase
	tables stringList
	wait   time.Duration
	ids    []tidemark.TableID
}

func (c *resyncCmd) parseFlags(args []string) error {
	err := c.parseConfig(args, func(fs *flag.FlagSet) {
		fs.Var(&c.tables, "table", "db.table to re-snapshot (repeatable, required)")
		fs.DurationVar(&c.wait, "wait", 30*time.Minute, "with a daemon running: how long to wait for it to finish (0: request and return)")
	})
	if err != nil {
		return err
	}
	if len(c.tables) == 0 {
		return errors.New("tidemark resync: --table db.table is required")
	}
	if err := c.cfg.needPostgres("resync"); err != nil {
		return err
	}
	for _, t := range c.tables {
		id, err := tidemark.ParseTableID(t)
		if err != nil {
			return fmt.Errorf("tidemark resync: --table: %v", err)
		}
		c.ids = append(c.ids, id)
	}
	return nil
}

// resyncParts are the capabilities a resync uses: the state target's
// table states, lock and clock, or in the scale-out topology the
// tailer's (its snapshot boundaries carry the resync to the appliers).
type resyncParts struct {
	catchUp *fallback.CatchUp
	reg     fallback.Registry
	locker  tidemark.SourceLocker
	clock   tidemark.Clock
}

func (c *resyncCmd) run(ctx context.Context) int {
	d, err := openCatchUp(ctx, c.cfg, c.log, c.stderr)
	if err != nil {
		return c.fail("start failed", err)
	}
	defer d.Close()
	p, err := resyncPartsOf(d)
	if err != nil {
		fmt.Fprintln(c.stderr, err)
		return exitUsage
	}
	if exit, ok := c.checkTables(ctx, d); !ok {
		return exit
	}
	release, free, err := p.locker.TryLockSource(ctx, c.cfg.Source.Name)
	if err != nil {
		return c.fail("resync failed", err)
	}
	if free {
		// No daemon: resync here, holding the source's lock (a daemon
		// starting meanwhile waits for it).
		defer release()
		return c.resyncHere(ctx, d, p)
	}
	return c.request(ctx, p)
}

// resyncPartsOf returns what a resync needs of d, or one error naming all
// it lacks.
func resyncPartsOf(d *daemon) (resyncParts, error) {
	var p resyncParts
	var err [4]error
	p.catchUp, err[0] = d.needCatchUp("tidemark resync")
	p.reg, err[1] = need[fallback.Registry](d.state, "tidemark resync")
	p.locker, err[2] = need[tidemark.SourceLocker](d.state, "tidemark resync")
	p.clock, err[3] = need[tidemark.Clock](d.state, "tidemark resync")
	if tt, ok := d.target.(tailerTarget); ok {
		// The scale-out topology: the tailer's states, lock and clock;
		// its snapshot boundaries carry the resync to the appliers.
		p.reg, p.locker, p.clock, err[1], err[2], err[3] = tt, tt, tt, nil, nil, nil
	}
	return p, errors.Join(err[:]...)
}

// checkTables checks that every table asked for is in the source and
// replicated.
func (c *resyncCmd) checkTables(ctx context.Context, d *daemon) (exit int, ok bool) {
	present, err := d.reader.Tables(ctx)
	if err != nil {
		return c.fail("list source tables failed", err), false
	}
	for _, id := range c.ids {
		found := false
		for _, p := range present {
			found = found || p == id
		}
		if !found {
			fmt.Fprintf(c.stderr, "tidemark resync: %s: no such table in source %s, or not replicated (include/exclude)\n", id, c.cfg.Source.Name)
			return exitUsage, false
		}
	}
	return exitOK, true
}

// resyncHere re-snapshots the tables in this process (no daemon runs).
func (c *resyncCmd) resyncHere(ctx context.Context, d *daemon, p resyncParts) int {
	snap := p.catchUp.Snapshotter(d.reader, p.reg, func(rep fallback.Report) { printCatchupReport(c.stdout, rep) })
	for _, id := range c.ids {
		st, err := tidemark.Resnapshot(ctx, p.reg, c.cfg.Source.Name, id, snap, "resync requested")
		if err != nil {
			c.log.Error("resync failed; the table stays out of streaming until a resync succeeds", "table", id.String(), "err", err)
			return exitFailed
		}
		fmt.Fprintf(c.stdout, "%s: resynced; the daemon streams it from version %s on (resynced in this process: no daemon held the source's lock)\n", id, st.Floor)
	}
	return exitOK
}

// request asks the running daemon to resync the tables (it performs the
// resync between two batches) and waits up to --wait for it.
func (c *resyncCmd) request(ctx context.Context, p resyncParts) int {
	requested, err := p.clock.Now(ctx)
	if err != nil {
		return c.fail("resync failed", err)
	}
	for _, id := range c.ids {
		st := tidemark.TableState{Table: id, Mode: tidemark.TableResyncRequested, Reason: "requested by tidemark resync"}
		if err := p.reg.SetTableState(ctx, c.cfg.Source.Name, st); err != nil {
			c.log.Error("resync request failed", "table", id.String(), "err", err)
			return exitFailed
		}
		fmt.Fprintf(c.stdout, "%s: resync requested from the running daemon\n", id)
	}
	if c.wait <= 0 {
		return exitOK
	}
	return c.waitDone(ctx, p.reg, requested)
}

// waitDone waits until the daemon has resynced every table (set its state
// after requested), up to --wait.
func (c *resyncCmd) waitDone(ctx context.Context, reg fallback.Registry, requested time.Time) int {
	deadline := time.Now().Add(c.wait)
	pending := map[tidemark.TableID]bool{}
	for _, id := range c.ids {
		pending[id] = true
	}
	for len(pending) > 0 {
		states, err := reg.TableStates(ctx, c.cfg.Source.Name)
		if err != nil {
			return c.fail("read table states failed", err)
		}
		for _, st := range states {
			if !pending[st.Table] || !st.UpdatedAt.After(requested) {
				continue
			}
			switch st.Mode {
			case tidemark.TableStreaming:
				fmt.Fprintf(c.stdout, "%s: resynced; streaming from version %s on\n", st.Table, st.Floor)
				delete(pending, st.Table)
			case tidemark.TableQuarantined:
				fmt.Fprintf(c.stdout, "%s: resync failed, quarantined again: %s\n", st.Table, st.Reason)
				return exitFailed
			}
		}
		if len(pending) == 0 {
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(c.stdout, "still waiting after %s; the daemon performs the resync when it can (see tidemark status)\n", c.wait)
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
