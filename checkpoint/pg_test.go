package checkpoint_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"

	"tidemark"
)

// testDSN returns the DSN of the test PostgreSQL server. Tests that need it
// fail (not skip) without it: a skipped database test cannot fail.
func testDSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv("TIDEMARK_TEST_PG_DSN")
	if dsn == "" {
		t.Fatal("TIDEMARK_TEST_PG_DSN is not set: run `bash scripts/services.sh up` and " +
			"`eval \"$(bash scripts/services.sh env)\"` first")
	}
	return dsn
}

func connect(t testing.TB) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testDSN(t))
	if err != nil {
		t.Fatalf("connect to test PostgreSQL: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// randomSchema returns a fresh schema name ("t_<hex>") that is dropped at
// cleanup. The schema itself is not created.
func randomSchema(t testing.TB) string {
	t.Helper()
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	name := "t_" + hex.EncodeToString(b)
	dsn := testDSN(t)
	t.Cleanup(func() {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Errorf("drop schema %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `DROP SCHEMA IF EXISTS "`+name+`" CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
	})
	return name
}

// adapter adapts a pgx connection or transaction to tidemark.Querier, as
// the sinks do.
type adapter struct {
	exec  func(ctx context.Context, sql string, args ...any) error
	query func(ctx context.Context, sql string, args ...any) pgx.Row
}

func newQuerier(conn *pgx.Conn) tidemark.Querier {
	return adapter{
		exec: func(ctx context.Context, sql string, args ...any) error {
			_, err := conn.Exec(ctx, sql, args...)
			return err
		},
		query: conn.QueryRow,
	}
}

func txQuerier(tx pgx.Tx) tidemark.Querier {
	return adapter{
		exec: func(ctx context.Context, sql string, args ...any) error {
			_, err := tx.Exec(ctx, sql, args...)
			return err
		},
		query: tx.QueryRow,
	}
}

func (a adapter) Exec(ctx context.Context, sql string, args ...any) error {
	return a.exec(ctx, sql, args...)
}

func (a adapter) QueryRow(ctx context.Context, sql string, args ...any) tidemark.RowScanner {
	return row{a.query(ctx, sql, args...)}
}

type row struct{ r pgx.Row }

func (r row) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return tidemark.ErrNoRows
	}
	return err
}
