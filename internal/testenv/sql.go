package testenv

import (
	"context"
	"testing"

	"github.com/go-mysql-org/go-mysql/client"
	"github.com/jackc/pgx/v5"
)

// Conn opens a SQL connection to s, closed at cleanup.
func (s Server) Conn(t testing.TB) *client.Conn {
	t.Helper()
	c, err := client.Connect(s.Addr, s.User, s.Password, "")
	if err != nil {
		t.Fatalf("connect to the test %s at %s: %v", s.Flavor, s.Addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Database creates a database named prefix plus random hex digits on the
// connection's server and drops it at cleanup.
func Database(t testing.TB, c *client.Conn, prefix string) string {
	t.Helper()
	db := Name(prefix)
	if _, err := c.Execute("CREATE DATABASE " + db); err != nil {
		t.Fatalf("create database %s: %v", db, err)
	}
	t.Cleanup(func() { _, _ = c.Execute("DROP DATABASE IF EXISTS " + db) })
	return db
}

// PGConn opens a connection to the test PostgreSQL, in UTC, closed at
// cleanup.
func PGConn(t testing.TB) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(PG(t))
	if err != nil {
		t.Fatalf("parse TIDEMARK_TEST_PG_DSN: %v", err)
	}
	cfg.RuntimeParams["timezone"] = "UTC"
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("connect to the test PostgreSQL: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// Schema returns a fresh PostgreSQL schema name ("t_" and 12 hex digits)
// that is dropped, with everything in it, at cleanup. The schema itself is
// not created.
func Schema(t testing.TB) string {
	t.Helper()
	name := Name("t_") + Name("")[:4]
	dsn := PG(t)
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
