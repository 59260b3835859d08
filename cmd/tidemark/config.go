package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"regexp"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"tidemark"
	"tidemark/binlog"
	"tidemark/dedupe"
	"tidemark/fallback"
	"tidemark/metrics"
	"tidemark/sink/kafka"
	"tidemark/verify"
)

// Config is the YAML configuration file (README.md, section Configuration,
// has a table of the keys and tidemark.example.yaml shows the common ones;
// its sections are the types below, all in this file, whose field comments
// and the packages' Config types give each default). Unknown keys are rejected; ${NAME} in any value is
// replaced by the environment variable NAME (an unset variable is an error).
type Config struct {
	Source   SourceConfig   `yaml:"source"`
	Target   TargetConfig   `yaml:"target"`
	Batch    BatchConfig    `yaml:"batch"`
	Fallback FallbackConfig `yaml:"fallback"`
	Snapshot SnapshotConfig `yaml:"snapshot"`
	Dedupe   DedupeConfig   `yaml:"dedupe"`
	Verify   VerifyConfig   `yaml:"verify"`
	Metrics  MetricsConfig  `yaml:"metrics"`
	Log      LogConfig      `yaml:"log"`
	// Apply, when set, makes the config describe the scale-out topology
	// (docs/SCALE-OUT.md): `tidemark run` is the source's tailer, writing
	// Kafka only (with schema control records) and holding the source's
	// lock in target.postgres; `tidemark apply` is a member of the group of
	// appliers that write target.postgres.
	Apply *ApplyConfig `yaml:"apply"`
}

// DedupeConfig configures the duplicate filter between source and sink.
type DedupeConfig struct {
	// Enabled defaults to true.
	Enabled   *bool         `yaml:"enabled"`
	Delay     time.Duration `yaml:"delay"`
	Tolerance time.Duration `yaml:"tolerance"`
	MaxKeys   int           `yaml:"max_keys"`
	// EventTimeColumns maps "db.table" to the column holding the event
	// time (default: the source commit time).
	EventTimeColumns map[string]string `yaml:"event_time_columns"`
}

// DedupeSettings builds the filter's config.
func (c *Config) DedupeSettings() (dedupe.Config, bool, error) {
	d := c.Dedupe
	on := d.Enabled == nil || *d.Enabled
	cfg := dedupe.Config{Delay: d.Delay, Tolerance: d.Tolerance, MaxKeys: d.MaxKeys, EventTimeColumns: map[tidemark.TableID]string{}}
	for k, col := range d.EventTimeColumns {
		db, tbl, ok := strings.Cut(k, ".")
		if !ok || strings.Contains(tbl, ".") {
			return cfg, on, fmt.Errorf("config: dedupe.event_time_columns: key %q must be db.table", k)
		}
		cfg.EventTimeColumns[tidemark.TableID{Database: db, Name: tbl}] = col
	}
	return cfg, on, nil
}

// FallbackConfig configures the catch-up used on the first run and when the
// source has purged the checkpoint's binlog position.
type FallbackConfig struct {
	// Enabled defaults to true; false makes a purged position a fatal
	// error (exit 1) and the first run start at the oldest binlog.
	Enabled         *bool                          `yaml:"enabled"`
	Lookback        time.Duration                  `yaml:"lookback"`
	ChunkRows       int                            `yaml:"chunk_rows"`
	FutureTolerance time.Duration                  `yaml:"future_tolerance"`
	Tables          map[string]FallbackTableConfig `yaml:"tables"`
}

// SnapshotConfig configures how one table's snapshot is read and written
// with the PostgreSQL target alone (docs/SNAPSHOTS.md, "Parallel
// snapshot").
type SnapshotConfig struct {
	// Parallelism is how many key ranges of one table are read at once,
	// each on a source connection of its own, and written at once, each
	// in a PostgreSQL session of its own: the first-run snapshot and the
	// snapshots beside the stream (resync, backfill, new table). A
	// catch-up of every table (the first run) also reads up to this many
	// tables at once, within the same readers and sessions. Default
	// DefaultSnapshotParallelism; 1 is the single reader and COPY stream.
	Parallelism int `yaml:"parallelism"`
	// ProgressEvery is how often a snapshot (a first run's, one beside the
	// stream) records each table's range cursors at most (default
	// tidemark.DefaultSnapshotProgressEvery): the reading a kill -9
	// mid-snapshot can make the next start redo, against one
	// control-table write per table per interval.
	ProgressEvery time.Duration `yaml:"progress_every"`
}

