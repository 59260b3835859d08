// Command tidemark is a change-data-capture daemon: it tails a MySQL or
// MariaDB binlog and applies UTC-normalized, version-guarded changes to
// PostgreSQL, committing each batch with its checkpoint.
//
// Usage:
//
//	tidemark run --config tidemark.yaml   replicate until SIGINT/SIGTERM
//	tidemark checkpoint --config F        print the stored checkpoint
//	tidemark catchup --config F [--table] catch up with bounded reads
//	tidemark resync --config F --table T  re-snapshot a (quarantined) table
//	tidemark verify --config F            compare source and target in-database
//	tidemark status --config F            positions, retention headroom, lag
//	tidemark doctor --config F            check every source/target prerequisite
//	tidemark plan --config F              print the target DDL, run nothing
//	tidemark demo                         run the demo on the local services
//	tidemark version                      print the version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/pprof"
	"syscall"
	"time"
	_ "time/tzdata" // time zones work on a machine without zoneinfo

	"golang.org/x/sync/errgroup"

	"tidemark"
	"tidemark/binlog"
	"tidemark/checkpoint"
	"tidemark/dedupe"
	"tidemark/fallback"
	"tidemark/sink/kafka"
	"tidemark/sink/postgres"
	"tidemark/verify"
)

// version and commit are set with -ldflags "-X main.version=… -X
// main.commit=…" (make build, deploy/Containerfile). Without commit, the
// VCS revision Go stamps into the build (go build in a git checkout) is
// used.
var (
	version = "dev"
	commit  = ""
)

// Exit codes.
const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
)

func main() {
	tuneGC()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// tuneGC trades memory the pipeline bounds anyway for CPU the database
// needs: GOGC=400 with a 200 MiB soft limit, unless GOGC / GOMEMLIMIT are
// set in the environment. The live heap is bounded (chunks, one batch, a
// small decode cache), so the limit is only approached under bursts.
func tuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(200 << 20)
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, `usage: tidemark <command> [flags]

commands:
  run --config FILE          replicate until SIGINT/SIGTERM, then commit what was read and exit 0
                             (with an apply section: the source's tailer, publishing to Kafka)
  apply --config FILE        a member of the apply group: Kafka change topics → PostgreSQL
  checkpoint --config FILE   print the checkpoint stored in the target
  catchup --config FILE [--table db.t]...
                             catch up with bounded reads (all tables: moves the checkpoint;
                             run it while the daemon is stopped)
  resync --config FILE --table db.t [--wait 30m]
                             re-snapshot a table (e.g. a quarantined one) and stream it again;
                             asks the running daemon, or does it itself when none runs
  verify --config FILE [--table db.t]... [--since 24h] [--json]
                             compare source and target; exit 0 equal, 1 different, 2 error
  doctor --config FILE       check every prerequisite of source and target (ok / warn / fix);
                             exit 0 when nothing needs a fix, 1 otherwise
  status --config FILE [--json]
                             checkpoint, binlog retention headroom, per-table watermark/mode/lag
  plan --config FILE         print the DDL tidemark would run on the target (tables, NOT NULL,
                             mirrored indexes) without running it
  demo                       replicate a demo workload on the local services (make demo)
  version                    print the version`)
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch args[0] {
	case "version", "--version":
		fmt.Fprintln(stdout, "tidemark", buildVersion())
		return exitOK
	case "run":
		return cmdRun(ctx, args[1:], stderr)
	case "apply":
		return cmdApply(ctx, args[1:], stderr)
	case "checkpoint":
		return cmdCheckpoint(ctx, args[1:], stdout, stderr)
	case "catchup":
		return cmdCatchup(ctx, args[1:], stdout, stderr)
	case "resync":
		return cmdResync(ctx, args[1:], stdout, stderr)
	case "verify":
		return cmdVerify(ctx, args[1:], stdout, stderr, func(c *Config) VerifyConfig { return c.Verify })
	case "status":
		return cmdStatus(ctx, args[1:], stdout, stderr)
	case "doctor":
		return cmdDoctor(ctx, args[1:], stdout, stderr)
	case "plan":
		return cmdPlan(ctx, args[1:], stdout, stderr)
	case "demo":
		return cmdDemo(ctx, args[1:], stdout, stderr)
	case "help", "-h", "--help":
		usage(stdout)
		return exitOK
	}
	fmt.Fprintf(stderr, "tidemark: unknown command %q\n", args[0])
	usage(stderr)
	return exitUsage
}

