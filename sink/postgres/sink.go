// Package postgres is tidemark's PostgreSQL sink: it applies batches of
// changes as version-guarded upserts and deletes, with the batch's
// checkpoint and watermarks, in one transaction.
//
// For every batch the sink
//
//  1. coalesces the changes by (target table, business key), keeping the
//     newest version per key (an update that changes the key becomes a
//     delete of the old key and an upsert of the new one);
//  2. COPYs each table's surviving rows (binary protocol) into a session
//     temp staging table, then runs INSERT … SELECT … ON CONFLICT DO UPDATE
//     … WHERE (target version) < (staged version), and a guarded DELETE …
//     USING (or, in soft-delete mode, a guarded tombstone upsert);
//  3. stores the checkpoint and watermarks through the checkpoint.Store in
//     the same transaction, and commits.
//
// Target tables are created on first sight (CREATE TABLE IF NOT EXISTS) with
// the business key as primary key and tidemark's metadata columns:
//
//	_tm_seq bigint not null, _tm_idx integer not null  -- the row's Version
//	_tm_commit_time timestamptz                        -- source commit time
//	_tm_loaded_at timestamptz not null default now()   -- PostgreSQL's clock, on insert and update
//	_tm_deleted boolean, _tm_deleted_at timestamptz    -- soft-delete mode only
//
// The type mapping is documented in types.go and docs/type-mapping.md.
package postgres

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"tidemark"
	"tidemark/checkpoint"
)

// Sink applies batches to PostgreSQL. It is safe for concurrent use; Apply
// calls for the same source should still be made in order (the checkpoint
// stored is the last committed batch's).
type Sink struct {
	cfg       Config
	pool      *pgxpool.Pool
	log       *slog.Logger
	rlog      *tidemark.RateLimitedLogger
	secret    string // the DSN's password, redacted from every error
	host      string // the DSN's first host (doctor: loopback or not)
	tlsVerify string // what pgx verifies of the server's certificate (tlsVerification)

	mu      sync.Mutex
	defs    map[defKey]*tableDef // built definitions
	ensured map[defKey]bool      // target table checked (and created) in a committed transaction
	// projections: how the rows of an older layout are written (older.go)
	projections map[defKey]*projection
	// resolved: the layouts with JSON-unknown columns, resolved
	// (jsonunknown.go)
	resolved map[resolveKey]*resolution
	direct   map[defKey]*directState
	// skipLogged remembers the unmirrorable indexes already logged.
	skipLogged map[string]bool
	tombs      map[string]*tombSource      // per source: tombstone pruning state
	tombTop    map[string]tidemark.Version // per target table: newest tombstone (a bound)

	// held: the tables whose unique constraints wait for the stream
	// (heldunique.go), last read from the target at heldRead.
	heldMu   sync.Mutex
	held     map[tidemark.TableID]heldUnique
	heldRead time.Time

	lockMu sync.Mutex
	locks  map[string]*sourceLock // per source: the session holding its lock

	directRows, directConflicts atomic.Int64

	// Test hooks (nil in production).
	hookBeforeCommit func(ctx context.Context, tx pgx.Tx) error
	hookCommit       func(ctx context.Context, tx pgx.Tx) error
	// hookFenced runs after a transaction took a source's fence shared,
	// before it checks who holds the source's lock (fence).
	hookFenced func()
}

type defKey struct {
	id          tidemark.TableID
	fingerprint string
	// indexes is the table's secondary indexes when the schema knows
	// them: a new index list is ensured (mirrored) again.
	indexes string
	// load marks the ensure of a load's rows (Sink.ensure): only in the
	// ensured set.
	load bool
	// fresh marks the ensure of a fresh load's rows (Batch.FreshLoad):
	// only in the ensured set.
	fresh bool
}

var (
	_ tidemark.Sink         = (*Sink)(nil)
	_ tidemark.StreamTarget = (*Sink)(nil)
)