// snapshotProgressEvery is snapshot.progress_every with its default.
func (c *Config) snapshotProgressEvery() time.Duration {
	if c.Snapshot.ProgressEvery == 0 {
		return tidemark.DefaultSnapshotProgressEvery
	}
	return c.Snapshot.ProgressEvery
}

// DefaultSnapshotParallelism is snapshot.parallelism's default: what wins
// on the 2-core machine this project runs on (docs/PERFORMANCE.md,
// "Parallel snapshot"); a 16-core machine would use 8.
const DefaultSnapshotParallelism = 2

// MaxSnapshotParallelism bounds snapshot.parallelism.
const MaxSnapshotParallelism = 64

// snapshotParallelism is snapshot.parallelism with its default.
func (c *Config) snapshotParallelism() int {
	if c.Snapshot.Parallelism == 0 {
		return DefaultSnapshotParallelism
	}
	return c.Snapshot.Parallelism
}

// FallbackTableConfig is the catch-up of one table.
type FallbackTableConfig struct {
	Column          string        `yaml:"column"`
	Lookback        time.Duration `yaml:"lookback"`
	DeleteDetection string        `yaml:"delete_detection"`
}

// FallbackOn reports whether the fallback is enabled.
func (c *Config) FallbackOn() bool { return c.Fallback.Enabled == nil || *c.Fallback.Enabled }

// FallbackSettings builds the catch-up config.
func (c *Config) FallbackSettings() fallback.Config {
	fc := fallback.Config{Source: c.Source.Name, Lookback: c.Fallback.Lookback, ChunkRows: c.Fallback.ChunkRows, ProgressEvery: c.snapshotProgressEvery(),
		FutureTolerance: c.Fallback.FutureTolerance, Tables: map[string]fallback.TableConfig{}}
	for k, t := range c.Fallback.Tables {
		fc.Tables[k] = fallback.TableConfig{Column: t.Column, Lookback: t.Lookback, DeleteDetection: t.DeleteDetection}
	}
	return fc
}

// SourceConfig is the MySQL/MariaDB source.
type SourceConfig struct {
	Name   string `yaml:"name"`
	Flavor string `yaml:"flavor"`
	// Capture is how a MySQL source's position is captured: log_status
	// (default) or flush_tables (binlog.Config.Capture).
	Capture  string `yaml:"capture"`
	Addr     string `yaml:"addr"`
	User     string `yaml:"user"`
	Password string `yaml:"password"`
	// PasswordFile names a file holding the password (instead of
	// password); a trailing newline is removed.
	PasswordFile string `yaml:"password_file"`
	ServerID     uint32 `yaml:"server_id"`
	// TLS of every connection to the source (binlog.Config.TLS has the
	// default mode: verify-full with a ca_file, else require, except
	// disable on a loopback address).
	TLS       TLSConfig `yaml:"tls"`
	Version   string    `yaml:"version"`
	TimeZone  string    `yaml:"time_zone"`
	Fold      string    `yaml:"fold"`
	Gap       string    `yaml:"gap"`
	ZeroDates string    `yaml:"zero_dates"`
	// Zones overrides the zone per "db.table" or "db.table.column".
	Zones         map[string]ZoneConfig `yaml:"zones"`
	Include       []string              `yaml:"include"`
	Exclude       []string              `yaml:"exclude"`
	BusinessKeys  map[string][]string   `yaml:"business_keys"`
	StartPosition string                `yaml:"start_position"`
	Heartbeat     time.Duration         `yaml:"heartbeat"`
	ReadTimeout   time.Duration         `yaml:"read_timeout"`
	QueryTimeout  time.Duration         `yaml:"query_timeout"`
	// ExcludeColumns removes columns per "db.table" pattern (PII).
	ExcludeColumns map[string][]string `yaml:"exclude_columns"`
	// LagBudget is how long tidemark may be stopped or behind without
	// losing its binlog position (default 24h): `tidemark doctor` and
	// `run` check the source's binlog expiry against it.
	LagBudget time.Duration `yaml:"lag_budget"`
}

// TLSConfig is a tls: section (source.tls, target.kafka.tls): mode
// disable | require | verify-ca | verify-full, PEM files, and the name the
// server's certificate must be issued to.
type TLSConfig struct {
	Mode       string `yaml:"mode"`
	CAFile     string `yaml:"ca_file"`
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"`
}

func (t TLSConfig) settings() tidemark.TLSConfig {
	return tidemark.TLSConfig{Mode: t.Mode, CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile, ServerName: t.ServerName}
}

// lagBudget returns source.lag_budget or its default.
func (c *Config) lagBudget() time.Duration {
	if c.Source.LagBudget > 0 {
		return c.Source.LagBudget
	}
	return DefaultLagBudget
}