func buildVersion() string {
	var settings []debug.BuildSetting
	goVersion := ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		settings, goVersion = bi.Settings, bi.GoVersion
	}
	return formatVersion(version, commit, settings, goVersion)
}

// formatVersion is "<version> (<commit, 12 digits>[, modified]) <go
// version>": the commit from -ldflags, else vcs.revision; "unknown commit"
// when neither is there.
func formatVersion(version, commit string, settings []debug.BuildSetting, goVersion string) string {
	modified := false
	if commit == "" {
		for _, s := range settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	v := version
	switch {
	case commit == "":
		v += " (unknown commit)"
	case modified:
		v += " (" + commit[:min(12, len(commit))] + ", modified)"
	default:
		v += " (" + commit[:min(12, len(commit))] + ")"
	}
	if goVersion != "" {
		v += " " + goVersion
	}
	return v
}

func newLogger(cfg LogConfig, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(orDefault(cfg.Level, "info")))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

type flagSet = flag.FlagSet

func loadConfigFlag(name string, args []string, stderr io.Writer) (*Config, *flag.FlagSet, error) {
	return loadConfigFlagWith(name, args, stderr, nil)
}

// loadConfigFlagWith parses --config plus the flags extra adds, and loads
// the config.
func loadConfigFlagWith(name string, args []string, stderr io.Writer, extra func(*flag.FlagSet)) (*Config, *flag.FlagSet, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "tidemark.yaml", "path to the YAML config")
	if extra != nil {
		extra(fs)
	}
	if err := fs.Parse(args); err != nil {
		return nil, fs, err
	}
	cfg, err := LoadConfig(*path)
	return cfg, fs, err
}

// daemon is the wired pipeline of one source.
type daemon struct {
	tailer *binlog.Tailer
	reader *binlog.Reader
	// sink is the PostgreSQL sink (table states, verify, status); target
	// is what the pipeline applies to: sink, or sink then Kafka.
	sink     *postgres.Sink
	target   tidemark.Sink
	pipeline *tidemark.Pipeline
	catchUp  *fallback.CatchUp
	dedupe   *dedupe.Window // nil when disabled
	start    tidemark.Position
	// afterCatchUp, if set, runs after every automatic catch-up (the
	// post-load assertion and metrics).
	afterCatchUp func(ctx context.Context, since time.Time, rowsByTable map[string]int64) error
	// onTableState, if set, receives table state changes (metrics).
	onTableState func(tidemark.TableState)
	// onCatchUp, if set, is called with true when an automatic catch-up
	// starts and with false when it ends (status page).
	onCatchUp func(running bool)
}