// Open validates cfg, connects, and creates the checkpoint tables if they
// are missing. Transient connection errors are retried with cfg.Retry until
// ctx is done; an authentication or configuration error is returned at
// once. No error holds the DSN or its password.
func Open(ctx context.Context, cfg Config) (*Sink, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	pcfg, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		// Not wrapped: pgconn.ParseConfigError holds the raw DSN.
		return nil, fmt.Errorf("postgres sink config: dsn: %s", parseErrorText(err))
	}
	if cfg.MaxConns > 0 {
		pcfg.MaxConns = int32(cfg.MaxConns)
	}
	log := cfg.Logger.With("component", "sink/postgres")
	if plaintextFallback(&pcfg.ConnConfig.Config) {
		log.Warn("PostgreSQL connection may fall back to plaintext: the DSN's sslmode is prefer or allow (pgx's default is prefer); set sslmode=require or verify-full, or disable to make plaintext explicit",
			"host", pcfg.ConnConfig.Host, "database", pcfg.ConnConfig.Database)
	}
	s := &Sink{
		cfg:         cfg,
		log:         log,
		rlog:        &tidemark.RateLimitedLogger{Logger: log},
		secret:      pcfg.ConnConfig.Password,
		host:        pcfg.ConnConfig.Host,
		tlsVerify:   tlsVerification(pcfg.ConnConfig.TLSConfig),
		defs:        map[defKey]*tableDef{},
		ensured:     map[defKey]bool{},
		projections: map[defKey]*projection{},
		resolved:    map[resolveKey]*resolution{},
		direct:      map[defKey]*directState{},
		skipLogged:  map[string]bool{},
		tombs:       map[string]*tombSource{},
		tombTop:     map[string]tidemark.Version{},
		held:        map[tidemark.TableID]heldUnique{},
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("open postgres sink: %w", redact(err, s.secret))
	}
	s.pool = pool
	if cfg.SkipInit {
		return s, nil
	}
	if err := s.Init(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

// tlsVerification says what pgx checks of the server's certificate: ""
// (nothing, or no TLS), "verify-ca: chain" or "verify-full: chain and
// name".
func tlsVerification(tc *tls.Config) string {
	switch {
	case tc == nil:
		return ""
	case !tc.InsecureSkipVerify:
		return "verify-full: chain and name " + tc.ServerName
	case tc.VerifyPeerCertificate != nil || tc.VerifyConnection != nil:
		return "verify-ca: chain, not the name"
	}
	return ""
}

// plaintextFallback reports whether a connection may end up unencrypted after
// trying TLS (sslmode prefer) or may try plaintext first (allow).
func plaintextFallback(c *pgconn.Config) bool {
	plain, tls := c.TLSConfig == nil, c.TLSConfig != nil
	for _, f := range c.Fallbacks {
		if f.TLSConfig == nil {
			plain = true
		} else {
			tls = true
		}
	}
	return plain && tls
}

// Init checks the connection and creates the checkpoint tables if they are
// missing. Open calls it; it is idempotent.
func (s *Sink) Init(ctx context.Context) error {
	err := s.retry(ctx, "initialize postgres sink", func(ctx context.Context) error {
		return redact(pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if err := s.cfg.Checkpoints.Init(ctx, querier{tx}); err != nil {
				return err
			}
			return s.initTombstones(ctx, tx)
		}), s.secret)
	})
	return redact(err, s.secret)
}

// EpochFloor returns the source's epoch floor
// (checkpoint.Store.LoadEpochFloor), and whether there is one.
func (s *Sink) EpochFloor(ctx context.Context, source string) (tidemark.Position, bool, error) {
	var (
		floor tidemark.Position
		has   bool
	)
	err := s.retry(ctx, "read epoch floor", func(ctx context.Context) error {
		var err error
		floor, has, err = s.cfg.Checkpoints.LoadEpochFloor(ctx, querier{s.pool}, source)
		return redact(err, s.secret)
	})
	return floor, has, err
}