// DefaultLagBudget is source.lag_budget's default.
const DefaultLagBudget = 24 * time.Hour

// ZoneConfig is a time-zone override.
type ZoneConfig struct {
	TimeZone string `yaml:"time_zone"`
	Fold     string `yaml:"fold"`
	Gap      string `yaml:"gap"`
}

// TargetConfig chooses the sinks.
type TargetConfig struct {
	Postgres *PostgresConfig `yaml:"postgres"`
	// Kafka publishes every change to Kafka as well (docs/kafka.md).
	// PostgreSQL is applied first, Kafka last, and tidemark resumes from
	// the older of their checkpoints.
	Kafka *KafkaConfig `yaml:"kafka"`
}

// PostgresConfig is the PostgreSQL sink.
type PostgresConfig struct {
	DSN string `yaml:"dsn"`
	// DSNFile names a file holding the DSN (instead of dsn).
	DSNFile       string `yaml:"dsn_file"`
	Schema        string `yaml:"schema"`
	ControlSchema string `yaml:"control_schema"`
	DeleteMode    string `yaml:"delete_mode"`
	MaxConns      int    `yaml:"max_conns"`
	// DropColumns and DDL: how schema changes are followed (resync.go,
	// docs/schema-changes.md).
	DropColumns string    `yaml:"drop_columns"`
	DDL         DDLConfig `yaml:"ddl"`
	// ApplyTimeout bounds one attempt to apply a batch (default 30s): it
	// is what detects a half-open connection.
	ApplyTimeout time.Duration `yaml:"apply_timeout"`
	// Mirror says what of the source's schema is mirrored beyond columns
	// and the primary key (docs/schema-changes.md). Both default to true.
	Mirror MirrorConfig `yaml:"mirror"`
}

// MirrorConfig turns index and NOT NULL mirroring on or off.
type MirrorConfig struct {
	// Indexes mirrors secondary indexes (unique ones as deferred unique
	// constraints), built after a table's first load. Default true.
	Indexes *bool `yaml:"indexes"`
	// NotNull mirrors the source's NOT NULL (delete_mode hard). Default
	// true.
	NotNull *bool `yaml:"not_null"`
}

// BatchConfig bounds batches.
type BatchConfig struct {
	MaxChanges int           `yaml:"max_changes"`
	MaxBytes   int           `yaml:"max_bytes"`
	MaxDelay   time.Duration `yaml:"max_delay"`
	// FlushWhenIdle applies whole transactions as soon as no batch is
	// applying instead of waiting for max_delay (tidemark.PipelineConfig
	// FlushWhenIdle). Default true.
	FlushWhenIdle *bool `yaml:"flush_when_idle"`
}

// LogConfig configures logging.
type LogConfig struct {
	// Level is debug, info, warn or error (default DefaultLogLevel).
	Level string `yaml:"level"`
	// Format is text or json (default DefaultLogFormat).
	Format string `yaml:"format"`
}

// The defaults of log.level and log.format.
const (
	DefaultLogLevel  = "info"
	DefaultLogFormat = "text"
)

// level is log.level or its default.
func (c LogConfig) level() string {
	if c.Level == "" {
		return DefaultLogLevel
	}
	return c.Level
}

// flushWhenIdle is batch.flush_when_idle or its default (true).
func (c BatchConfig) flushWhenIdle() bool { return c.FlushWhenIdle == nil || *c.FlushWhenIdle }

var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// expandEnv replaces ${NAME} in every scalar value of the document and
// returns the values it substituted (to scrub them from error messages).
func expandEnv(n *yaml.Node, getenv func(string) (string, bool), used *[]string) error {
	var errs []error
	if n.Kind == yaml.ScalarNode && strings.Contains(n.Value, "${") {
		n.Value = envRef.ReplaceAllStringFunc(n.Value, func(m string) string {
			name := envRef.FindStringSubmatch(m)[1]
			v, ok := getenv(name)
			if !ok {
				errs = append(errs, fmt.Errorf("config line %d: environment variable %s is not set", n.Line, name))
			}
			if v != "" {
				*used = append(*used, v)
			}
			return v
		})
		// Resolve the expanded text as if it had been written there
		// (a number stays a number), unless it was quoted.
		if n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) == 0 {
			n.Tag = ""
		}
	}
	for _, c := range n.Content {
		if err := expandEnv(c, getenv, used); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// linePaths maps each value's line to its dotted key path, so that decode
// errors ("line 6: cannot unmarshal …") can name the field.
func linePaths(n *yaml.Node, prefix string, out map[int]string) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			linePaths(c, prefix, out)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if prefix != "" {
				p = prefix + "." + k.Value
			}
			out[k.Line] = p
			if v.Line != k.Line || v.Kind == yaml.ScalarNode {
				if _, taken := out[v.Line]; !taken || v.Kind == yaml.ScalarNode {
					out[v.Line] = p
				}
			}
			linePaths(v, p, out)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			linePaths(c, fmt.Sprintf("%s[%d]", prefix, i), out)
		}
	}
}

