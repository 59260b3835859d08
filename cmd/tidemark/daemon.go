package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"tidemark"
	"tidemark/binlog"
	"tidemark/dedupe"
	"tidemark/fallback"
	"tidemark/sink/kafka"
)

// daemon is the assembled pipeline of one source (pipeline and dedupe nil
// when only openCatchUp built it).
type daemon struct {
	tailer *binlog.Tailer
	reader *binlog.Reader
	// chunkReaders read the snapshots beside the stream, one per key
	// range read at once (snapshot.parallelism; none when they run
	// inside the apply loop).
	chunkReaders []tidemark.SnapshotSource
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
	// clock is state's clock (nil without one): the post-load assertion
	// checks the rows loaded since its reading before a catch-up.
	clock    tidemark.Clock
	pipeline *tidemark.Pipeline
	// catchUp is nil when the target cannot store catch-up watermarks
	// (assemble refuses that when the fallback is on).
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
	// cl closes what assemble opened (Close).
	cl closers
}

// assemble opens the source and the targets of a validated config and
// builds the pipeline from them. progress receives the catch-ups' progress
// bars (the command's stderr); onApply, if set, is called after every
// applied batch. The caller closes the daemon.
func assemble(ctx context.Context, cfg *Config, log *slog.Logger, progress io.Writer, onApply func(*tidemark.Batch, tidemark.ApplyStats, time.Duration)) (_ *daemon, err error) {
	d, err := openCatchUp(ctx, cfg, log, progress)
	if err != nil {
		return nil, err
	}
	defer d.cl.closeOnError(&err)
	_, tailer := d.target.(tailerTarget)
	if (d.registry != nil || tailer) && d.catchUp != nil {
		// A table's snapshot runs beside the stream, a chunk at a time,
		// on readers of their own: with PostgreSQL alone, the
		// PostgreSQL + Kafka fan-out and the scale-out tailer (whose
		// chunks reach the appliers between snapshot boundaries:
		// docs/SNAPSHOTS.md "Kafka"). Kafka alone keeps no table
		// states, so it has no such snapshots.
		for range cfg.snapshotParallelism() {
			r, err := openChunkReader(d.tailer, &d.cl)
			if err != nil {
				return nil, err
			}
			d.chunkReaders = append(d.chunkReaders, r)
		}
	}
	if d.dedupe, err = cfg.dedupeWindow(log); err != nil {
		return nil, err
	}
	var filter tidemark.Filter
	if d.dedupe != nil {
		filter = d.dedupe
	}
	if d.pipeline, err = tidemark.NewPipeline(d.pipelineConfig(cfg, log, onApply), d.tailer, filter, d.target); err != nil {
		return nil, err
	}
	d.start, _ = tidemark.ParsePosition(cfg.Source.StartPosition)
	return d, nil
}

// openCatchUp opens what a catch-up or a resync uses (`tidemark catchup`,
// `tidemark resync`, and the daemon): the source's tailer and reader, the
// targets, the tailer seeded from them, and the catch-up; not the
// pipeline nor the dedupe window. The caller closes the daemon.
func openCatchUp(ctx context.Context, cfg *Config, log *slog.Logger, progress io.Writer) (_ *daemon, err error) {
	d := &daemon{targetName: targetName(cfg)}
	defer d.cl.closeOnError(&err)
	src, err := openSource(cfg, log, useTailer|useReader, &d.cl)
	if err != nil {
		return nil, err
	}
	d.tailer, d.reader = src.tailer, src.reader
	if d.state, d.target, err = openPipelineTarget(ctx, cfg, log, openDaemon, &d.cl); err != nil {
		return nil, err
	}
	if err := d.seedTailer(ctx, src.cfg.Name); err != nil {
		return nil, err
	}
	if d.catchUp, err = newCatchUp(cfg, cfg.fallbackConfig(log, progress), d.reader, d.target, d.state); err != nil {
		return nil, err
	}
	d.registry, _ = d.state.sink.(fallback.Registry)
	d.clock, _ = d.state.sink.(tidemark.Clock)
	if cfg.Target.Kafka == nil && d.registry != nil && d.catchUp != nil {
		// PostgreSQL alone (safe for concurrent applies): a full read
		// of a table is split into snapshot.parallelism key ranges,
		// read at once on readers of their own.
		var extra []tidemark.SnapshotSource
		for range cfg.snapshotParallelism() - 1 {
			r, err := openChunkReader(d.tailer, &d.cl)
			if err != nil {
				return nil, err
			}
			extra = append(extra, r)
		}
		d.catchUp.SetReaders(extra)
	}
	return d, nil
}

