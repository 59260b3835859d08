package postgres

import (
	"fmt"
	"log/slog"
	"time"

	"tidemark"
	"tidemark/checkpoint"
)

// DeleteMode says what a source delete does to the target row.
type DeleteMode string

// The delete modes.
const (
	// DeleteHard deletes the target row (guarded by its version). The
	// version of a deleted row is gone with it: see Sink.Apply for what
	// that means for replays.
	DeleteHard DeleteMode = "hard"
	// DeleteSoft keeps the row with the before image of the delete,
	// _tm_deleted = true and _tm_deleted_at = the source commit time. A
	// later insert of the same key brings it back (_tm_deleted = false).
	DeleteSoft DeleteMode = "soft"
)

// Config configures a Sink. The zero value of every optional field is the
// documented default.
type Config struct {
	// DSN is the PostgreSQL connection string (URL or key=value form). It
	// is a secret: it never appears in a log line or an error. Set sslmode
	// explicitly; pgx's default, prefer, silently falls back to plaintext
	// (Open logs a warning when that fallback is possible).
	DSN string
	// Checkpoints is the control state in the target — positions,
	// watermarks, table states, stream offsets, verify runs, the epoch
	// floor and the hard-delete tombstones (tombstones.go) — written inside
	// each batch's transaction, in its schema (checkpoint.Config.Schema,
	// the one control-schema setting). Required.
	Checkpoints *checkpoint.Store
	// TargetSchema is the PostgreSQL schema of every target table. Empty
	// means one schema per source database, named like it.
	TargetSchema string
	// DeleteMode is DeleteHard (default) or DeleteSoft.
	DeleteMode DeleteMode
	// Logger receives the sink's log lines. Default slog.Default().
	Logger *slog.Logger
	// Retry is the backoff for transient errors (connection loss,
	// serialization failures, deadlocks, server shutdown). The zero value
	// retries with the defaults of tidemark.Backoff until ctx is done.
	Retry tidemark.Backoff
	// MaxConns caps the connection pool. Default: pgx's (the larger of 4
	// and the number of CPUs).
	MaxConns int
	// ApplyTimeout bounds one attempt to apply a batch (default 30s). pgx
	// has no read timeout and TCP keepalive does not see a peer whose
	// kernel still answers, so this deadline is what detects a half-open
	// connection; the attempt is then retried on a new connection. A
	// legitimately slow attempt (a locked table) is retried the same way.
	// It bounds every other attempt too (checkpoint and state reads and
	// writes, table lookups, key diffs) except DDL.
	ApplyTimeout time.Duration
	// Schema says how the source's schema changes are followed (see
	// SchemaPolicy and docs/schema-changes.md).
	Schema SchemaPolicy
	// SkipIndexes turns index mirroring off: MirrorIndexes and the index
	// lists of DDL events are ignored. Default: mirrored (indexes.go).
	SkipIndexes bool
	// SkipNotNull turns NOT NULL mirroring off: only key columns are NOT
	// NULL in the target. Default: the source's NOT NULL columns are NOT
	// NULL in the target (delete mode hard only).
	SkipNotNull bool
	// SkipInit makes Open leave the checkpoint tables alone (it neither
	// checks nor creates them): for commands that change nothing on the
	// target (tidemark plan).
	SkipInit bool
}

// DefaultApplyTimeout is Config.ApplyTimeout's default
// (target.postgres.apply_timeout).
const DefaultApplyTimeout = 30 * time.Second

func (c Config) withDefaults() Config {
	if c.DeleteMode == "" {
		c.DeleteMode = DeleteHard
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Schema = c.Schema.withDefaults()
	if c.ApplyTimeout <= 0 {
		c.ApplyTimeout = DefaultApplyTimeout
	}
	return c
}

// validate checks c (after withDefaults). Errors name the field; none holds
// the DSN.
func (c Config) validate() error {
	if c.DSN == "" {
		return fmt.Errorf("postgres sink config: dsn: required")
	}
	if c.Checkpoints == nil {
		return fmt.Errorf("postgres sink config: checkpoints: required")
	}
	if c.TargetSchema != "" {
		if err := checkName("schema", c.TargetSchema); err != nil {
			return fmt.Errorf("postgres sink config: target_schema: %w", err)
		}
	}
	switch c.DeleteMode {
	case DeleteHard, DeleteSoft:
	default:
		return fmt.Errorf("postgres sink config: delete_mode: must be %q or %q, got %q", DeleteHard, DeleteSoft, string(c.DeleteMode))
	}
	if c.MaxConns < 0 || c.MaxConns > 1<<20 {
		return fmt.Errorf("postgres sink config: max_conns: must be between 0 (default) and %d, got %d", 1<<20, c.MaxConns)
	}
	if c.ApplyTimeout < time.Second {
		return fmt.Errorf("postgres sink config: apply_timeout: must be at least 1s, got %s", c.ApplyTimeout)
	}
	if c.Retry.Attempts < 0 {
		return fmt.Errorf("postgres sink config: retry.attempts: must not be negative, got %d", c.Retry.Attempts)
	}
	if err := c.Schema.Validate(); err != nil {
		return fmt.Errorf("postgres sink config: %w", err)
	}
	return nil
}