var lineRef = regexp.MustCompile(`line (\d+): `)

// ParseConfig parses and validates a YAML config. Errors name the field or
// line; they never contain a secret value.
func ParseConfig(data []byte, getenv func(string) (string, bool)) (*Config, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("parse config: %w", err)
	}
	paths := map[int]string{}
	linePaths(&doc, "", paths)
	annotate := func(msg string, secrets []string) string {
		msg = lineRef.ReplaceAllStringFunc(msg, func(m string) string {
			var line int
			fmt.Sscanf(m, "line %d: ", &line)
			if p, ok := paths[line]; ok {
				return fmt.Sprintf("line %d (%s): ", line, p)
			}
			return m
		})
		for _, s := range secrets {
			if s != "" {
				msg = strings.ReplaceAll(msg, s, "***")
			}
		}
		return msg
	}
	// Unknown keys: a strict decode of the text as written (type errors
	// are left to the second pass, after ${ENV} expansion).
	strict := yaml.NewDecoder(bytes.NewReader(data))
	strict.KnownFields(true)
	var probe Config
	var unknown []string
	if err := strict.Decode(&probe); err != nil {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return nil, fmt.Errorf("parse config: %w", err)
		}
		for _, m := range te.Errors {
			if strings.Contains(m, "not found in type") {
				unknown = append(unknown, annotate(m, nil))
			}
		}
	}
	if len(unknown) > 0 {
		return nil, fmt.Errorf("parse config: unknown keys: %s", strings.Join(unknown, "; "))
	}
	var used []string
	if err := expandEnv(&doc, getenv, &used); err != nil {
		return nil, fmt.Errorf("parse config: %w", err)
	}
	var cfg Config
	if err := doc.Decode(&cfg); err != nil {
		return nil, fmt.Errorf("parse config: %s", annotate(err.Error(), used))
	}
	if err := cfg.readSecretFiles(); err != nil {
		return nil, err
	}
	used = append(used, cfg.Source.Password)
	if cfg.Target.Postgres != nil {
		used = append(used, cfg.Target.Postgres.DSN)
	}
	if cfg.Target.Kafka != nil && cfg.Target.Kafka.SASL != nil {
		used = append(used, cfg.Target.Kafka.SASL.Password)
	}
	if err := cfg.Validate(); err != nil {
		return nil, errors.New(annotate(err.Error(), used))
	}
	return &cfg, nil
}

// readSecretFiles loads password_file and dsn_file. An error names the
// field and the file, never its content.
func (c *Config) readSecretFiles() error {
	read := func(field, path string, dst *string) error {
		if path == "" {
			return nil
		}
		if *dst != "" {
			return fmt.Errorf("config: %s: set either it or the value it replaces, not both", field)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			var pe *os.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			return fmt.Errorf("config: %s: read %s: %v", field, path, err)
		}
		*dst = strings.TrimRight(string(b), "\r\n")
		if *dst == "" {
			return fmt.Errorf("config: %s: %s is empty", field, path)
		}
		return nil
	}
	if err := read("source.password_file", c.Source.PasswordFile, &c.Source.Password); err != nil {
		return err
	}
	if c.Target.Postgres != nil {
		if err := read("target.postgres.dsn_file", c.Target.Postgres.DSNFile, &c.Target.Postgres.DSN); err != nil {
			return err
		}
	}
	if c.Target.Kafka != nil && c.Target.Kafka.SASL != nil {
		if err := read("target.kafka.sasl.password_file", c.Target.Kafka.SASL.PasswordFile, &c.Target.Kafka.SASL.Password); err != nil {
			return err
		}
	}
	return nil
}

// LoadConfig reads a config file.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return ParseConfig(data, os.LookupEnv)
}