// wire builds the components from a validated config.
func wire(ctx context.Context, cfg *Config, log *slog.Logger, onApply func(*tidemark.Batch, tidemark.ApplyStats, time.Duration)) (*daemon, error) {
	bc, err := cfg.BinlogConfig()
	if err != nil {
		return nil, err
	}
	bc.Logger = log.With("component", "binlog", "source", bc.Name)
	tailer, err := binlog.New(bc)
	if err != nil {
		return nil, err
	}
	// sink is the PostgreSQL sink, nil with Kafka alone.
	var sink *postgres.Sink
	if cfg.Target.Postgres != nil {
		store, err := checkpoint.New(checkpoint.Config{Schema: cfg.Target.Postgres.ControlSchema})
		if err != nil {
			return nil, err
		}
		pc := cfg.PostgresSinkConfig()
		pc.Checkpoints = store
		pc.Logger = log.With("component", "postgres")
		if sink, err = postgres.Open(ctx, pc); err != nil {
			return nil, err
		}
	}
	// With an apply section this daemon is the source's tailer: it writes
	// Kafka only and uses PostgreSQL for the source's lock (one active
	// tailer, a standby waiting); the appliers write PostgreSQL.
	var lock *postgres.Sink
	if cfg.Apply != nil {
		lock, sink = sink, nil
	}
	closeSink := func() {
		if sink != nil {
			sink.Close()
		}
		if lock != nil {
			lock.Close()
		}
	}
	// The reader stamps what it captures with the epoch and identity the
	// tailer resolved (a catch-up after a reset binlog or failover).
	reader, err := binlog.NewReaderFor(tailer)
	if err != nil {
		closeSink()
		return nil, err
	}
	d := &daemon{}
	fc := cfg.FallbackSettings()
	fc.Logger = log.With("component", "fallback")
	bars := map[string]*Progress{}
	fc.Progress = func(p fallback.Progress) {
		name := p.Table.String()
		bar, ok := bars[name]
		if !ok {
			bar = NewProgress(os.Stderr, "catch-up "+name, -1, fc.Logger)
			bars[name] = bar
		}
		bar.Add(p.Rows - bar.Done())
		if p.Done {
			bar.Finish()
			delete(bars, name)
		}
	}
	// The pipeline's target: PostgreSQL, PostgreSQL then Kafka, or Kafka.
	var target tidemark.Sink
	switch {
	case cfg.Target.Kafka == nil:
		target = sink
	case sink == nil:
		kc := *cfg.Target.Kafka
		kc.ControlRecords = kc.ControlRecords || cfg.Apply != nil
		if target, err = withKafka(ctx, nil, &kc, bc.Name, log.With("component", "kafka")); err != nil {
			closeSink()
			return nil, err
		}
		if lock != nil {
			ks, _ := target.(*kafka.Sink)
			target = tailerTarget{Sink: target, kafka: ks, lock: lock, dropTable: cfg.Target.Postgres.DDL.DropTable == postgres.ApplyDDL}
		}
	default:
		if target, err = withKafka(ctx, sink, cfg.Target.Kafka, bc.Name, log.With("component", "kafka")); err != nil {
			sink.Close()
			return nil, err
		}
		// Table states, DDL and the source lock stay in PostgreSQL.
		target = fanoutWithStates{Sink: target, DDLSink: sink, SourceLocker: sink, TableRegistry: sink}
	}
	// What a resync or catch-up reads is stamped with the checkpoint's
	// epoch until the tailer has looked at the server itself.
	if stored, ok, err := target.Checkpoint(ctx, bc.Name); err != nil {
		target.Close()
		return nil, fmt.Errorf("read checkpoint of %s: %w", bc.Name, err)
	} else if ok {
		tailer.Seed(stored)
	}
	catchTarget, ok := target.(fallback.Target)
	if !ok {
		target.Close()
		return nil, errors.New("wire: the target cannot store catch-up watermarks")
	}
	var catchUp *fallback.CatchUp
	if sink != nil {
		catchUp, err = fallback.New(fc, reader, catchTarget, sink)
	} else {
		catchUp, err = fallback.New(fc, reader, catchTarget) // no key diff with Kafka alone
	}
	if err != nil {
		target.Close()
		return nil, err
	}
	// The catch-up as the pipeline runs it: then the post-load duplicate
	// assertion on the rows just loaded, and the metrics.
	runCatchUp := func(ctx context.Context) (tidemark.Position, error) {
		if d.onCatchUp != nil {
			d.onCatchUp(true)
			defer d.onCatchUp(false)
		}
		if sink == nil {
			// Kafka alone: no table states to honour, no assertion.
			rep, err := catchUp.RunReport(ctx, nil)
			return rep.Snapshot.Position, err
		}
		since, err := sink.Now(ctx)
		if err != nil {
			return tidemark.Position{}, err
		}
		rep, err := catchUp.RunStreaming(ctx, reader, sink, target)
		if err != nil {
			return rep.Snapshot.Position, err
		}
		if d.afterCatchUp != nil {
			rows := map[string]int64{}
			for _, t := range rep.Tables {
				rows[t.Table.String()] = t.Rows
			}
			if err := d.afterCatchUp(ctx, since, rows); err != nil {
				return rep.Snapshot.Position, err
			}
		}
		return rep.Snapshot.Position, nil
	}
	pc2 := tidemark.PipelineConfig{
		Source: bc.Name, MaxBatchChanges: cfg.Batch.MaxChanges, MaxBatchBytes: cfg.Batch.MaxBytes,
		MaxDelay: cfg.Batch.MaxDelay, Logger: log.With("component", "pipeline"), OnApply: onApply,
		OnTableState: func(st tidemark.TableState) {
			if d.onTableState != nil {
				d.onTableState(st)
			}
		},
	}
	if sink != nil {
		// New tables are snapshotted into PostgreSQL (it knows which
		// tables it has); with Kafka alone they are streamed from their
		// first change.
		pc2.Snapshot = catchUp.Snapshotter(reader, sink, nil)
	}
	if cfg.FallbackOn() {
		pc2.CatchUp = runCatchUp
	}
	var filter tidemark.Filter
	dc, on, err := cfg.DedupeSettings()
	if err != nil {
		target.Close()
		return nil, err
	}
	var window *dedupe.Window
	if on {
		dc.Logger = log.With("component", "dedupe")
		if window, err = dedupe.New(dc); err != nil {
			target.Close()
			return nil, err
		}
		filter = window
	}
	p, err := tidemark.NewPipeline(pc2, tailer, filter, target)
	if err != nil {
		target.Close()
		return nil, err
	}
	start, _ := tidemark.ParsePosition(cfg.Source.StartPosition)
	*d = daemon{tailer: tailer, reader: reader, sink: sink, target: target, pipeline: p, catchUp: catchUp, dedupe: window, start: start}
	return d, nil
}

