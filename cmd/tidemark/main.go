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
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"
	_ "time/tzdata" // time zones work on a machine without zoneinfo

	"golang.org/x/sync/errgroup"

	"tidemark"
	"tidemark/binlog"
	"tidemark/dedupe"
	"tidemark/fallback"
	"tidemark/sink/kafka"
	"tidemark/status"
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
	_ = level.UnmarshalText([]byte(cfg.level()))
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

// loadStateCommand starts a one-shot command that reads the source and
// the state target: it parses --config (and the flags extra adds), loads
// the config, checks that it has a state target (target.postgres), and
// returns the command's logger and the source's binlog config. On failure
// it has printed why and ok is false; exit is the exit code.
func loadStateCommand(name string, args []string, stderr io.Writer, extra func(*flag.FlagSet)) (cfg *Config, log *slog.Logger, bc binlog.Config, exit int, ok bool) {
	cfg, _, err := loadConfigFlagWith(name, args, stderr, extra)
	if err != nil {
		fmt.Fprintln(stderr, "tidemark:", err)
		return nil, nil, bc, exitUsage, false
	}
	if err := cfg.needPostgres(name); err != nil {
		fmt.Fprintln(stderr, err)
		return nil, nil, bc, exitUsage, false
	}
	log = newLogger(cfg.Log, stderr)
	if bc, err = cfg.BinlogConfig(); err != nil {
		fmt.Fprintln(stderr, "tidemark:", err)
		return nil, nil, bc, exitUsage, false
	}
	bc.Logger = log.With("component", "binlog")
	return cfg, log, bc, exitOK, true
}

// daemon is the wired pipeline of one source.
type daemon struct {
	tailer *binlog.Tailer
	reader *binlog.Reader
	// chunkReader reads the snapshots beside the stream (nil when they
	// run inside the apply loop).
	chunkReader *binlog.Reader
	// state is the target that keeps the source's state (table states,
	// verify, status: PostgreSQL); its sink is nil with Kafka alone and
	// in the scale-out tailer. target is what the pipeline applies to:
	// state, state then Kafka, or Kafka.
	state  stateTarget
	target tidemark.Sink
	// targetName names target's config sections (errors).
	targetName string
	// registry is state's table states and index mirror; nil when it has
	// none (Kafka alone): catch-ups then ignore table states, and new
	// tables are streamed from their first change.
	registry fallback.Registry
	pipeline *tidemark.Pipeline
	// catchUp is nil when the target cannot store catch-up watermarks
	// (wire refuses that when the fallback is on).
	catchUp *fallback.CatchUp
	dedupe  *dedupe.Window // nil when disabled
	start   tidemark.Position
	// afterCatchUp, if set, runs after every automatic catch-up (the
	// post-load assertion and metrics).
	afterCatchUp func(ctx context.Context, since time.Time, rowsByTable map[string]int64) error
	// onTableState, if set, receives table state changes (metrics).
	onTableState func(tidemark.TableState)
	// onCatchUp, if set, is called with true when an automatic catch-up
	// starts and with false when it ends (status page).
	onCatchUp func(running bool)
}

// needCatchUp returns the daemon's catch-up, or an error naming the
// target that cannot store catch-up watermarks.
func (d *daemon) needCatchUp(user string) (*fallback.CatchUp, error) {
	if d.catchUp == nil {
		return nil, fmt.Errorf("%s needs a target that stores catch-up watermarks (tidemark.WatermarkStore); %s does not", user, d.targetName)
	}
	return d.catchUp, nil
}

