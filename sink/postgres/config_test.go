package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/checkpoint"
	"tidemark/internal/testenv"
)

func TestConfigErrors(t *testing.T) {
	store, err := checkpoint.New(checkpoint.Config{Schema: "x"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no dsn", Config{Checkpoints: store}, "postgres sink config: dsn: required"},
		{"no checkpoints", Config{DSN: "postgres://localhost/x"}, "postgres sink config: checkpoints: required"},
		{"delete mode", Config{DSN: "postgres://localhost/x", Checkpoints: store, DeleteMode: "x"}, `postgres sink config: delete_mode: must be "hard" or "soft", got "x"`},
		{"target schema", Config{DSN: "postgres://localhost/x", Checkpoints: store, TargetSchema: `a"b`}, "postgres sink config: target_schema: invalid identifier"},
		{"target schema above 63 bytes", Config{DSN: "postgres://localhost/x", Checkpoints: store, TargetSchema: strings.Repeat("ж", 32)}, "postgres sink config: target_schema: invalid identifier: schema \"" + strings.Repeat("ж", 32) + "\" is 64 bytes"},
		{"max conns", Config{DSN: "postgres://localhost/x", Checkpoints: store, MaxConns: -1}, "postgres sink config: max_conns"},
		{"unparseable dsn", Config{DSN: "postgres://user:hunter2-secret@host:notaport/db", Checkpoints: store}, "postgres sink config: dsn: cannot parse"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Open(context.Background(), c.cfg)
			if err == nil || !strings.HasPrefix(err.Error(), c.want) {
				t.Fatalf("Open = %v, want an error starting with %q", err, c.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error leaks the password: %q", err)
			}
		})
	}
}

func TestPasswordNotInErrors(t *testing.T) {
	cfg, err := parseTestDSN(testenv.PG(t))
	if err != nil {
		t.Fatal(err)
	}
	const secret = "Wr0ng-s3cret-pw"
	cases := []struct {
		name string
		dsn  string
	}{
		{"wrong password url", fmt.Sprintf("postgres://%s:%s@%s:%d/%s?sslmode=disable", cfg.User, secret, cfg.Host, cfg.Port, cfg.Database)},
		{"wrong password keyword form", fmt.Sprintf("host=%s port=%d user=%s password=%s dbname=%s sslmode=disable", cfg.Host, cfg.Port, cfg.User, secret, cfg.Database)},
		{"unknown user", fmt.Sprintf("postgres://nosuchuser:%s@%s:%d/%s?sslmode=disable", secret, cfg.Host, cfg.Port, cfg.Database)},
		{"nothing listening", fmt.Sprintf("postgres://%s:%s@127.0.0.1:1/%s?sslmode=disable&connect_timeout=2", cfg.User, secret, cfg.Database)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			_, err := Open(ctx, Config{DSN: c.dsn, Checkpoints: newStore(t),
				Retry: tidemark.Backoff{Initial: time.Millisecond, Max: 10 * time.Millisecond, Attempts: 2}})
			if err == nil {
				t.Fatal("Open succeeded")
			}
			t.Logf("error: %v", err)
			if strings.Contains(err.Error(), secret) || strings.Contains(fmt.Sprintf("%+v", err), secret) {
				t.Errorf("error leaks the password: %q", err)
			}
			for e := error(err); e != nil; e = errors.Unwrap(e) {
				if strings.Contains(e.Error(), secret) {
					t.Errorf("a wrapped error leaks the password: %T %q", e, e)
				}
			}
			if hasConnectError(err) {
				t.Error("error chain exposes a pgconn.ConnectError (its Config holds the password)")
			}
		})
	}
}
