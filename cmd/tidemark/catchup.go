package main

import (
	"context"
	"flag"
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

// catchupCmd is `tidemark catchup`: the fallback catch-up by hand. Without
// --table it catches every table up and moves the checkpoint to the
// captured position; with --table it catches those tables up and leaves
// the checkpoint alone.
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
type catchupCmd struct {
	cmdBase
	tables     stringList
	noDaemon   bool
	only       []tidemark.TableID
	cpuProfile string
}

func (c *catchupCmd) parseFlags(args []string) error {
	err := c.parseConfig(args, func(fs *flag.FlagSet) {
		fs.Var(&c.tables, "table", "db.table to catch up (repeatable); default all, moving the checkpoint")
		fs.BoolVar(&c.noDaemon, "no-daemon", false, "with Kafka alone (no PostgreSQL lock to check): state that no daemon streams the source")
		fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the catch-up to this file")
	})
	if err != nil {
		return err
	}
	for _, t := range c.tables {
		id, err := tidemark.ParseTableID(t)
		if err != nil {
			return fmt.Errorf("tidemark catchup: --table: %v", err)
		}
		c.only = append(c.only, id)
	}
	return nil
}

func (c *catchupCmd) run(ctx context.Context) int {
	if c.cpuProfile != "" {
		stop, err := startCPUProfile(c.cpuProfile)
		if err != nil {
			fmt.Fprintf(c.stderr, "tidemark catchup: start CPU profile: %v\n", err)
			return exitUsage
		}
		defer stop()
	}
	d, err := openCatchUp(ctx, c.cfg, c.log, c.stderr)
	if err != nil {
		return c.fail("start failed", err)
	}
	defer d.Close()
	catchUp, err := d.needCatchUp("tidemark catchup")
	if err != nil {
		fmt.Fprintln(c.stderr, err)
		return exitUsage
	}
	source := c.cfg.Source.Name
	// The source's lock: the state target's (PostgreSQL's), also in the
	// scale-out topology where the tailer holds it (tailerTarget).
	if locker, ok := d.target.(tidemark.SourceLocker); ok {
		release, free, err := locker.TryLockSource(ctx, source)
		if err != nil {
			return c.fail("catch-up failed", err)
		}
		if !free {
			fmt.Fprintf(c.stderr, "tidemark catchup: a tidemark daemon is streaming source %s: a catch-up beside it could bring back rows it deletes. Stop the daemon first, or resync the table while it runs (tidemark resync --table db.t): the daemon carries that out safely\n", source)
			return exitFailed
		}
		// Held for the whole catch-up: a daemon starting meanwhile waits.
		defer release()
	} else if !c.noDaemon {
		fmt.Fprintf(c.stderr, "tidemark catchup: with Kafka alone tidemark cannot check that no daemon streams source %s, and a catch-up beside one could bring back rows it deletes: stop the daemon, then run again with --no-daemon\n", source)
		return exitUsage
	}
	// No daemon streams the source: the catch-up writes as the daemon
	// does, taking over the Kafka transactional id first, which makes the
	// broker finish a transaction a killed daemon left open (a checkpoint
	// read before that would wait for it, then fail).
	if a, ok := d.target.(tidemark.Activator); ok {
		if err := a.Activate(ctx); err != nil {
			return c.fail("catch-up failed", err)
		}
	}
	var rep fallback.Report
	if len(c.only) == 0 {
		if what, err := c.acceptServer(ctx, d); err != nil {
			return c.fail(what, err)
		}
		// Every table that is streaming (quarantined ones wait for a
		// resync), then the checkpoint.
		rep, err = catchUp.RunStreaming(ctx, d.reader, d.catchUpRegistry(), d.target)
	} else {
		rep, err = catchUp.RunReport(ctx, c.only)
		if reg := d.catchUpRegistry(); err == nil && reg != nil {
			// The loads dropped the tables' mirrored unique
			// constraints: built again now (a violation quarantines).
			err = catchUp.MirrorAfterLoad(ctx, rep, d.reader, reg)
		}
	}
	fallback.SortReport(&rep)
	printCatchupReport(c.stdout, rep)
	if err != nil {
		return c.fail("catch-up failed", err)
	}
	return exitOK
}

// acceptServer checks the server the source reaches now against the
// stored checkpoint before every table is caught up: when it is not the one
// the checkpoint was read from (a failover tidemark refused to follow, a
// reset binlog), the catch-up writes its rows in the next epoch, so they
// win over everything written before. On failure what names the step.
func (c *catchupCmd) acceptServer(ctx context.Context, d *daemon) (what string, err error) {
	stored, ok, err := d.target.Checkpoint(ctx, c.cfg.Source.Name)
	if err != nil {
		return "read checkpoint failed", err
	}
	if !ok {
		return "", nil
	}
	id, epoch, err := d.tailer.Accept(ctx, stored)
	if err != nil {
		return "catch-up failed", err
	}
	if epoch != stored.Epoch {
		c.log.Warn("the source is not the server the checkpoint was read from: catching up in a new epoch", "checkpoint", stored.String(), "server", id.String(), "epoch", epoch)
	}
	return "", nil
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
