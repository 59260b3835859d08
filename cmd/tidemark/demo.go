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

// demoCmd is `tidemark demo`: it replicates a demo workload on the local
// services (scripts/services.sh) and prints a source-versus-target
// comparison. It exits 0 only when the target equals the source.
type demoCmd struct {
	cmdBase
	steps  int
	source string
}

func (c *demoCmd) parseFlags(args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	fs.IntVar(&c.steps, "steps", 1500, "workload transactions per phase")
	verbose := fs.Bool("v", false, "log at debug level")
	fs.StringVar(&c.source, "source", "mariadb", "the local source to replicate: mariadb, or mysql (the real MySQL 9.7 of scripts/services.sh)")
	if err := fs.Parse(args); err != nil {
		return errPrinted
	}
	if c.source != binlog.FlavorMariaDB && c.source != binlog.FlavorMySQL {
		return fmt.Errorf("demo: -source %q is not mariadb or mysql", c.source)
	}
	level := "warn"
	if *verbose {
		level = "debug"
	}
	c.setLogger(LogConfig{Level: level})
	return nil
}

func (c *demoCmd) run(ctx context.Context) int {
	if err := demo(ctx, c.source, c.steps, DefaultMetricsListen, c.log, c.stdout, c.stderr); err != nil {
		fmt.Fprintln(c.stderr, "demo failed:", err)
		return exitFailed
	}
	return exitOK
}

const (
	demoDB     = "tidemark_demo"
	demoSource = "demo"
	demoZone   = "Asia/Kolkata"
)

// demoRun is one run of the demo: the local services, the workload, and
// the daemon replicating it.
type demoRun struct {
	out      io.Writer
	progress io.Writer
	log      *slog.Logger
	env      workload.Env
	flavor   string
	lab      *workload.Lab
	w        *workload.Workload
	start    tidemark.Position
	d        *daemon
	src      *source
	changes  atomic.Int64
	total    tidemark.ApplyStats
	// done receives the pipeline's end.
	done chan error
	// snapRows and snapTook are the first run's snapshot (a source with
	// no GTID to start from).
	snapRows, snapTook atomic.Int64
}

// demo runs the demo with steps workload transactions per phase from the
// local source of flavor (mariadb or mysql); its status page listens on
// listen, or on any free port when that is taken. A first run's snapshot
// draws its progress bars on progress (a terminal).
func demo(ctx context.Context, flavor string, steps int, listen string, log *slog.Logger, out, progress io.Writer) error {
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
	r := &demoRun{out: out, progress: progress, log: log, env: env, flavor: flavor, lab: lab, done: make(chan error, 1)}
	fmt.Fprintf(out, "tidemark demo: %s %s → PostgreSQL, source zone %s\n\n", env.ServerName(), env.MySQLAddr, demoZone)
	if err := r.backlog(ctx, steps); err != nil {
		return err
	}
	var cl closers
	defer cl.close()
	if err := r.startDaemon(ctx, listen, &cl); err != nil {
		return err
	}
	if err := r.stream(ctx, steps, &cl); err != nil {
		return err
	}
	return r.verify(ctx)
}

// backlog is phase 1's workload: a clean slate (the demo's target schema
// and checkpoint), then a backlog written while tidemark is not running.
func (r *demoRun) backlog(ctx context.Context, steps int) error {
	if err := r.lab.ResetTarget(ctx, demoDB, checkpoint.DefaultSchema, demoSource); err != nil {
		return err
	}
	var err error
	if r.start, err = r.lab.Position(); err != nil {
		return err
	}
	r.w = r.lab.Workload(demoDB, demoZone, rand.New(rand.NewPCG(42, 7)))
	if err := r.w.Setup(); err != nil {
		return err
	}
	t0 := time.Now()
	if err := r.w.Run(steps); err != nil {
		return err
	}
	fmt.Fprintf(r.out, "phase 1: wrote a backlog of %d transactions (%d inserts, %d updates, %d deletes) in %s\n",
		r.w.Stats.Transactions, r.w.Stats.Inserts, r.w.Stats.Updates, r.w.Stats.Deletes, time.Since(t0).Round(time.Millisecond))
	return nil
}

