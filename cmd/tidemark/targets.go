package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"runtime"
	"strings"
	"time"

	"tidemark"
	"tidemark/checkpoint"
	"tidemark/sink/kafka"
	"tidemark/sink/postgres"
)

// This file is where the targets are opened: a new target is its package
// plus a case in openStateTarget (a target that keeps the source's state
// with the data) or in withKafka's place (one that only receives the
// changes, behind the state target in a fan-out).
// Everything else in cmd sees a target through root interfaces, found by
// type assertion (need): a capability a command does not use is never
// asked for, and one it uses but the target lacks is an error naming both.

// openMode is how a command uses the target it opens.
type openMode int

const (
	// openDaemon: the daemon and the applier (control tables created,
	// retries as configured).
	openDaemon openMode = iota
	// openCommand: a one-shot command (3 attempts per operation).
	openCommand
	// openReadOnly: a one-shot command that changes nothing in the
	// target (its control tables are left alone; 3 attempts).
	openReadOnly
)

// stateTarget is the target that keeps tidemark's state beside the data:
// the checkpoint, catch-up watermarks, table states, the source's lock,
// the key lists of a key diff (target.postgres). Its other capabilities
// are root interfaces, asked for with need.
type stateTarget struct {
	// name is the config section, target.<name>.
	name string
	// sink is the target; nil when the config has no state target
	// (Kafka alone).
	sink tidemark.Sink
	// verifier computes the target side of `tidemark verify`.
	verifier tidemark.TargetVerifier
}

// openStateTarget opens the config's state target and pushes its close on
// cl. With none configured (Kafka alone) it returns a stateTarget with a
// nil sink and no error.
func openStateTarget(ctx context.Context, cfg *Config, log *slog.Logger, mode openMode, cl *closers) (stateTarget, error) {
	switch {
	case cfg.Target.Postgres != nil:
		store, err := checkpoint.New(checkpoint.Config{Schema: cfg.Target.Postgres.ControlSchema})
		if err != nil {
			return stateTarget{}, err
		}
		pc := cfg.PostgresSinkConfig()
		pc.Checkpoints = store
		pc.Logger = log.With("component", "postgres")
		if mode != openDaemon {
			pc.Retry.Attempts = 3
		}
		pc.SkipInit = mode == openReadOnly
		s, err := postgres.Open(ctx, pc)
		if err != nil {
			return stateTarget{}, err
		}
		cl.push(s.Close)
		return stateTarget{name: "postgres", sink: s, verifier: postgres.NewVerifier(s)}, nil
	}
	return stateTarget{}, nil
}

// PostgresSinkConfig builds the sink's config (checkpoints and logger are
// filled in by the caller).
func (c *Config) PostgresSinkConfig() postgres.Config {
	p := c.Target.Postgres
	conns := p.MaxConns
	if conns == 0 {
		// pgx's default, and room for a parallel snapshot's writers
		// (one session each) beside the stream's and the lock's.
		conns = max(4, runtime.NumCPU(), c.snapshotParallelism()+3)
	}
	return postgres.Config{DSN: p.DSN, TargetSchema: p.Schema, DeleteMode: postgres.DeleteMode(p.DeleteMode), MaxConns: conns,
		ApplyTimeout: p.ApplyTimeout,
		// The appliers (an apply section) keep added columns nullable:
		// SchemaPolicy.KeepNullable.
		Schema:      postgres.SchemaPolicy{DropColumns: p.DropColumns, DropTable: p.DDL.DropTable, Truncate: p.DDL.Truncate, KeepNullable: c.Apply != nil},
		SkipIndexes: p.Mirror.Indexes != nil && !*p.Mirror.Indexes,
		SkipNotNull: p.Mirror.NotNull != nil && !*p.Mirror.NotNull}
}

// need returns capability T of target t, or an error naming the target,
// the capability (its root interface) and what needs it: "tidemark status
// needs target.postgres to implement tidemark.TableRegistry".
func need[T any](t stateTarget, user string) (T, error) {
	c, ok := t.sink.(T)
	if !ok {
		var zero T
		if t.sink == nil {
			return zero, fmt.Errorf("%s needs a target that keeps the source's state (target.postgres); this config has none", user)
		}
		typ := reflect.TypeFor[T]()
		var methods []string
		for i := range typ.NumMethod() {
			methods = append(methods, typ.Method(i).Name)
		}
		return zero, fmt.Errorf("%s needs target.%s to implement %s (%s), which it does not", user, t.name, typ, strings.Join(methods, ", "))
	}
	return c, nil
}

