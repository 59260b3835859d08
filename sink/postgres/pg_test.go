package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"tidemark"
	"tidemark/internal/testenv"
)

// testStore is a minimal CheckpointStore on real tables in the test's
// schema (the sink's tests cannot import the checkpoint package). failSave,
// when set, makes SavePosition fail after writing.
type testStore struct {
	schema   string
	failSave func() error
}

func (s *testStore) cp() string { return tidemark.QuotePostgres(s.schema) + ".cp" }
func (s *testStore) wm() string { return tidemark.QuotePostgres(s.schema) + ".wm" }

func (s *testStore) Init(ctx context.Context, q tidemark.Querier) error {
	return q.Exec(ctx, `SELECT pg_advisory_xact_lock(1);
CREATE SCHEMA IF NOT EXISTS `+tidemark.QuotePostgres(s.schema)+`;
CREATE TABLE IF NOT EXISTS `+s.cp()+` (source text PRIMARY KEY, position text NOT NULL);
CREATE TABLE IF NOT EXISTS `+s.wm()+` (source text, db text, tbl text, value timestamptz NOT NULL, PRIMARY KEY (source, db, tbl))`)
}

func (s *testStore) LoadPosition(ctx context.Context, q tidemark.Querier, source string) (tidemark.Position, bool, error) {
	var text string
	err := q.QueryRow(ctx, `SELECT position FROM `+s.cp()+` WHERE source = $1`, source).Scan(&text)
	if errors.Is(err, tidemark.ErrNoRows) {
		return tidemark.Position{}, false, nil
	}
	if err != nil {
		return tidemark.Position{}, false, err
	}
	pos, err := tidemark.ParsePosition(text)
	if err != nil {
		return tidemark.Position{}, false, fmt.Errorf("load checkpoint of source %q from %s.cp: %w", source, s.schema, err)
	}
	return pos, true, nil
}

func (s *testStore) SavePosition(ctx context.Context, q tidemark.Querier, source string, pos tidemark.Position) error {
	if err := q.Exec(ctx, `INSERT INTO `+s.cp()+` (source, position) VALUES ($1, $2)
ON CONFLICT (source) DO UPDATE SET position = EXCLUDED.position`, source, pos.String()); err != nil {
		return err
	}
	if s.failSave != nil {
		return s.failSave()
	}
	return nil
}

func (s *testStore) LoadWatermark(ctx context.Context, q tidemark.Querier, source string, table tidemark.TableID) (time.Time, bool, error) {
	var v time.Time
	err := q.QueryRow(ctx, `SELECT value FROM `+s.wm()+` WHERE source = $1 AND db = $2 AND tbl = $3`, source, table.Database, table.Name).Scan(&v)
	if errors.Is(err, tidemark.ErrNoRows) {
		return time.Time{}, false, nil
	}
	return v.UTC(), err == nil, err
}

func (s *testStore) SaveWatermark(ctx context.Context, q tidemark.Querier, source string, w tidemark.Watermark) error {
	return q.Exec(ctx, `INSERT INTO `+s.wm()+` AS w (source, db, tbl, value) VALUES ($1, $2, $3, $4)
ON CONFLICT (source, db, tbl) DO UPDATE SET value = GREATEST(w.value, EXCLUDED.value)`, source, w.Table.Database, w.Table.Name, w.Value)
}

// env is one test's sink, schema and checking connection.
type env struct {
	t      testing.TB
	sink   *Sink
	store  *testStore
	schema string // target schema
	conn   *pgx.Conn
}

type envOption func(*Config)

func softDeletes(c *Config) { c.DeleteMode = DeleteSoft }

