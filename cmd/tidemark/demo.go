package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"time"

	"tidemark"
	"tidemark/binlog"
	"tidemark/checkpoint"
	"tidemark/internal/workload"
	"tidemark/status"
	"tidemark/verify"
)

// cmdDemo replicates a demo workload on the local services (scripts/
// services.sh) and prints a source-versus-target comparison. It exits 0
// only when the target equals the source.
func cmdDemo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	steps := fs.Int("steps", 1500, "workload transactions per phase")
	verbose := fs.Bool("v", false, "log at debug level")
	source := fs.String("source", "mariadb", "the local source to replicate: mariadb, or mysql (the real MySQL 9.7 of scripts/services.sh)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if *source != binlog.FlavorMariaDB && *source != binlog.FlavorMySQL {
		fmt.Fprintf(stderr, "demo: -source %q is not mariadb or mysql\n", *source)
		return exitUsage
	}
	level := "warn"
	if *verbose {
		level = "debug"
	}
	log := newLogger(LogConfig{Level: level}, stderr)
	if err := demo(ctx, *source, *steps, DefaultMetricsListen, log, stdout); err != nil {
		fmt.Fprintln(stderr, "demo failed:", err)
		return exitFailed
	}
	return exitOK
}

const (
	demoDB     = "tidemark_demo"
	demoSource = "demo"
	demoZone   = "Asia/Kolkata"
)