// withKafka returns the sink the pipeline applies to, given the PostgreSQL
// sink (an untyped nil when target.postgres is not configured) and the target.kafka
// section (nil when not configured):
//
//   - postgres only: pg;
//   - kafka only: the Kafka sink;
//   - both: a tidemark.Fanout applying each batch to PostgreSQL, then
//     Kafka. Its checkpoint is the older of the two, so neither misses a
//     change; PostgreSQL's version guard absorbs replays, and the Kafka
//     sink, never ahead of PostgreSQL in this order, resumes from its own
//     checkpoint (exactly once with exactly_once: true).
//
// It opens the Kafka sink (connecting and creating the checkpoint topic;
// an older instance with the same transactional id is fenced only by
// Activate, when the pipeline holds the source's lock) and pushes its
// close on cl. The caller does not close the returned sink: cl closes
// Kafka, and whoever opened pg closes pg.
func withKafka(ctx context.Context, pg tidemark.Sink, kc *KafkaConfig, source string, log *slog.Logger, cl *closers) (tidemark.Sink, error) {
	if kc == nil {
		if pg == nil {
			return nil, errors.New("config: target: configure postgres, kafka or both")
		}
		return pg, nil
	}
	ks, err := kafka.Open(ctx, kc.SinkConfig(source, log.With("component", "kafka")))
	if err != nil {
		return nil, err
	}
	cl.push(ks.Close)
	if pg == nil {
		return ks, nil
	}
	f, err := tidemark.NewFanout(
		tidemark.FanoutTarget{Name: "postgres", Sink: pg},
		tidemark.FanoutTarget{Name: "kafka", Sink: ks},
	)
	if err != nil {
		return nil, err
	}
	return kafkaFanout{Fanout: f, kafka: ks}, nil
}

// kafkaFanout is the PostgreSQL + Kafka fan-out, which also knows its
// Kafka sink (for control records: kafkaOf).
type kafkaFanout struct {
	*tidemark.Fanout
	kafka *kafka.Sink
}

// kafkaOf returns the Kafka sink of a fan-out made by withKafka (nil when
// there is none).
func kafkaOf(s tidemark.Sink) any {
	if f, ok := s.(kafkaFanout); ok {
		return f.kafka
	}
	return nil
}

// kafkaControl is what the fan-out needs of the Kafka sink to publish
// control records (control_records: true).
type kafkaControl interface {
	ddlPublisher
	tidemark.SnapshotBoundary
}

// kafkaWithDDL is Kafka as the only target, with control records and
// without the apply topology: a source TRUNCATE is published as a truncate
// control record (docs/kafka.md). A DROP TABLE is not: nothing applies or
// refuses it here (drop records are published where
// target.postgres.ddl.drop_table: apply says so), and it is logged.
type kafkaWithDDL struct {
	*kafka.Sink
	log *slog.Logger
}

var _ tidemark.DDLSink = kafkaWithDDL{}

// ApplyDDL implements tidemark.DDLSink: the TRUNCATEs of events and the
// checkpoint in one Kafka transaction.
func (k kafkaWithDDL) ApplyDDL(ctx context.Context, source string, events []tidemark.DDLEvent, checkpoint tidemark.Position) error {
	var pub []tidemark.DDLEvent
	for _, ev := range events {
		switch ev.Op {
		case tidemark.DDLTruncate:
			pub = append(pub, ev)
		case tidemark.DDLDropTable:
			k.log.Info("DROP TABLE not published: with Kafka alone only TRUNCATE becomes a control record", "source", source, "table", ev.Table.String(), "reason", ev.Reason)
		}
	}
	return k.PublishDDL(ctx, source, pub, checkpoint)
}

// tailerTarget is the Kafka sink of the scale-out tailer, with the source's
// lock held in the state target (tidemark.SourceLocker), so that of two
// tailers of one source one streams and the other waits.
type tailerTarget struct {
	tidemark.Sink
	// ddl publishes DDL to the appliers (the Kafka sink's PublishDDL).
	ddl ddlPublisher
	// snap encloses a snapshot's rows in boundaries for the appliers (the
	// Kafka sink's; scaleout.go).
	snap tidemark.SnapshotBoundary
	lock lockTarget
	// dropTable is target.postgres.ddl.drop_table: apply.
	dropTable bool
	// resets are the tables whose next snapshot reads them in full
	// (ResetTable; scaleout.go).
	resets *resetTables
	// schema is the appliers' target schema (target.postgres.schema; the
	// source database's name when empty).
	schema string
}