// tailerTarget is the Kafka sink of the scale-out tailer, with the source's
// lock held in PostgreSQL (tidemark.SourceLocker), so that of two tailers
// of one source one streams and the other waits.
type tailerTarget struct {
	tidemark.Sink
	kafka *kafka.Sink
	lock  *postgres.Sink
	// dropTable is target.postgres.ddl.drop_table: apply.
	dropTable bool
}

// ApplyDDL implements tidemark.DDLSink for the appliers: a TRUNCATE, and a
// DROP TABLE when ddl.drop_table is apply, is published as a control record
// on every partition of the table's topic (each applier removes the rows
// older than it; for a DROP, the target table once none is left); an ALTER
// TABLE travels as the schema record of the next row. With ddl.drop_table:
// refuse (the default) a DROP TABLE quarantines the table in the tailer and
// the appliers keep its target rows, as without the topology.
func (t tailerTarget) ApplyDDL(ctx context.Context, source string, events []tidemark.DDLEvent, checkpoint tidemark.Position) error {
	for _, ev := range events {
		if ev.Op == tidemark.DDLDropTable && !t.dropTable {
			stmt := "DROP TABLE"
			if ev.Reason != "" {
				stmt += " (" + ev.Reason + ")"
			}
			return &tidemark.TableError{Table: ev.Table, Err: fmt.Errorf("%s refused by the configuration (ddl.drop_table: refuse); not published to the appliers, which keep the target table as it was: %w", stmt, tidemark.ErrDDLRefused)}
		}
	}
	if t.kafka == nil {
		return errors.New("apply DDL: the tailer's sink is not the Kafka sink")
	}
	return t.kafka.PublishDDL(ctx, source, events, checkpoint)
}

// TryLockSource implements tidemark.SourceLocker with the PostgreSQL lock.
func (t tailerTarget) TryLockSource(ctx context.Context, source string) (func(), bool, error) {
	return t.lock.TryLockSource(ctx, source)
}