// targetName names the pipeline's target for an error message: the
// config sections it writes to.
func targetName(cfg *Config) string {
	var names []string
	if cfg.Target.Postgres != nil && cfg.Apply == nil {
		names = append(names, "target.postgres")
	}
	if cfg.Target.Kafka != nil {
		names = append(names, "target.kafka")
	}
	return strings.Join(names, " + ")
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
	state, err := openStateTarget(ctx, cfg, log, openDaemon)
	if err != nil {
		return nil, err
	}
	// With an apply section this daemon is the source's tailer: it writes
	// Kafka only and uses the state target for the source's lock (one
	// active tailer, a standby waiting); the appliers write the state
	// target.
	var lock stateTarget
	if cfg.Apply != nil {
		lock, state = state, stateTarget{}
	}
	closeSink := func() {
		state.Close()
		lock.Close()
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
	// The pipeline's target: the state target, it then Kafka, or Kafka.
	var target tidemark.Sink
	switch {
	case cfg.Target.Kafka == nil:
		target = state.sink
	case state.sink == nil:
		kc := *cfg.Target.Kafka
		kc.ControlRecords = kc.ControlRecords || cfg.Apply != nil
		if target, err = withKafka(ctx, nil, &kc, bc.Name, log.With("component", "kafka")); err != nil {
			closeSink()
			return nil, err
		}
		if lock.sink != nil {
			lk, err := need[lockTarget](lock, "the scale-out tailer's lock")
			if err != nil {
				target.Close()
				closeSink()
				return nil, err
			}
			ddl, _ := target.(ddlPublisher)
			snap, _ := target.(tidemark.SnapshotBoundary)
			tt := tailerTarget{Sink: target, ddl: ddl, snap: snap, lock: lk, dropTable: tailerDropsTables(cfg),
				resets: &resetTables{ids: map[tidemark.TableID]bool{}}}
			if cfg.Target.Postgres != nil {
				tt.schema = cfg.Target.Postgres.Schema
			}
			target = tt
		} else if ks, ok := target.(*kafka.Sink); ok && kc.ControlRecords {
			// Kafka alone with control records: TRUNCATE is published.
			target = kafkaWithDDL{Sink: ks, log: log.With("component", "kafka")}
		}
	default:
		// Table states, DDL and the source lock stay in the state target.
		ddl, err1 := need[tidemark.DDLSink](state, "a fan-out to Kafka")
		locker, err2 := need[tidemark.SourceLocker](state, "a fan-out to Kafka")
		reg, err3 := need[tidemark.TableRegistry](state, "a fan-out to Kafka")
		if err := errors.Join(err1, err2, err3); err != nil {
			closeSink()
			return nil, err
		}
		if target, err = withKafka(ctx, state.sink, cfg.Target.Kafka, bc.Name, log.With("component", "kafka")); err != nil {
			closeSink()
			return nil, err
		}
		fo := fanoutWithStates{Sink: target, DDLSink: ddl, SourceLocker: locker, TableRegistry: reg}
		if cfg.Target.Kafka.ControlRecords {
			// The fan-out's DDL and snapshots reach Kafka's consumers
			// too (control records).
			fo.kafka, _ = kafkaOf(target).(kafkaControl)
		}
		target = fo
	}
	// No epoch below the source's floor, whatever the checkpoint says (a
	// deleted or edited one, a start_position: docs/FAILOVER.md). The
	// floor is kept where the checkpoints are in PostgreSQL.
	if fs, ok := state.sink.(epochFloors); ok {
		floor, has, err := fs.EpochFloor(ctx, bc.Name)
		if err != nil {
			target.Close()
			return nil, fmt.Errorf("read epoch floor of %s: %w", bc.Name, err)
		}
		if has {
			tailer.SetEpochFloor(floor)
		}
	}
	// What a resync or catch-up reads is stamped with the checkpoint's
	// epoch until the tailer has looked at the server itself.
	if stored, ok, err := target.Checkpoint(ctx, bc.Name); err != nil {
		target.Close()
		return nil, fmt.Errorf("read checkpoint of %s: %w", bc.Name, err)
	} else if ok {
		tailer.Seed(stored)
	}
	// The catch-up needs a target that stores watermarks, and the state
	// target's key lists for a key diff (none with Kafka alone).
	var catchUp *fallback.CatchUp
	if tt, ok := target.(tailerTarget); ok && tt.snap != nil {
		// No key lists in the scale-out tailer's target: a full read
		// goes to the appliers between snapshot boundaries, so that they
		// remove the rows it did not carry (an interrupted first-run
		// snapshot's, rows deleted while the binlog was unavailable).
		fc.Boundaries = tt
	}
	if catchTarget, ok := target.(fallback.Target); ok {
		if keys, ok := state.sink.(tidemark.KeyTarget); ok {
			catchUp, err = fallback.New(fc, reader, catchTarget, keys)
		} else {
			catchUp, err = fallback.New(fc, reader, catchTarget)
		}
		if err != nil {
			target.Close()
			return nil, err
		}
	} else if cfg.FallbackOn() {
		target.Close()
		return nil, fmt.Errorf("wire: the fallback (fallback.enabled) needs a target that stores catch-up watermarks (tidemark.WatermarkStore); %s does not", targetName(cfg))
	}
	registry, _ := state.sink.(fallback.Registry)
	clock, _ := state.sink.(tidemark.Clock)
	// The catch-up as the pipeline runs it: then the post-load duplicate
	// assertion on the rows just loaded, and the metrics.
	runCatchUp := func(ctx context.Context) (tidemark.Position, error) {
		if d.onCatchUp != nil {
			d.onCatchUp(true)
			defer d.onCatchUp(false)
		}
		// The target's clock before loading: the post-load assertion
		// checks the rows loaded since then.
		var since time.Time
		if clock != nil {
			now, err := clock.Now(ctx)
			if err != nil {
				return tidemark.Position{}, err
			}
			since = now
		}
		rep, err := catchUp.RunStreaming(ctx, reader, registry, target)
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
		MaxDelay: cfg.Batch.MaxDelay, FlushWhenIdle: cfg.Batch.flushWhenIdle(), Logger: log.With("component", "pipeline"), OnApply: onApply,
		OnTableState: func(st tidemark.TableState) {
			if d.onTableState != nil {
				d.onTableState(st)
			}
		},
	}
	if registry != nil && catchUp != nil {
		// New tables are snapshotted into the state target (it knows
		// which tables it has); with Kafka alone they are streamed from
		// their first change.
		pc2.Snapshot = catchUp.Snapshotter(reader, registry, nil)
		if cfg.Target.Kafka == nil {
			// PostgreSQL alone: beside the stream, a chunk at a time,
			// on a reader of its own (with Kafka the snapshot stays
			// inside the apply loop).
			if d.chunkReader, err = binlog.NewReaderFor(tailer); err != nil {
				target.Close()
				return nil, err
			}
			pc2.Chunks = catchUp.Chunks(d.chunkReader, d.chunkReader, registry)
		}
	} else if tt, ok := target.(tailerTarget); ok && catchUp != nil {
		// The scale-out tailer snapshots for resyncs and backfills, its
		// rows between boundaries for the appliers (scaleout.go).
		pc2.Snapshot = catchUp.Snapshotter(reader, tt, nil)
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
	*d = daemon{tailer: tailer, reader: reader, chunkReader: d.chunkReader, state: state, target: target, targetName: targetName(cfg), registry: registry, pipeline: p, catchUp: catchUp, dedupe: window, start: start}
	return d, nil
}

func (d *daemon) Close() {
	d.tailer.Close()
	d.reader.Close()
	if d.chunkReader != nil {
		d.chunkReader.Close()
	}
	d.target.Close() // closes the PostgreSQL sink too
}

func cmdRun(ctx context.Context, args []string, stderr io.Writer) int {
	var cpuProfile, blockProfile, mutexProfile string
	cfg, _, err := loadConfigFlagWith("run", args, stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file")
		fs.StringVar(&blockProfile, "blockprofile", "", "write a goroutine blocking profile of the run to this file")
		fs.StringVar(&mutexProfile, "mutexprofile", "", "write a mutex contention profile of the run to this file")
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
	page := status.NewPage(status.Identity{Name: cfg.Source.Name, Flavor: orDefault(cfg.Source.Flavor, binlog.FlavorMariaDB),
		Addr: cfg.Source.Addr, ServerID: cfg.Source.ServerID, Version: buildVersion()},
		pageSources(cfg, m, func() (*daemon, *binlog.Verifier) { return d, src }))
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
	for _, p := range []struct{ name, path string }{{"block", blockProfile}, {"mutex", mutexProfile}} {
		if p.path == "" {
			continue
		}
		stop, err := startProfile(p.name, p.path)
		if err != nil {
			log.Error("start "+p.name+" profile", "err", err)
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
	if di, ok := d.state.sink.(directInserter); ok {
		m.WatchDirectInserts(di.DirectInserts)
	}
	bc, _ := cfg.BinlogConfig()
	bc.Logger = log.With("component", "verify")
	src, err = binlog.NewVerifier(bc)
	if err != nil {
		log.Error("start failed", "err", err)
		return exitFailed
	}
	defer src.Close()
	d.onTableState = m.WatchTableStates()
	d.onCatchUp = page.SetCatchUp
	m.SetStatusPage(page)
	g, gctx := errgroup.WithContext(ctx)
	if d.state.sink != nil {
		// The post-load duplicate assertion runs on the state target.
		at, err := need[tidemark.AssertTarget](d.state, "the post-load duplicate assertion")
		if err != nil {
			log.Error("start failed", "err", err)
			return exitFailed
		}
		as := verify.NewAsserter(at, cfg.Verify.assert(), log.With("component", "assert"), m.Error)
		d.afterCatchUp = func(ctx context.Context, since time.Time, rows map[string]int64) error {
			m.FallbackRun(rows)
			return as.AfterLoad(ctx, since)
		}
		g.Go(func() error { return as.Run(gctx) })
	}
	g.Go(func() error { return m.Serve(gctx, cfg.Metrics, log.With("component", "metrics")) })
	if d.state.sink != nil && cfg.Metrics.Listen != "off" {
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

// startProfile samples every blocking event (name "block") or every mutex
// contention ("mutex") until the returned function writes the profile to
// path.
func startProfile(name, path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("create %s profile: %w", name, err)
	}
	if name == "block" {
		runtime.SetBlockProfileRate(1)
	} else {
		runtime.SetMutexProfileFraction(1)
	}
	return func() {
		if err := pprof.Lookup(name).WriteTo(f, 0); err != nil {
			fmt.Fprintf(os.Stderr, "tidemark: write %s profile: %v\n", name, err)
		}
		f.Close()
	}, nil
}