func newEnv(t testing.TB, opts ...envOption) *env {
	t.Helper()
	schema := testenv.Schema(t)
	store := &testStore{schema: testenv.Schema(t)}
	cfg := Config{
		DSN:          testenv.PG(t),
		Checkpoints:  store,
		TargetSchema: schema,
		// Tombstones per test (sources are all named "s").
		ControlSchema: store.schema,
		Logger:        slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Retry:         tidemark.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond, Attempts: 5},
	}
	for _, o := range opts {
		o(&cfg)
	}
	s, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &env{t: t, sink: s, store: store, schema: schema, conn: testenv.PGConn(t)}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func (e *env) apply(b *tidemark.Batch) tidemark.ApplyStats {
	e.t.Helper()
	st, err := e.sink.Apply(context.Background(), b)
	if err != nil {
		e.t.Fatalf("Apply: %v", err)
	}
	if st.Total() != len(b.Changes) {
		e.t.Fatalf("stats %+v do not add up to %d changes", st, len(b.Changes))
	}
	return st
}

// rows returns the result of a query as text, one string per row with the
// columns joined by "|" (NULL as "∅").
func (e *env) rows(sql string, args ...any) []string {
	e.t.Helper()
	rs, err := e.conn.Query(context.Background(), sql, args...)
	if err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	defer rs.Close()
	var out []string
	for rs.Next() {
		vals, err := rs.Values()
		if err != nil {
			e.t.Fatal(err)
		}
		parts := make([]string, len(vals))
		for i, v := range vals {
			if v == nil {
				parts[i] = "∅"
			} else {
				parts[i] = fmt.Sprint(v)
			}
		}
		out = append(out, strings.Join(parts, "|"))
	}
	if err := rs.Err(); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return out
}

func (e *env) table(name string) string {
	return tidemark.QuotePostgres(e.schema) + "." + tidemark.QuotePostgres(name)
}

func (e *env) checkpoint(source string) (tidemark.Position, bool) {
	e.t.Helper()
	pos, ok, err := e.sink.Checkpoint(context.Background(), source)
	if err != nil {
		e.t.Fatal(err)
	}
	return pos, ok
}

// simpleTable is (id bigint key, name text, qty integer).
func simpleTable(name string) *tidemark.Table {
	return &tidemark.Table{
		ID: tidemark.TableID{Database: "shop", Name: name},
		Columns: []tidemark.Column{
			{Name: "id", Kind: tidemark.KindInt, Bits: 64},
			{Name: "name", Kind: tidemark.KindText, Nullable: true},
			{Name: "qty", Kind: tidemark.KindInt, Bits: 32, Nullable: true},
		},
		Key: []int{0},
	}
}

func v(seq uint64, idx uint32) tidemark.Version { return tidemark.Version{Seq: seq, Index: idx} }

var commitT0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func ins(t *tidemark.Table, ver tidemark.Version, row ...any) tidemark.Change {
	return tidemark.Change{Op: tidemark.OpInsert, Table: t, After: row, Version: ver, CommitTime: commitT0.Add(time.Duration(ver.Seq) * time.Second)}
}

func upd(t *tidemark.Table, ver tidemark.Version, before, after []any) tidemark.Change {
	return tidemark.Change{Op: tidemark.OpUpdate, Table: t, Before: before, After: after, Version: ver, CommitTime: commitT0.Add(time.Duration(ver.Seq) * time.Second)}
}

func del(t *tidemark.Table, ver tidemark.Version, row ...any) tidemark.Change {
	return tidemark.Change{Op: tidemark.OpDelete, Table: t, Before: row, Version: ver, CommitTime: commitT0.Add(time.Duration(ver.Seq) * time.Second)}
}

func row(vals ...any) []any { return vals }

func gtid(seq int) tidemark.Position { return tidemark.Position{GTID: fmt.Sprintf("0-1001-%d", seq)} }

func parseTestDSN(dsn string) (*pgconn.Config, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, errors.New("cannot parse TIDEMARK_TEST_PG_DSN")
	}
	return cfg, nil
}

func hasConnectError(err error) bool {
	var ce *pgconn.ConnectError
	return errors.As(err, &ce)
}