// epochFloors is a target that keeps the sources' epoch floors
// (postgres.Sink).
type epochFloors interface {
	EpochFloor(ctx context.Context, source string) (tidemark.Position, bool, error)
}

// ddlPublisher is a sink that carries DDL to the appliers of the
// scale-out topology (kafka.Sink).
type ddlPublisher interface {
	PublishDDL(ctx context.Context, source string, events []tidemark.DDLEvent, checkpoint tidemark.Position) error
	// HasTopic reports whether the table's topic exists (anything of it
	// may have been published).
	HasTopic(ctx context.Context, source string, id tidemark.TableID) (bool, error)
}

// lockTarget is the target holding the scale-out tailer's lock, its table
// states and the clock they are stamped with.
type lockTarget interface {
	tidemark.SourceLocker
	tidemark.Clock
	TableStates(ctx context.Context, source string) ([]tidemark.TableState, error)
	SetTableState(ctx context.Context, source string, st tidemark.TableState) error
	SwapTableState(ctx context.Context, source string, old tidemark.TableMode, st tidemark.TableState) (bool, error)
	// HasTable reports whether the appliers' target (the same
	// PostgreSQL) holds a table for the source table.
	HasTable(ctx context.Context, table tidemark.TableID) (bool, error)
	Close() error
}

// tailerDropsTables reports whether the scale-out tailer publishes a
// source's DROP TABLE to the appliers (target.postgres.ddl.drop_table:
// apply).
func tailerDropsTables(cfg *Config) bool {
	return cfg.Target.Postgres != nil && cfg.Target.Postgres.DDL.DropTable == postgres.ApplyDDL
}

// ApplyDDL implements tidemark.DDLSink for the appliers: a TRUNCATE, and a
// DROP TABLE when ddl.drop_table is apply, is published as a control record
// on every partition of the table's topic (each applier removes the rows
// older than it; for a DROP, the target table once none is left); an ALTER
// TABLE travels as the schema record of the next row; one that renames
// columns also re-snapshots the table (resyncRenamed). With
// ddl.drop_table: refuse (the default) a DROP TABLE quarantines the table
// in the tailer and the appliers keep its target rows, as without the
// topology; a DROP TABLE of a table the appliers cannot have (no topic for
// it in Kafka, no target table: DROP TABLE IF EXISTS of a table that never
// existed, as a mysqldump restore does) drops nothing and is neither
// refused nor published, as the PostgreSQL sink does without the topology.
func (t tailerTarget) ApplyDDL(ctx context.Context, source string, events []tidemark.DDLEvent, checkpoint tidemark.Position) error {
	if t.ddl == nil {
		return errors.New("apply DDL: the tailer's sink is not the Kafka sink")
	}
	kept := events[:0:0]
	for _, ev := range events {
		if ev.Op == tidemark.DDLDropTable && !t.dropTable {
			had, err := t.appliersMayHave(ctx, source, ev.Table)
			if err != nil {
				return err
			}
			if !had {
				continue
			}
			stmt := "DROP TABLE"
			if ev.Reason != "" {
				stmt += " (" + ev.Reason + ")"
			}
			return &tidemark.TableError{Table: ev.Table, Err: fmt.Errorf("%s refused by the configuration (ddl.drop_table: refuse); not published to the appliers, which keep the target table as it was: %w", stmt, tidemark.ErrDDLRefused)}
		}
		kept = append(kept, ev)
	}
	events = kept
	if err := t.resyncRenamed(ctx, source, events); err != nil {
		return err
	}
	return t.ddl.PublishDDL(ctx, source, events, checkpoint)
}

// appliersMayHave reports whether the appliers may hold rows of a table:
// its topic exists, or its target table does.
func (t tailerTarget) appliersMayHave(ctx context.Context, source string, id tidemark.TableID) (bool, error) {
	topic, err := t.ddl.HasTopic(ctx, source, id)
	if err != nil || topic {
		return topic, err
	}
	has, err := t.lock.HasTable(ctx, id)
	if err != nil {
		return false, fmt.Errorf("look up target of %s: %w", id, err)
	}
	return has, nil
}

// TryLockSource implements tidemark.SourceLocker with the state target's
// lock.
func (t tailerTarget) TryLockSource(ctx context.Context, source string) (func(), bool, error) {
	return t.lock.TryLockSource(ctx, source)
}

// CheckSourceLock implements tidemark.SourceLockChecker with the state
// target's lock.
func (t tailerTarget) CheckSourceLock(ctx context.Context, source string) (bool, error) {
	if c, ok := t.lock.(tidemark.SourceLockChecker); ok {
		return c.CheckSourceLock(ctx, source)
	}
	return false, nil
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
	if t.resets != nil && t.resets.has(table) {
		return time.Time{}, false, nil // reset for a snapshot: read it in full
	}
	return ws.Watermark(ctx, source, table)
}