// Close closes everything assemble or openCatchUp opened, the last
// opened first.
func (d *daemon) Close() error {
	return d.cl.close()
}

// catchUpRegistry is where an automatic catch-up reads and records the
// table states: the state target's, or the scale-out tailer's (kept in
// PostgreSQL beside its lock, as its pipeline does), so that a table the
// catch-up cannot follow (no primary key…) is quarantined there as the
// stream would, instead of stopping the tailer. Nil with Kafka alone.
func (d *daemon) catchUpRegistry() fallback.Registry {
	if d.registry != nil {
		return d.registry
	}
	if tt, ok := d.target.(tailerTarget); ok {
		return tt
	}
	return nil
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

// openPipelineTarget opens the state target and what the pipeline applies
// to (each pushed on cl): the state target, it then Kafka, or Kafka. With
// an apply section this process is the source's tailer: it writes Kafka
// only and uses the state target for the source's lock (one active
// tailer, a standby waiting); the appliers write the state target, and
// the returned state has no sink.
func openPipelineTarget(ctx context.Context, cfg *Config, log *slog.Logger, mode openMode, cl *closers) (stateTarget, tidemark.Sink, error) {
	state, err := openStateTarget(ctx, cfg, log, mode, cl)
	if err != nil {
		return stateTarget{}, nil, err
	}
	var lock stateTarget
	if cfg.Apply != nil {
		lock, state = state, stateTarget{}
	}
	var target tidemark.Sink
	switch {
	case cfg.Target.Kafka == nil:
		target = state.sink
	case state.sink == nil:
		target, err = kafkaTarget(ctx, cfg, lock, log, cl)
	default:
		target, err = fanoutTarget(ctx, cfg, state, log, cl)
	}
	if err != nil {
		return stateTarget{}, nil, err
	}
	return state, target, nil
}

// kafkaTarget opens Kafka as the pipeline's only target: the scale-out
// tailer's (with the source's lock in the state target lock), or Kafka
// alone.
func kafkaTarget(ctx context.Context, cfg *Config, lock stateTarget, log *slog.Logger, cl *closers) (tidemark.Sink, error) {
	kc := *cfg.Target.Kafka
	kc.ControlRecords = kc.ControlRecords || cfg.Apply != nil
	if so, ok := lock.sink.(streamOffsets); ok && cfg.Apply != nil {
		// A change topic's partition count that changed since the
		// tailer last published to it is accepted once the apply group
		// has applied the old partitions (kafka.Config.AppliedOffsets).
		kc.appliedOffsets = appliedOffsets(so, cfg.applierConfig(nil).Group)
		kc.partitionChangeWait = cfg.Apply.PartitionChangeWait
	}
	klog := log.With("component", "kafka")
	target, err := withKafka(ctx, nil, &kc, cfg.Source.Name, klog, cl)
	if err != nil {
		return nil, err
	}
	if lock.sink != nil {
		lk, err := need[lockTarget](lock, "the scale-out tailer's lock")
		if err != nil {
			return nil, err
		}
		ddl, _ := target.(ddlPublisher)
		snap, _ := target.(tidemark.SnapshotBoundary)
		tt := tailerTarget{Sink: target, ddl: ddl, snap: snap, lock: lk, dropTable: tailerDropsTables(cfg),
			resets: &resetTables{ids: map[tidemark.TableID]bool{}}}
		if cfg.Target.Postgres != nil {
			tt.schema = cfg.Target.Postgres.Schema
		}
		return tt, nil
	}
	if ks, ok := target.(*kafka.Sink); ok && kc.ControlRecords {
		// Kafka alone with control records: TRUNCATE is published.
		return kafkaWithDDL{Sink: ks, log: klog}, nil
	}
	return target, nil
}

// streamOffsets is the PostgreSQL sink's store of the apply group's
// offsets.
type streamOffsets interface {
	Offsets(ctx context.Context, group, topic string) ([]tidemark.StreamOffset, error)
}

// appliedOffsets reads group's next offset of each partition of a topic
// from so.
func appliedOffsets(so streamOffsets, group string) func(context.Context, string) (map[int32]int64, error) {
	return func(ctx context.Context, topic string) (map[int32]int64, error) {
		offs, err := so.Offsets(ctx, group, topic)
		if err != nil {
			return nil, err
		}
		out := make(map[int32]int64, len(offs))
		for _, o := range offs {
			out[o.Partition] = o.Next
		}
		return out, nil
	}
}

// fanoutTarget opens Kafka behind the state target: table states, DDL and
// the source lock stay in the state target.
func fanoutTarget(ctx context.Context, cfg *Config, state stateTarget, log *slog.Logger, cl *closers) (tidemark.Sink, error) {
	ddl, err1 := need[tidemark.DDLSink](state, "a fan-out to Kafka")
	locker, err2 := need[tidemark.SourceLocker](state, "a fan-out to Kafka")
	reg, err3 := need[tidemark.TableRegistry](state, "a fan-out to Kafka")
	if err := errors.Join(err1, err2, err3); err != nil {
		return nil, err
	}
	target, err := withKafka(ctx, state.sink, cfg.Target.Kafka, cfg.Source.Name, log.With("component", "kafka"), cl)
	if err != nil {
		return nil, err
	}
	fo := fanoutWithStates{Sink: target, DDLSink: ddl, SourceLocker: locker, TableRegistry: reg}
	if cfg.Target.Kafka.ControlRecords {
		// The fan-out's DDL and snapshots reach Kafka's consumers too
		// (control records).
		fo.kafka, _ = kafkaOf(target).(kafkaControl)
	}
	return fo, nil
}

// seedTailer sets what the tailer knows before it looks at the server: no
// epoch below the source's floor, whatever the checkpoint says (a deleted
// or edited one, a start_position: docs/FAILOVER.md; the floor is kept
// where the checkpoints are in PostgreSQL), and the checkpoint's epoch
// for what a resync or catch-up reads.
func (d *daemon) seedTailer(ctx context.Context, source string) error {
	if fs, ok := d.state.sink.(epochFloors); ok {
		floor, has, err := fs.EpochFloor(ctx, source)
		if err != nil {
			return fmt.Errorf("read epoch floor of %s: %w", source, err)
		}
		if has {
			d.tailer.SetEpochFloor(floor)
		}
	}
	stored, ok, err := d.target.Checkpoint(ctx, source)
	if err != nil {
		return fmt.Errorf("read checkpoint of %s: %w", source, err)
	}
	if ok {
		d.tailer.Seed(stored)
	}
	return nil
}

// newCatchUp builds the catch-up: it needs a target that stores
// watermarks, and takes the state target's key lists for a key diff (none
// with Kafka alone). Without such a target it is nil, and an error when
// the fallback is on.
func newCatchUp(cfg *Config, fc fallback.Config, reader *binlog.Reader, target tidemark.Sink, state stateTarget) (*fallback.CatchUp, error) {
	if tt, ok := target.(tailerTarget); ok && tt.snap != nil {
		// No key lists in the scale-out tailer's target: a full read
		// goes to the appliers between snapshot boundaries, so that they
		// remove the rows it did not carry (an interrupted first-run
		// snapshot's, rows deleted while the binlog was unavailable).
		fc.Boundaries = tt
	}
	switch k := target.(type) {
	case kafkaWithDDL:
		// Kafka alone with control records: a full read into topics
		// that hold records goes between snapshot boundaries, whose end
		// tells the consumers to remove the rows it did not carry.
		fc.Boundaries, fc.HeldRows = k.Sink, kafkaRows{k.Sink, cfg.Source.Name}
	case *kafka.Sink:
		fc.HeldRows = kafkaRows{k, cfg.Source.Name}
	}
	catchTarget, ok := target.(fallback.Target)
	if !ok {
		if cfg.FallbackOn() {
			return nil, fmt.Errorf("wire: the fallback (fallback.enabled) needs a target that stores catch-up watermarks (tidemark.WatermarkStore); %s does not", targetName(cfg))
		}
		return nil, nil
	}
	if keys, ok := state.sink.(tidemark.KeyTarget); ok {
		return fallback.New(fc, reader, catchTarget, keys)
	}
	return fallback.New(fc, reader, catchTarget)
}

// kafkaRows is Kafka alone's answer to whether it holds rows of a table
// (tidemark.TargetRows): the table's topic holds records.
type kafkaRows struct {
	ks     *kafka.Sink
	source string
}

func (k kafkaRows) HasRows(ctx context.Context, t *tidemark.Table) (bool, error) {
	return k.ks.Published(ctx, k.source, t.ID)
}

// fallbackConfig is the catch-up's config with its logger and a progress
// bar per table on progress.
func (c *Config) fallbackConfig(log *slog.Logger, progress io.Writer) fallback.Config {
	fc := c.FallbackSettings()
	fc.Logger = log.With("component", "fallback")
	bars := map[string]*Progress{}
	fc.Progress = func(p fallback.Progress) {
		name := p.Table.String()
		bar, ok := bars[name]
		if !ok {
			bar = NewProgress(progress, "catch-up "+name, -1, fc.Logger)
			bars[name] = bar
		}
		bar.Add(p.Rows - bar.Done())
		if p.Done {
			bar.Finish()
			delete(bars, name)
		}
	}
	return fc
}

// dedupeWindow is the dedupe window, nil when dedupe is disabled.
func (c *Config) dedupeWindow(log *slog.Logger) (*dedupe.Window, error) {
	dc, on, err := c.DedupeSettings()
	if err != nil || !on {
		return nil, err
	}
	dc.Logger = log.With("component", "dedupe")
	return dedupe.New(dc)
}

// pipelineConfig is the pipeline's config: batches, the snapshot of a new
// table (or a resync), and the automatic catch-up when the fallback is on.
func (d *daemon) pipelineConfig(cfg *Config, log *slog.Logger, onApply func(*tidemark.Batch, tidemark.ApplyStats, time.Duration)) tidemark.PipelineConfig {
	pc := tidemark.PipelineConfig{
		Source: cfg.Source.Name, MaxBatchChanges: cfg.Batch.MaxChanges, MaxBatchBytes: cfg.Batch.MaxBytes,
		MaxDelay: cfg.Batch.MaxDelay, FlushWhenIdle: cfg.Batch.flushWhenIdle(), Logger: log.With("component", "pipeline"), OnApply: onApply,
		SnapshotProgressEvery: cfg.snapshotProgressEvery(),
		OnTableState: func(st tidemark.TableState) {
			if d.onTableState != nil {
				d.onTableState(st)
			}
		},
	}
	if d.registry != nil && d.catchUp != nil {
		// New tables are snapshotted into the state target (it knows
		// which tables it has); with Kafka alone they are streamed from
		// their first change.
		pc.Snapshot = d.catchUp.Snapshotter(d.reader, d.registry, nil)
		if len(d.chunkReaders) > 0 {
			idx, _ := d.chunkReaders[0].(tidemark.IndexLister)
			pc.Chunks = d.catchUp.Chunks(d.chunkReaders, idx, d.registry)
		}
	} else if tt, ok := d.target.(tailerTarget); ok && d.catchUp != nil {
		// The scale-out tailer snapshots for resyncs and backfills, its
		// rows between boundaries for the appliers (scaleout.go), beside
		// the stream.
		pc.Snapshot = d.catchUp.Snapshotter(d.reader, tt, nil)
		if len(d.chunkReaders) > 0 {
			idx, _ := d.chunkReaders[0].(tidemark.IndexLister)
			pc.Chunks = d.catchUp.Chunks(d.chunkReaders, idx, tt)
		}
	}
	if cfg.FallbackOn() {
		pc.CatchUp = d.runCatchUp
	}
	return pc
}

// runCatchUp is the catch-up as the pipeline runs it: then the post-load
// duplicate assertion on the rows just loaded, and the metrics.
func (d *daemon) runCatchUp(ctx context.Context) (tidemark.Position, error) {
	if d.onCatchUp != nil {
		d.onCatchUp(true)
		defer d.onCatchUp(false)
	}
	// The target's clock before loading: the post-load assertion checks
	// the rows loaded since then.
	var since time.Time
	if d.clock != nil {
		now, err := d.clock.Now(ctx)
		if err != nil {
			return tidemark.Position{}, err
		}
		since = now
	}
	rep, err := d.catchUp.RunStreaming(ctx, d.reader, d.catchUpRegistry(), d.target)
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