// demo runs the demo with steps workload transactions per phase from the
// local source of flavor (mariadb or mysql); its status page listens on
// listen, or on any free port when that is taken.
func demo(ctx context.Context, flavor string, steps int, listen string, log *slog.Logger, out io.Writer) error {
	env, err := workload.EnvFromOS()
	if err != nil {
		return err
	}
	if flavor == binlog.FlavorMySQL {
		if env, err = env.MySQL9(); err != nil {
			return err
		}
	}
	lab, err := workload.OpenLab(ctx, env)
	if err != nil {
		return err
	}
	defer lab.Close(ctx)

	fmt.Fprintf(out, "tidemark demo: %s %s → PostgreSQL, source zone %s\n\n", env.ServerName(), env.MySQLAddr, demoZone)
	// A clean slate: the demo's target schema and checkpoint.
	if err := lab.ResetTarget(ctx, demoDB, checkpoint.DefaultSchema, demoSource); err != nil {
		return err
	}
	start, err := lab.Position()
	if err != nil {
		return err
	}
	w := lab.Workload(demoDB, demoZone, rand.New(rand.NewPCG(42, 7)))
	if err := w.Setup(); err != nil {
		return err
	}

	// Phase 1: a backlog written while tidemark is not running.
	t0 := time.Now()
	if err := w.Run(steps); err != nil {
		return err
	}
	fmt.Fprintf(out, "phase 1: wrote a backlog of %d transactions (%d inserts, %d updates, %d deletes) in %s\n",
		w.Stats.Transactions, w.Stats.Inserts, w.Stats.Updates, w.Stats.Deletes, time.Since(t0).Round(time.Millisecond))

	cfg := &Config{
		Source: SourceConfig{Name: demoSource, Flavor: flavor, Addr: env.MySQLAddr, User: env.MySQLUser, Password: env.MySQLPassword,
			ServerID: 4201, TimeZone: demoZone, Include: []string{demoDB + ".*"}, StartPosition: start.String()},
		Target: TargetConfig{Postgres: &PostgresConfig{DSN: env.PGDSN}},
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	var changes atomic.Int64
	var total tidemark.ApplyStats
	m := NewMetrics()
	var d *daemon
	var src *binlog.Verifier
	page := status.NewPage(status.Identity{Name: demoSource, Flavor: flavor, Addr: env.MySQLAddr, ServerID: 4201, Version: buildVersion()},
		pageSources(cfg, m, func() (*daemon, *binlog.Verifier) { return d, src }))
	d, err = wire(ctx, cfg, log, func(b *tidemark.Batch, s tidemark.ApplyStats, took time.Duration) {
		changes.Add(int64(len(b.Changes)))
		total.Add(s)
		m.OnApply(b, s, took)
		page.OnApply(b, s, took)
	})
	if err != nil {
		return err
	}
	defer d.Close()
	bc, err := cfg.BinlogConfig()
	if err != nil {
		return err
	}
	if src, err = binlog.NewVerifier(bc); err != nil {
		return err
	}
	defer src.Close()
	m.SetStatusPage(page)
	// The status page, while the demo runs: on the daemon's default
	// address, or any free port when that one is taken.
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return fmt.Errorf("listen for the status page: %w", err)
		}
	}
	pageCtx, stopPage := context.WithCancel(ctx)
	pageDone := make(chan error, 1)
	go func() { pageDone <- m.ServeOn(pageCtx, ln, nil, log) }()
	defer func() { stopPage(); <-pageDone }()
	fmt.Fprintf(out, "status page: http://%s/ (while the demo runs; `tidemark run` serves it next to /metrics)\n\n", ln.Addr())
	// A source with no GTID yet (a fresh server) gives no start position:
	// the pipeline then snapshots the tables instead of replaying the
	// binlog, and the report says so.
	var snapRows atomic.Int64
	var snapTook atomic.Int64
	t1 := time.Now()
	d.afterCatchUp = func(_ context.Context, _ time.Time, rows map[string]int64) error {
		for _, n := range rows {
			snapRows.Add(n)
		}
		snapTook.Store(int64(time.Since(t1)))
		return nil
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- d.pipeline.Run(runCtx, d.start) }()
	target, err := lab.Position()
	if err != nil {
		return err
	}
	if err := waitOrFail(ctx, d, target, done); err != nil {
		return err
	}
	el := time.Since(t1)
	n := changes.Load()
	if took := time.Duration(snapTook.Load()); took > 0 {
		rows := snapRows.Load()
		fmt.Fprintf(out, "phase 1: the source had no GTID to start from (a fresh server), so tidemark took a snapshot instead of replaying the binlog: %d rows in %s = %.0f rows/s; then streamed %d changes (caught up after %s)\n",
			rows, took.Round(time.Millisecond), float64(rows)/took.Seconds(), n, el.Round(time.Millisecond))
	} else {
		fmt.Fprintf(out, "phase 1: tidemark drained the backlog: %d changes in %s = %.0f changes/s (batches of ≤5000, COPY + version-guarded upsert + checkpoint per transaction)\n",
			n, el.Round(time.Millisecond), float64(n)/el.Seconds())
	}

	// Phase 2: live replication while the workload runs.
	before := changes.Load()
	t2 := time.Now()
	if err := w.Run(steps / 3); err != nil {
		return err
	}
	target, err = lab.Position()
	if err != nil {
		return err
	}
	if err := waitOrFail(ctx, d, target, done); err != nil {
		return err
	}
	fmt.Fprintf(out, "phase 2: streamed %d more changes live; caught up %s after the workload started\n",
		changes.Load()-before, time.Since(t2).Round(time.Millisecond))
	stop()
	if err := <-done; err != nil {
		return fmt.Errorf("pipeline: %w", err)
	}
	fmt.Fprintf(out, "applied by streaming: inserted %d, updated %d, deleted %d, skipped by version guard %d, coalesced in batch %d\n\n",
		total.Inserted, total.Updated, total.Deleted, total.Skipped, total.Coalesced)

	// Verification: what `tidemark verify` does, on the demo's table —
	// checksums of chunks of rows computed inside each database, the rows
	// of a chunk that differs compared one by one, the business keys
	// checked for duplicates, and COUNT(*) and SUM(amount) per UTC day of
	// updated_at.
	table := tidemark.TableID{Database: demoDB, Name: "orders"}
	vc := VerifyConfig{Tables: map[string]VerifyTableConfig{table.String(): {EventTime: "updated_at", Sums: []string{"amount"}}}}
	rep, err := verify.Tables(ctx, src, d.state.verifier, verifyOptions(bc, "", vc, []tidemark.TableID{table}, 0, log, nil))
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "verification (as `tidemark verify` does it: checksums per chunk inside each database, duplicate keys, COUNT(*) and SUM(amount) per UTC day):")
	printVerify(out, rep)

	srcWall, tgt, err := lab.Incident(ctx, demoDB, demoDB)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nthe IST case: source DATETIME updated_at = '%s' (written in %s) → target timestamptz = %s\n", srcWall, demoZone, tgt.Format(time.RFC3339Nano))
	if want := time.Date(2026, 3, 10, 18, 28, 0, 0, time.UTC); !tgt.Equal(want) {
		return fmt.Errorf("the IST row arrived as %s, want %s", tgt, want)
	}
	if rep.ExitCode() != verify.ExitEqual {
		return fmt.Errorf("target differs from source: %s", rep.Run().Summary)
	}
	t := rep.Tables[0]
	fmt.Fprintf(out, "\nverification: EQUAL — %d rows on both sides, same keys, same values (row-level checksum), no duplicate business keys, same COUNT(*) and SUM(amount) on each of %d UTC days\n", t.SourceRows, t.Days)
	return nil
}

func waitOrFail(ctx context.Context, d *daemon, target tidemark.Position, done chan error) error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		_, last := d.pipeline.Totals()
		if c, err := (tidemark.Position{GTID: last.GTID}).Compare(target); err == nil && c >= 0 {
			return nil
		}
		select {
		case err := <-done:
			return fmt.Errorf("pipeline stopped: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not caught up to %s after 5 minutes (at %s)", target, last)
		}
	}
}