// Close closes the Kafka sink and the lock's connections.
func (t tailerTarget) Close() error {
	return errors.Join(t.Sink.Close(), t.lock.Close())
}

// fanoutWithStates is the state target + Kafka fan-out (tidemark.Fanout);
// table states, DDL and the per-source lock are the state target's. With
// control records (kafka set) a DDL event the state target applied is
// published to Kafka as well (TRUNCATE, an applied DROP TABLE), and a
// snapshot's rows are enclosed in snapshot boundaries, as in the scale-out
// topology.
type fanoutWithStates struct {
	tidemark.Sink
	tidemark.DDLSink
	tidemark.SourceLocker
	tidemark.TableRegistry
	kafka kafkaControl
}

var _ tidemark.SnapshotBoundary = fanoutWithStates{}

var _ tidemark.TargetIdentity = fanoutWithStates{}

// TargetIdentity implements tidemark.TargetIdentity with the state
// target's tables (PostgreSQL), which hold the snapshot's rows: none when
// the registry cannot name them (a snapshot's progress is then trusted).
func (f fanoutWithStates) TargetIdentity(ctx context.Context, id tidemark.TableID) (string, bool, error) {
	ti, ok := f.TableRegistry.(tidemark.TargetIdentity)
	if !ok {
		return "", false, nil
	}
	return ti.TargetIdentity(ctx, id)
}

// ApplyDDL implements tidemark.DDLSink: the state target first (a refused
// event is its *tidemark.TableError, and nothing is published), then Kafka.
// A crash between the two resumes at Kafka's older checkpoint (the
// fan-out's), which replays the events.
func (f fanoutWithStates) ApplyDDL(ctx context.Context, source string, events []tidemark.DDLEvent, checkpoint tidemark.Position) error {
	if err := f.DDLSink.ApplyDDL(ctx, source, events, checkpoint); err != nil {
		return err
	}
	if f.kafka == nil {
		return nil
	}
	if err := f.kafka.PublishDDL(ctx, source, events, checkpoint); err != nil {
		return fmt.Errorf("publish DDL to kafka: %w", err)
	}
	return nil
}

// BeginSnapshot implements tidemark.SnapshotBoundary (with control
// records; a no-op otherwise).
func (f fanoutWithStates) BeginSnapshot(ctx context.Context, source string, id tidemark.TableID, reason string) error {
	if f.kafka == nil {
		return nil
	}
	return f.kafka.BeginSnapshot(ctx, source, id, reason)
}

// EndSnapshot implements tidemark.SnapshotBoundary (with control records;
// a no-op otherwise).
func (f fanoutWithStates) EndSnapshot(ctx context.Context, source string, id tidemark.TableID, v tidemark.Version) error {
	if f.kafka == nil {
		return nil
	}
	return f.kafka.EndSnapshot(ctx, source, id, v)
}

// Activate implements tidemark.Activator: it activates the fan-out (the
// Kafka sink's transactional producer), once the pipeline holds the lock.
func (f fanoutWithStates) Activate(ctx context.Context) error {
	if a, ok := f.Sink.(tidemark.Activator); ok {
		return a.Activate(ctx)
	}
	return nil
}

// CheckSourceLock implements tidemark.SourceLockChecker with the state
// target's lock.
func (f fanoutWithStates) CheckSourceLock(ctx context.Context, source string) (bool, error) {
	if c, ok := f.SourceLocker.(tidemark.SourceLockChecker); ok {
		return c.CheckSourceLock(ctx, source)
	}
	return false, nil
}

// Watermark implements tidemark.WatermarkStore: the oldest of the sinks'.
func (f fanoutWithStates) Watermark(ctx context.Context, source string, table tidemark.TableID) (time.Time, bool, error) {
	ws, ok := f.Sink.(tidemark.WatermarkStore)
	if !ok {
		return time.Time{}, false, errors.New("the fan-out cannot read watermarks")
	}
	return ws.Watermark(ctx, source, table)
}

// directInserter counts the rows a target inserted without a conflict
// check (the PostgreSQL sink's first-load fast path; a metric).
type directInserter interface {
	DirectInserts() (rows, conflicts int64)
}

// verifyRunRecorder keeps the last `tidemark verify` run in the target,
// for the daemon's status page and metrics.
type verifyRunRecorder interface {
	RecordVerifyRun(ctx context.Context, r tidemark.VerifyRun) error
}