// Activate implements tidemark.Activator.
func (t tailerTarget) Activate(ctx context.Context) error {
	if a, ok := t.Sink.(tidemark.Activator); ok {
		return a.Activate(ctx)
	}
	return nil
}

// Watermark implements tidemark.WatermarkStore (the Kafka sink's).
func (t tailerTarget) Watermark(ctx context.Context, source string, table tidemark.TableID) (time.Time, bool, error) {
	ws, ok := t.Sink.(tidemark.WatermarkStore)
	if !ok {
		return time.Time{}, false, errors.New("the tailer's sink cannot read watermarks")
	}
	return ws.Watermark(ctx, source, table)
}

// Close closes the Kafka sink and the lock's connections.
func (t tailerTarget) Close() error {
	return errors.Join(t.Sink.Close(), t.lock.Close())
}

// fanoutWithStates is the PostgreSQL + Kafka fan-out (tidemark.Fanout);
// table states, DDL and the per-source lock are PostgreSQL's.
type fanoutWithStates struct {
	tidemark.Sink
	tidemark.DDLSink
	tidemark.SourceLocker
	tidemark.TableRegistry
}

// Activate implements tidemark.Activator: it activates the fan-out (the
// Kafka sink's transactional producer), once the pipeline holds the lock.
func (f fanoutWithStates) Activate(ctx context.Context) error {
	if a, ok := f.Sink.(tidemark.Activator); ok {
		return a.Activate(ctx)
	}
	return nil
}

// Watermark implements tidemark.WatermarkStore: the oldest of the sinks'.
func (f fanoutWithStates) Watermark(ctx context.Context, source string, table tidemark.TableID) (time.Time, bool, error) {
	ws, ok := f.Sink.(tidemark.WatermarkStore)
	if !ok {
		return time.Time{}, false, errors.New("the fan-out cannot read watermarks")
	}
	return ws.Watermark(ctx, source, table)
}

func (d *daemon) Close() {
	d.tailer.Close()
	d.reader.Close()
	d.target.Close() // closes the PostgreSQL sink too
}

