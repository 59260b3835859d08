package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"tidemark"
	"tidemark/fallback"
)

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// cmdCatchup runs the fallback catch-up by hand. Without --table it catches
// every table up and moves the checkpoint to the captured position; with
// --table it catches those tables up and leaves the checkpoint alone.
//
// It runs only while no daemon streams the source, and holds the source's
// lock meanwhile (a daemon that starts waits for it). Beside a streaming
// daemon it could bring a deleted row back for good: the catch-up reads row
// K, the application deletes K, the daemon applies the delete, and the
// catch-up then writes K, stamped with its older captured version, with
// nothing left in the target for it to lose to. A table that needs a repair
// while the daemon runs is resynced (`tidemark resync`: the daemon carries
// it out between two batches, with a version floor). With Kafka alone there
// is no lock to check: --no-daemon states that no daemon runs.
func cmdCatchup(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var tables stringList
	var noDaemon bool
	cfg, fs, err := loadConfigFlagWith("catchup", args, stderr, func(fs *flagSet) {
		fs.Var(&tables, "table", "db.table to catch up (repeatable); default all, moving the checkpoint")
		fs.BoolVar(&noDaemon, "no-daemon", false, "with Kafka alone (no PostgreSQL lock to check): state that no daemon streams the source")
	})
	if err != nil {
		fmt.Fprintln(stderr, "tidemark:", err)
		return exitUsage
	}
	_ = fs
	log := newLogger(cfg.Log, stderr)
	d, err := wire(ctx, cfg, log, nil)
	if err != nil {
		log.Error("start failed", "err", err)
		return exitFailed
	}
	defer d.Close()
	var only []tidemark.TableID
	for _, t := range tables {
		id, err := tidemark.ParseTableID(t)
		if err != nil {
			fmt.Fprintf(stderr, "tidemark catchup: --table: %v\n", err)
			return exitUsage
		}
		only = append(only, id)
	}
	source := cfg.Source.Name
	catchUp, err := d.needCatchUp("tidemark catchup")
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitUsage
	}
	// The source's lock: the state target's (PostgreSQL's), also in the
	// scale-out topology where the tailer holds it (tailerTarget).
	if locker, ok := d.target.(tidemark.SourceLocker); ok {
		release, free, err := locker.TryLockSource(ctx, source)
		if err != nil {
			log.Error("catch-up failed", "err", err)
			return exitFailed
		}
		if !free {
			fmt.Fprintf(stderr, "tidemark catchup: a tidemark daemon is streaming source %s: a catch-up beside it could bring back rows it deletes. Stop the daemon first, or resync the table while it runs (tidemark resync --table db.t): the daemon carries that out safely\n", source)
			return exitFailed
		}
		// Held for the whole catch-up: a daemon starting meanwhile waits.
		defer release()
	} else if !noDaemon {
		fmt.Fprintf(stderr, "tidemark catchup: with Kafka alone tidemark cannot check that no daemon streams source %s, and a catch-up beside one could bring back rows it deletes: stop the daemon, then run again with --no-daemon\n", source)
		return exitUsage
	}
	// No daemon streams the source: the catch-up writes as the daemon
	// does, taking over the Kafka transactional id first, which makes the
	// broker finish a transaction a killed daemon left open (a checkpoint
	// read before that would wait for it, then fail).
	if a, ok := d.target.(tidemark.Activator); ok {
		if err := a.Activate(ctx); err != nil {
			log.Error("catch-up failed", "err", err)
			return exitFailed
		}
	}
	var rep fallback.Report
	if len(only) == 0 {
		// The catch-up re-reads every table from the server the source
		// reaches now: when that server is not the one the checkpoint was
		// read from (a failover tidemark refused to follow, a reset
		// binlog), its rows are written in the next epoch, so they win
		// over everything written before.
		// err, not a new one: the catch-up's error below must reach the
		// exit code (a shadowed err made a failed catch-up exit 0).
		var stored tidemark.Position
		var ok bool
		stored, ok, err = d.target.Checkpoint(ctx, cfg.Source.Name)
		if err != nil {
			log.Error("read checkpoint failed", "err", err)
			return exitFailed
		}
		if ok {
			id, epoch, err := d.tailer.Accept(ctx, stored)
			if err != nil {
				log.Error("catch-up failed", "err", err)
				return exitFailed
			}
			if epoch != stored.Epoch {
				log.Warn("the source is not the server the checkpoint was read from: catching up in a new epoch", "checkpoint", stored.String(), "server", id.String(), "epoch", epoch)
			}
		}
		// Every table that is streaming (quarantined ones wait for a
		// resync), then the checkpoint.
		rep, err = catchUp.RunStreaming(ctx, d.reader, d.registry, d.target)
	} else {
		rep, err = catchUp.RunReport(ctx, only)
	}
	fallback.SortReport(&rep)
	printCatchupReport(stdout, rep)
	if err != nil {
		log.Error("catch-up failed", "err", err)
		return exitFailed
	}
	return exitOK
}

func printCatchupReport(w io.Writer, rep fallback.Report) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "table\tmode\twindow (UTC)\trows read\tinserted\tupdated\tskipped\tdeleted (keydiff)\tbeyond upper bound")
	for _, t := range rep.Tables {
		win := "-"
		if !t.Upper.IsZero() {
			lo := "start"
			if !t.Lower.IsZero() {
				lo = t.Lower.Format(time.RFC3339)
			}
			win = "(" + lo + ", " + t.Upper.Format(time.RFC3339) + "]"
		}
		del := "not checked"
		if t.DeletesChecked {
			del = fmt.Sprint(t.Deletes)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%d\n", t.Table, t.Mode, win, t.Rows, t.Applied.Inserted, t.Applied.Updated, t.Applied.Skipped, del, t.BeyondUpper)
	}
	tw.Flush()
	fmt.Fprintf(w, "resume position: %s (took %s)\n", rep.Snapshot.Position, rep.Took.Round(time.Millisecond))
}