// Validate checks fields that the components do not (they validate their
// own configs when built).
func (c *Config) Validate() error {
	errs := c.targetErrors()
	if c.Batch.MaxChanges < 0 {
		errs = append(errs, errors.New("config: batch.max_changes: must be ≥ 0"))
	}
	if c.Batch.MaxBytes < 0 {
		errs = append(errs, errors.New("config: batch.max_bytes: must be ≥ 0"))
	}
	if c.Batch.MaxDelay < 0 {
		errs = append(errs, errors.New("config: batch.max_delay: must be ≥ 0"))
	}
	if n := c.Snapshot.Parallelism; n < 0 || n > MaxSnapshotParallelism {
		errs = append(errs, fmt.Errorf("config: snapshot.parallelism: must be between 1 and %d (0 or unset: %d), got %d", MaxSnapshotParallelism, DefaultSnapshotParallelism, n))
	}
	if d := c.Snapshot.ProgressEvery; d < 0 || d > time.Hour {
		errs = append(errs, fmt.Errorf("config: snapshot.progress_every: must be between 1ns and 1h (0 or unset: %s), got %s", tidemark.DefaultSnapshotProgressEvery, d))
	}
	switch c.Log.Level {
	case "", "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("config: log.level: must be debug, info, warn or error, got %q", c.Log.Level))
	}
	switch c.Log.Format {
	case "", "text", "json":
	default:
		errs = append(errs, fmt.Errorf("config: log.format: must be text or json, got %q", c.Log.Format))
	}
	if c.Source.QueryTimeout < 0 {
		errs = append(errs, fmt.Errorf("config: source.query_timeout: must be ≥ 0, got %s", c.Source.QueryTimeout))
	}
	if c.Source.StartPosition != "" {
		if _, err := tidemark.ParsePosition(c.Source.StartPosition); err != nil {
			errs = append(errs, fmt.Errorf("config: source.start_position: %w", err))
		}
	}
	if _, err := c.BinlogConfig(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Verify.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Metrics.Validate(); err != nil {
		errs = append(errs, err)
	}
	if dc, on, err := c.DedupeSettings(); err != nil {
		errs = append(errs, err)
	} else if on {
		if _, err := dedupe.New(dc); err != nil {
			errs = append(errs, fmt.Errorf("config: %w", err))
		}
	}
	if fc := c.FallbackSettings(); c.Source.Name != "" {
		if err := fc.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// targetErrors are Validate's errors of the target and apply sections.
func (c *Config) targetErrors() []error {
	var errs []error
	if c.Target.Kafka != nil {
		k := *c.Target.Kafka
		// The apply topology always publishes control records.
		k.ControlRecords = k.ControlRecords || c.Apply != nil
		if err := k.Validate(c.Source.Name); err != nil {
			errs = append(errs, err)
		}
		if c.Apply != nil && !k.ExactlyOnce {
			// Without a transactional id nothing fences a second
			// tailer that runs after losing the source's lock.
			errs = append(errs, errors.New("config: target.kafka.exactly_once: must be true with an apply section (the scale-out topology fences a second tailer with Kafka transactions; without them two live tailers can both publish)"))
		}
	}
	if c.Target.Postgres == nil {
		if c.Target.Kafka == nil {
			errs = append(errs, errors.New("config: target: set postgres, kafka or both"))
		}
	} else if c.Target.Postgres.DSN == "" {
		errs = append(errs, errors.New("config: target.postgres.dsn: required"))
	}
	if c.Target.Postgres != nil {
		if err := c.PostgresSinkConfig().Schema.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("config: target.postgres.%w", err))
		}
	}
	if c.Apply != nil {
		if c.Target.Postgres == nil || c.Target.Kafka == nil {
			errs = append(errs, errors.New("config: apply: needs target.postgres (written by the appliers, holds the tailer's lock) and target.kafka (the change topics)"))
		}
		if c.Apply.PartitionChangeWait < 0 {
			errs = append(errs, fmt.Errorf("config: apply.partition_change_wait: must be ≥ 0, got %s", c.Apply.PartitionChangeWait))
		}
		if c.Apply.MaxRecords < 0 {
			errs = append(errs, fmt.Errorf("config: apply.max_records: must be ≥ 0, got %d", c.Apply.MaxRecords))
		}
		if c.Apply.Topics != "" {
			if _, err := regexp.Compile(c.Apply.Topics); err != nil {
				errs = append(errs, fmt.Errorf("config: apply.topics: %w", err))
			}
		}
	}
	return errs
}

func zonePolicy(field string, z ZoneConfig) (tidemark.ZonePolicy, error) {
	var p tidemark.ZonePolicy
	if z.TimeZone != "" {
		loc, err := time.LoadLocation(z.TimeZone)
		if err != nil {
			return p, fmt.Errorf("config: %s.time_zone: unknown IANA zone %q", field, z.TimeZone)
		}
		p.Location = loc
	}
	p.Fold, p.Gap = tidemark.Resolve(z.Fold), tidemark.Resolve(z.Gap)
	if p.Fold != "" && !p.Fold.Valid() {
		return p, fmt.Errorf("config: %s.fold: must be earlier, later or error, got %q", field, z.Fold)
	}
	if p.Gap != "" && !p.Gap.Valid() {
		return p, fmt.Errorf("config: %s.gap: must be earlier, later or error, got %q", field, z.Gap)
	}
	return p, nil
}

// BinlogConfig builds the tailer's config.
func (c *Config) BinlogConfig() (binlog.Config, error) {
	s := c.Source
	zone, err := zonePolicy("source", ZoneConfig{TimeZone: s.TimeZone, Fold: s.Fold, Gap: s.Gap})
	if err != nil {
		return binlog.Config{}, err
	}
	if s.TimeZone == "" {
		return binlog.Config{}, errors.New("config: source.time_zone: required (the IANA zone DATETIME values are written in, e.g. Asia/Kolkata or UTC)")
	}
	overrides := map[string]tidemark.ZonePolicy{}
	for k, z := range s.Zones {
		p, err := zonePolicy("source.zones."+k, z)
		if err != nil {
			return binlog.Config{}, err
		}
		overrides[k] = p
	}
	bc := binlog.Config{
		Name: s.Name, Flavor: s.Flavor, Capture: s.Capture, Addr: s.Addr, User: s.User, Password: s.Password, TLS: s.TLS.settings(),
		ServerID: s.ServerID, Version: s.Version, Zone: zone, ZoneOverrides: overrides,
		ZeroDates: s.ZeroDates, Include: s.Include, Exclude: s.Exclude, BusinessKeys: s.BusinessKeys, ExcludeColumns: s.ExcludeColumns,
		Heartbeat: s.Heartbeat, ReadTimeout: s.ReadTimeout, QueryTimeout: s.QueryTimeout,
	}
	if err := bc.Validate(); err != nil {
		return binlog.Config{}, err
	}
	return bc, nil
}

// needPostgres is the error of a command that works on the PostgreSQL
// target when the config has none.
func (c *Config) needPostgres(command string) error {
	if c.Target.Postgres == nil {
		return fmt.Errorf("tidemark %s: needs target.postgres (this config publishes to Kafka only)", command)
	}
	return nil
}

// DDLConfig is target.postgres.ddl: what the source's DROP TABLE and
// TRUNCATE do to the target ("apply" or "refuse"; refuse quarantines the
// table). Defaults: drop_table refuse, truncate apply.
type DDLConfig struct {
	DropTable string `yaml:"drop_table"`
	Truncate  string `yaml:"truncate"`
}

// MetricsConfig is the `metrics:` section of the config.
type MetricsConfig struct {
	// Listen is the address of /metrics, /healthz and /readyz (default
	// 127.0.0.1:9650, loopback only; "off" disables the server). Without
	// WebConfigFile the endpoints have no TLS and no authentication.
	Listen string `yaml:"listen"`
	// RetentionInterval is how often the binlog retention headroom is
	// measured (default 1m).
	RetentionInterval time.Duration `yaml:"retention_interval"`
	// WebConfigFile is a file in the Prometheus exporters' web.config.file
	// format (tls_server_config, basic_auth_users; metrics.WebConfig):
	// TLS and basic authentication for every path of the endpoint.
	WebConfigFile string `yaml:"web_config_file"`
}

// DefaultMetricsListen is the default metrics address.
const DefaultMetricsListen = "127.0.0.1:9650"

// DefaultRetentionInterval is metrics.retention_interval's default.
const DefaultRetentionInterval = time.Minute

func (c MetricsConfig) withDefaults() MetricsConfig {
	if c.Listen == "" {
		c.Listen = DefaultMetricsListen
	}
	if c.RetentionInterval <= 0 {
		c.RetentionInterval = DefaultRetentionInterval
	}
	return c
}

// Validate checks the section; errors name the field.
func (c MetricsConfig) Validate() error {
	if c.Listen != "" && c.Listen != "off" {
		if _, _, err := net.SplitHostPort(c.Listen); err != nil {
			return fmt.Errorf("config: metrics.listen: want host:port or off: %v", err)
		}
	}
	if c.RetentionInterval < 0 {
		return errors.New("config: metrics.retention_interval: must be ≥ 0")
	}
	if c.WebConfigFile != "" {
		if _, err := metrics.LoadWebConfig(c.WebConfigFile); err != nil {
			return fmt.Errorf("config: metrics.web_config_file: %w", err)
		}
	}
	return nil
}

// KafkaConfig is the target.kafka section of the config file: publish the
// changes to Kafka (see docs/kafka.md). With target.postgres also set, both
// sinks get every batch (PostgreSQL first, Kafka last) and tidemark resumes
// from the older of their checkpoints.
//
//	target:
//	  kafka:
//	    brokers: ["kafka-1:9092", "kafka-2:9092"]
//	    topic_prefix: shop                  # {prefix} in topic_template (default tidemark)
//	    topic_template: "{prefix}.{database}.{table}"
//	    checkpoint_topic: shop.checkpoints  # default <topic_prefix>.checkpoints
//	    tombstones: true                    # a null-value record after each delete
//	    exactly_once: true                  # one transaction per batch
//	    transactional_id: tidemark-shop     # default tidemark-<source.name>
//	    commit_resolve_timeout: 5m          # learning a commit's lost outcome, then stop
//	    create_topics: true                 # default true
//	    partitions: 6
//	    replication_factor: 3
//	    topic_configs: {retention.ms: "604800000"} # compact is refused with control records
//	    source_server_id: 1001              # published in source.server_id
type KafkaConfig struct {
	Brokers            []string      `yaml:"brokers"`
	ClientID           string        `yaml:"client_id"`
	TopicPrefix        string        `yaml:"topic_prefix"`
	TopicTemplate      string        `yaml:"topic_template"`
	CheckpointTopic    string        `yaml:"checkpoint_topic"`
	Tombstones         bool          `yaml:"tombstones"`
	ExactlyOnce        bool          `yaml:"exactly_once"`
	TransactionalID    string        `yaml:"transactional_id"`
	TransactionTimeout time.Duration `yaml:"transaction_timeout"`
	// CommitResolveTimeout bounds learning the outcome of a commit that
	// got no answer (kafka.Config.CommitResolveTimeout).
	CommitResolveTimeout time.Duration     `yaml:"commit_resolve_timeout"`
	CreateTopics         *bool             `yaml:"create_topics"`
	Partitions           int32             `yaml:"partitions"`
	ReplicationFactor    int16             `yaml:"replication_factor"`
	TopicConfigs         map[string]string `yaml:"topic_configs"`
	MaxBufferedRecords   int               `yaml:"max_buffered_records"`
	MaxBufferedBytes     int               `yaml:"max_buffered_bytes"`
	MaxRecordBytes       int32             `yaml:"max_record_bytes"`
	SourceServerID       uint32            `yaml:"source_server_id"`
	// ControlRecords announces table schemas on every partition (needed
	// by `tidemark apply`; always on with an apply section).
	ControlRecords bool `yaml:"control_records"`
	// TLS dials the brokers with TLS (absent: plain text; mode defaults
	// to verify-full), for every client: sink, checkpoint topic, appliers,
	// admin commands.
	TLS *TLSConfig `yaml:"tls"`
	// SASL authenticates to the brokers.
	SASL *SASLConfig `yaml:"sasl"`

	// appliedOffsets is the apply group's stored offsets of a topic
	// (the scale-out tailer: kafka.Config.AppliedOffsets); not in the
	// file.
	appliedOffsets      func(ctx context.Context, topic string) (map[int32]int64, error)
	partitionChangeWait time.Duration
}

// SASLConfig is target.kafka.sasl. The password comes from password (with
// ${ENV}) or password_file.
type SASLConfig struct {
	Mechanism    string `yaml:"mechanism"`
	User         string `yaml:"user"`
	Password     string `yaml:"password"`
	PasswordFile string `yaml:"password_file"`
}

// security is the brokers' TLS and SASL for every Kafka client.
func (k *KafkaConfig) security() kafka.Security {
	var sec kafka.Security
	if k.TLS != nil {
		t := k.TLS.settings()
		sec.TLS = &t
	}
	if k.SASL != nil {
		sec.SASL = &kafka.SASLConfig{Mechanism: k.SASL.Mechanism, User: k.SASL.User, Password: k.SASL.Password}
	}
	return sec
}

// SinkConfig builds the Kafka sink's config for the source named source
// (the default transactional id is "tidemark-<source>").
func (k *KafkaConfig) SinkConfig(source string, log *slog.Logger) kafka.Config {
	create := true
	if k.CreateTopics != nil {
		create = *k.CreateTopics
	}
	txnID := k.TransactionalID
	if txnID == "" && k.ExactlyOnce {
		txnID = "tidemark-" + source
	}
	return kafka.Config{
		Brokers:              k.Brokers,
		Security:             k.security(),
		ClientID:             k.ClientID,
		TopicPrefix:          k.TopicPrefix,
		TopicTemplate:        k.TopicTemplate,
		CheckpointTopic:      k.CheckpointTopic,
		Tombstones:           k.Tombstones,
		ExactlyOnce:          k.ExactlyOnce,
		TransactionalID:      txnID,
		TransactionTimeout:   k.TransactionTimeout,
		CommitResolveTimeout: k.CommitResolveTimeout,
		CreateTopics:         create,
		Partitions:           k.Partitions,
		ReplicationFactor:    k.ReplicationFactor,
		TopicConfigs:         k.TopicConfigs,
		MaxBufferedRecords:   k.MaxBufferedRecords,
		MaxBufferedBytes:     k.MaxBufferedBytes,
		MaxRecordBytes:       k.MaxRecordBytes,
		SourceServerID:       k.SourceServerID,
		ControlRecords:       k.ControlRecords,
		AppliedOffsets:       k.appliedOffsets,
		PartitionChangeWait:  k.partitionChangeWait,
		Logger:               log,
	}
}

// Validate checks the section; errors name the field as
// "config: target.kafka.<field>". It opens no connection.
func (k *KafkaConfig) Validate(source string) error {
	err := kafka.ValidateConfig(k.SinkConfig(source, nil))
	var ce *kafka.ConfigError
	if errors.As(err, &ce) {
		return fmt.Errorf("config: target.kafka.%s: %s", ce.Field, ce.Problem)
	}
	return err
}

// VerifyConfig is the `verify:` section of the config.
type VerifyConfig struct {
	// ChunkRows is the number of source rows per checksum chunk (default
	// 10000).
	ChunkRows int `yaml:"chunk_rows"`
	// Examples is how many missing, extra, changed and duplicate keys are
	// listed per table (default 10).
	Examples int `yaml:"examples"`
	// Tables configures the daily reconciliation per "db.table".
	Tables map[string]VerifyTableConfig `yaml:"tables"`
	// Assert configures the post-load duplicate-key assertion.
	Assert AssertConfig `yaml:"assert"`
}

// VerifyTableConfig is the daily reconciliation of one table.
type VerifyTableConfig struct {
	// EventTime is the DATETIME or TIMESTAMP column that --since filters
	// on and the daily totals group by (per UTC day).
	EventTime string `yaml:"event_time"`
	// Sums lists the integer or DECIMAL columns whose SUM is compared per
	// day (COUNT(*) always is).
	Sums []string `yaml:"sums"`
}

// AssertConfig configures the post-load assertion.
type AssertConfig struct {
	// OnViolation is "stop" (default: the pipeline stops with the error)
	// or "alert" (log an error and count it in tidemark_errors_total).
	OnViolation string `yaml:"on_violation"`
	// Interval is how often the assertion runs while streaming (default
	// 5m; a negative value disables the scheduled run).
	Interval time.Duration `yaml:"interval"`
}

// engine returns the verify package's view of the section.
func (c VerifyConfig) engine() verify.Config {
	vc := verify.Config{ChunkRows: c.ChunkRows, Examples: c.Examples}
	if len(c.Tables) > 0 {
		vc.Tables = make(map[string]verify.TableConfig, len(c.Tables))
		for k, t := range c.Tables {
			vc.Tables[k] = verify.TableConfig{EventTime: t.EventTime, Sums: t.Sums}
		}
	}
	return vc
}

// assert returns the post-load assertion's config.
func (c VerifyConfig) assert() verify.AssertConfig {
	return verify.AssertConfig{OnViolation: c.Assert.OnViolation, Interval: c.Assert.Interval}
}

// Validate checks the section; errors name the field.
func (c VerifyConfig) Validate() error {
	var errs []error
	if c.ChunkRows < 0 {
		errs = append(errs, errors.New("config: verify.chunk_rows: must be ≥ 0"))
	}
	if c.Examples < 0 {
		errs = append(errs, errors.New("config: verify.examples: must be ≥ 0"))
	}
	switch c.Assert.OnViolation {
	case "", verify.AssertStop, verify.AssertAlert:
	default:
		errs = append(errs, fmt.Errorf("config: verify.assert.on_violation: must be %s or %s, got %q", verify.AssertStop, verify.AssertAlert, c.Assert.OnViolation))
	}
	for k, t := range c.Tables {
		if strings.Count(k, ".") != 1 {
			errs = append(errs, fmt.Errorf("config: verify.tables: key %q must be db.table", k))
		}
		if t.EventTime == "" && len(t.Sums) > 0 {
			errs = append(errs, fmt.Errorf("config: verify.tables.%s.event_time: required with sums", k))
		}
		if t.EventTime != "" && !tidemark.ValidIdentifier(t.EventTime) {
			errs = append(errs, fmt.Errorf("config: verify.tables.%s.event_time: invalid column %q", k, t.EventTime))
		}
		for _, s := range t.Sums {
			if !tidemark.ValidIdentifier(s) {
				errs = append(errs, fmt.Errorf("config: verify.tables.%s.sums: invalid column %q", k, s))
			}
		}
	}
	return errors.Join(errs...)
}