// Checkpoint returns the position last committed for source, and whether
// there is one.
func (s *Sink) Checkpoint(ctx context.Context, source string) (tidemark.Position, bool, error) {
	var (
		pos tidemark.Position
		ok  bool
	)
	err := s.retry(ctx, "read checkpoint", func(ctx context.Context) error {
		var err error
		pos, ok, err = s.cfg.Checkpoints.LoadPosition(ctx, querier{s.pool}, source)
		return redact(err, s.secret)
	})
	if err != nil {
		return tidemark.Position{}, false, redact(err, s.secret)
	}
	return pos, ok, nil
}

// Offsets implements tidemark.StreamTarget: the stored offsets of group's
// partitions of topic.
func (s *Sink) Offsets(ctx context.Context, group, topic string) ([]tidemark.StreamOffset, error) {
	var out []tidemark.StreamOffset
	err := s.retry(ctx, "read stream offsets", func(ctx context.Context) error {
		var err error
		out, err = s.cfg.Checkpoints.LoadOffsets(ctx, querier{s.pool}, group, topic)
		return redact(err, s.secret)
	})
	return out, redact(err, s.secret)
}

// Close releases the sink's connections. It waits for connections in use to
// be returned.
func (s *Sink) Close() error {
	s.pool.Close()
	return nil
}

// def returns the cached definition of t, building it on first sight.
func (s *Sink) def(t *tidemark.Table) (*tableDef, defKey, error) {
	k := defKey{id: t.ID, fingerprint: t.Fingerprint()}
	if t.IndexesKnown {
		k.indexes = fmt.Sprint(t.Indexes)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if d, ok := s.defs[k]; ok {
		return d, k, nil
	}
	d, err := newTableDef(t, s.cfg.TargetSchema, s.cfg.DeleteMode, !s.cfg.SkipNotNull, s.cfg.tombName(), s.cfg.horizonsName())
	if err != nil {
		return nil, k, err
	}
	s.defs[k] = d
	return d, k, nil
}

func (s *Sink) isEnsured(k defKey) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ensured[k]
}

func (s *Sink) markEnsured(k defKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ensured[k] = true
}

// querier adapts a pgx transaction, connection or pool to
// checkpoint.Querier, so that the control state is written in the sink's
// transaction without pgx types leaving this package.
type querier struct {
	q interface {
		Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
		QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	}
}

func (q querier) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := q.q.Exec(ctx, sql, args...)
	return err
}

func (q querier) QueryRow(ctx context.Context, sql string, args ...any) checkpoint.RowScanner {
	return rowScanner{q.q.QueryRow(ctx, sql, args...)}
}

// rowScanner maps pgx.ErrNoRows to checkpoint.ErrNoRows.
type rowScanner struct{ r pgx.Row }

func (r rowScanner) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return checkpoint.ErrNoRows
	}
	return err
}

// resolveTimeout bounds how long the sink tries to learn the outcome of an
// ambiguous commit when ctx is already done.
const resolveTimeout = 30 * time.Second

// rollbackTimeout bounds a rollback after a failed attempt.
const rollbackTimeout = 5 * time.Second

// retry runs fn with the sink's retry policy, each attempt bounded by
// apply_timeout: pgx has no read timeout, so a half-open connection would
// otherwise hang the call (and the pipeline behind it) forever. The calls
// that run DDL (ensure, ApplyDDL, ResetTable) are not bounded: an ALTER
// that rewrites a large table may rightly take longer.
func (s *Sink) retry(ctx context.Context, what string, fn func(context.Context) error) error {
	return tidemark.Retry(ctx, what, s.cfg.Retry, retryable, s.rlog, func(ctx context.Context) error {
		actx, cancel := context.WithTimeout(ctx, s.cfg.ApplyTimeout)
		defer cancel()
		return fn(actx)
	})
}
