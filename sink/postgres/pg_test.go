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
	"tidemark/checkpoint"
	"tidemark/internal/testenv"
)

// newStore returns the control state of one test, in its own schema
// (dropped at cleanup): tombstones and checkpoints per test.
func newStore(t testing.TB) *checkpoint.Store {
	t.Helper()
	store, err := checkpoint.New(checkpoint.Config{Schema: testenv.Schema(t)})
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// env is one test's sink, schema and checking connection.
type env struct {
	t      testing.TB
	sink   *Sink
	store  *checkpoint.Store
	schema string // target schema
	conn   *pgx.Conn
}

type envOption func(*Config)

func softDeletes(c *Config) { c.DeleteMode = DeleteSoft }

func newEnv(t testing.TB, opts ...envOption) *env {
	t.Helper()
	schema := testenv.Schema(t)
	store := newStore(t)
	cfg := Config{
		DSN:          testenv.PG(t),
		Checkpoints:  store,
		TargetSchema: schema,
		Logger:       slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Retry:        tidemark.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond, Attempts: 5},
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