func cmdRun(ctx context.Context, args []string, stderr io.Writer) int {
	var cpuProfile string
	cfg, _, err := loadConfigFlagWith("run", args, stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file")
	})
	if err != nil {
		fmt.Fprintln(stderr, "tidemark:", err)
		return exitUsage
	}
	log := newLogger(cfg.Log, stderr)
	m := NewMetrics()
	// The status page (served with /metrics) reads the databases through
	// d and src, set below; it keeps the warnings and errors logged.
	var d *daemon
	var src *binlog.Verifier
	page := newStatusPage(sourceIdentity{Name: cfg.Source.Name, Flavor: orDefault(cfg.Source.Flavor, binlog.FlavorMariaDB),
		Addr: cfg.Source.Addr, ServerID: cfg.Source.ServerID, Version: buildVersion()}, statusSource{
		report: func(ctx context.Context) (*StatusReport, error) {
			if d == nil || d.sink == nil || src == nil {
				return nil, errors.New("no PostgreSQL target to read the status from (yet)")
			}
			return fullStatus(ctx, src, d.sink, cfg)
		},
		lastVerify: func(ctx context.Context) (tidemark.VerifyRun, bool, error) {
			if d == nil || d.sink == nil {
				return tidemark.VerifyRun{}, false, nil
			}
			return d.sink.LastVerifyRun(ctx, cfg.Source.Name)
		},
	}, m)
	log = slog.New(page.Tee(log.Handler()))
	// SIGINT and SIGTERM are already caught (run): from this line on they
	// stop the daemon cleanly.
	log.Info("starting", "source", cfg.Source.Name, "version", buildVersion())
	if cpuProfile != "" {
		stop, err := startCPUProfile(cpuProfile)
		if err != nil {
			log.Error("start CPU profile", "err", err)
			return exitUsage
		}
		defer stop()
	}
	var applied tidemark.ApplyStats
	last := time.Now()
	d, err = wire(ctx, cfg, log, func(b *tidemark.Batch, s tidemark.ApplyStats, took time.Duration) {
		m.OnApply(b, s, took)
		page.OnApply(b, s, took)
		applied.Add(s)
		if time.Since(last) >= 10*time.Second {
			last = time.Now()
			log.Info("applied", "inserted", applied.Inserted, "updated", applied.Updated, "deleted", applied.Deleted,
				"skipped", applied.Skipped, "coalesced", applied.Coalesced, "checkpoint", b.Checkpoint.String())
		}
	})
	if err != nil {
		log.Error("start failed", "err", err)
		return exitFailed
	}
	defer d.Close()
	if d.dedupe != nil {
		m.WatchDedupe(func(f func(string, uint64)) { d.dedupe.Stats().Each(f) })
	}
	if d.sink != nil {
		m.WatchDirectInserts(d.sink.DirectInserts)
	}
	bc, _ := cfg.BinlogConfig()
	bc.Logger = log.With("component", "verify")
	src, err = binlog.NewVerifier(bc)
	if err != nil {
		log.Error("start failed", "err", err)
		return exitFailed
	}
	defer src.Close()
	d.onTableState = tableStateMetric(m)
	d.onCatchUp = page.SetCatchUp
	m.SetStatusPage(page)
	g, gctx := errgroup.WithContext(ctx)
	if d.sink != nil {
		// The post-load duplicate assertion runs on PostgreSQL.
		as := verify.NewAsserter(d.sink, cfg.Verify.assert(), log.With("component", "assert"), m.Error)
		d.afterCatchUp = func(ctx context.Context, since time.Time, rows map[string]int64) error {
			m.FallbackRun(rows)
			return as.AfterLoad(ctx, since)
		}
		g.Go(func() error { return as.Run(gctx) })
	}
	g.Go(func() error { return m.Serve(gctx, cfg.Metrics, log.With("component", "metrics")) })
	if d.sink != nil && cfg.Metrics.Listen != "off" {
		g.Go(func() error { return page.WatchVerify(gctx, time.Minute) })
	}
	g.Go(func() error {
		return m.WatchRetention(gctx, cfg.Metrics.RetentionInterval, retentionProbe(src, d.target, cfg.Source.Name), log)
	})
	g.Go(func() error {
		err := d.pipeline.Run(gctx, d.start)
		m.Error(err)
		if err == nil {
			// A clean stop ends the helpers too.
			return context.Canceled
		}
		return err
	})
	err = g.Wait()
	if err != nil && !errors.Is(err, context.Canceled) {
		if errors.Is(err, tidemark.ErrPositionPurged) {
			log.Error("the source has purged the checkpoint's binlog position and the fallback is off; run `tidemark catchup` or enable fallback", "err", err)
		} else {
			log.Error("pipeline stopped", "err", err)
		}
		return exitFailed
	}
	total, pos := d.pipeline.Totals()
	log.Info("stopped cleanly", "checkpoint", pos.String(), "inserted", total.Inserted, "updated", total.Updated,
		"deleted", total.Deleted, "skipped", total.Skipped, "coalesced", total.Coalesced)
	return exitOK
}

func cmdCheckpoint(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, _, err := loadConfigFlag("checkpoint", args, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "tidemark:", err)
		return exitUsage
	}
	log := newLogger(cfg.Log, stderr)
	d, err := wire(ctx, cfg, log, nil)
	if err != nil {
		log.Error("start failed", "err", err)
		return exitFailed
	}
	defer d.Close()
	pos, ok, err := d.target.Checkpoint(ctx, cfg.Source.Name)
	if err != nil {
		log.Error("read checkpoint failed", "err", err)
		return exitFailed
	}
	if !ok {
		fmt.Fprintln(stdout, "no checkpoint for source", cfg.Source.Name)
		return exitOK
	}
	fmt.Fprintln(stdout, pos.String())
	return exitOK
}

// startCPUProfile writes a CPU profile to path until the returned function
// is called.
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("create CPU profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("start CPU profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