// startDaemon assembles the daemon for the demo's source, the source
// verifier and the status page (each pushed on cl).
func (r *demoRun) startDaemon(ctx context.Context, listen string, cl *closers) error {
	cfg := &Config{
		Source: SourceConfig{Name: demoSource, Flavor: r.flavor, Addr: r.env.MySQLAddr, User: r.env.MySQLUser, Password: r.env.MySQLPassword,
			ServerID: 4201, TimeZone: demoZone, Include: []string{demoDB + ".*"}, StartPosition: r.start.String()},
		Target: TargetConfig{Postgres: &PostgresConfig{DSN: r.env.PGDSN}},
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	m := NewMetrics()
	page := status.NewPage(status.Identity{Name: demoSource, Flavor: r.flavor, Addr: r.env.MySQLAddr, ServerID: 4201, Version: buildVersion()},
		pageSources(cfg, m, func() (*daemon, *binlog.Verifier) {
			if r.src == nil {
				return r.d, nil
			}
			return r.d, r.src.verifier
		}))
	d, err := assemble(ctx, cfg, r.log, r.progress, func(b *tidemark.Batch, s tidemark.ApplyStats, took time.Duration) {
		r.changes.Add(int64(len(b.Changes)))
		r.total.Add(s)
		m.OnApply(b, s, took)
		page.OnApply(b, s, took)
	})
	if err != nil {
		return err
	}
	r.d = d
	cl.push(d.Close)
	if r.src, err = openSource(cfg, r.log, useVerifier, cl); err != nil {
		return err
	}
	m.SetStatusPage(page)
	return r.servePage(ctx, m, listen, cl)
}

// servePage serves the status page while the demo runs: on the daemon's
// default address, or any free port when that one is taken.
func (r *demoRun) servePage(ctx context.Context, m *Metrics, listen string, cl *closers) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return fmt.Errorf("listen for the status page: %w", err)
		}
	}
	pageCtx, stopPage := context.WithCancel(ctx)
	pageDone := make(chan error, 1)
	go func() { pageDone <- m.ServeOn(pageCtx, ln, nil, r.log) }()
	cl.push(func() error { stopPage(); return <-pageDone })
	fmt.Fprintf(r.out, "status page: http://%s/ (while the demo runs; `tidemark run` serves it next to /metrics)\n\n", ln.Addr())
	return nil
}

// stream runs the pipeline: phase 1 drains the backlog (or, from a
// source with no GTID yet, a fresh server, snapshots the tables instead of
// replaying the binlog, and the report says so); phase 2 replicates live
// while the workload runs.
func (r *demoRun) stream(ctx context.Context, steps int, cl *closers) error {
	t1 := time.Now()
	r.d.afterCatchUp = func(_ context.Context, _ time.Time, rows map[string]int64) error {
		for _, n := range rows {
			r.snapRows.Add(n)
		}
		r.snapTook.Store(int64(time.Since(t1)))
		return nil
	}
	runCtx, stop := context.WithCancel(ctx)
	cl.push(func() error { stop(); return nil })
	go func() { r.done <- r.d.pipeline.Run(runCtx, r.d.start) }()
	if err := r.caughtUp(ctx); err != nil {
		return err
	}
	r.reportPhase1(time.Since(t1))

	before := r.changes.Load()
	t2 := time.Now()
	if err := r.w.Run(steps / 3); err != nil {
		return err
	}
	if err := r.caughtUp(ctx); err != nil {
		return err
	}
	fmt.Fprintf(r.out, "phase 2: streamed %d more changes live; caught up %s after the workload started\n",
		r.changes.Load()-before, time.Since(t2).Round(time.Millisecond))
	stop()
	if err := <-r.done; err != nil {
		return fmt.Errorf("pipeline: %w", err)
	}
	fmt.Fprintf(r.out, "applied by streaming: inserted %d, updated %d, deleted %d, skipped by version guard %d, coalesced in batch %d\n\n",
		r.total.Inserted, r.total.Updated, r.total.Deleted, r.total.Skipped, r.total.Coalesced)
	return nil
}

// caughtUp waits until the pipeline has committed the source's position.
func (r *demoRun) caughtUp(ctx context.Context) error {
	target, err := r.lab.Position()
	if err != nil {
		return err
	}
	return waitOrFail(ctx, r.d, target, r.done)
}

// reportPhase1 prints phase 1's rate, el after the pipeline started.
func (r *demoRun) reportPhase1(el time.Duration) {
	n := r.changes.Load()
	if took := time.Duration(r.snapTook.Load()); took > 0 {
		rows := r.snapRows.Load()
		fmt.Fprintf(r.out, "phase 1: the source had no GTID to start from (a fresh server), so tidemark took a snapshot instead of replaying the binlog: %d rows in %s = %.0f rows/s; then streamed %d changes (caught up after %s)\n",
			rows, took.Round(time.Millisecond), float64(rows)/took.Seconds(), n, el.Round(time.Millisecond))
		return
	}
	fmt.Fprintf(r.out, "phase 1: tidemark drained the backlog: %d changes in %s = %.0f changes/s (batches of ≤5000, COPY + version-guarded upsert + checkpoint per transaction)\n",
		n, el.Round(time.Millisecond), float64(n)/el.Seconds())
}

// verify is what `tidemark verify` does, on the demo's table — checksums
// of chunks of rows computed inside each database, the rows of a chunk
// that differs compared one by one, the business keys checked for
// duplicates, and COUNT(*) and SUM(amount) per UTC day of updated_at —
// then the IST row.
func (r *demoRun) verify(ctx context.Context) error {
	out := r.out
	table := tidemark.TableID{Database: demoDB, Name: "orders"}
	vc := VerifyConfig{Tables: map[string]VerifyTableConfig{table.String(): {EventTime: "updated_at", Sums: []string{"amount"}}}}
	rep, err := verify.Tables(ctx, r.src.verifier, r.d.state.verifier, verifyOptions(r.src.cfg, "", vc, []tidemark.TableID{table}, 0, r.log, nil))
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "verification (as `tidemark verify` does it: checksums per chunk inside each database, duplicate keys, COUNT(*) and SUM(amount) per UTC day):")
	printVerify(out, rep)

	srcWall, tgt, err := r.lab.Incident(ctx, demoDB, demoDB)
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
