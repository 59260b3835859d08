package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"tidemark"
	"tidemark/internal/testenv"
)

func TestRetryable(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"serialization failure", &pgconn.PgError{Code: "40001"}, true},
		{"deadlock", fmt.Errorf("x: %w", &pgconn.PgError{Code: "40P01"}), true},
		{"admin shutdown", &pgconn.PgError{Code: "57P01"}, true},
		{"cannot connect now", &pgconn.PgError{Code: "57P03"}, true},
		{"too many connections", &pgconn.PgError{Code: "53300"}, true},
		{"connection failure", &pgconn.PgError{Code: "08006"}, true},
		{"numeric overflow", &pgconn.PgError{Code: "22003"}, false},
		{"unique violation", &pgconn.PgError{Code: "23505"}, false},
		{"bad password", &pgconn.PgError{Code: "28P01"}, false},
		{"undefined table", &pgconn.PgError{Code: "42P01"}, false},
		{"EOF", fmt.Errorf("read: %w", io.EOF), true},
		{"unexpected EOF", io.ErrUnexpectedEOF, true},
		{"net error", &net.OpError{Op: "read", Err: errors.New("reset")}, true},
		{"cancelled", context.Canceled, false},
		{"value error", &tidemark.ValueError{Detail: "x"}, false},
		{"stats mismatch", tidemark.ErrStatsMismatch, false},
		{"ambiguous commit", &ambiguousCommitError{err: io.EOF}, true},
		{"plain error", errors.New("boom"), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := retryable(c.err); got != c.want {
				t.Errorf("retryable(%v) = %t, want %t", c.err, got, c.want)
			}
		})
	}
}

var errInjectedConnLoss = &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer (injected)")}

func TestAmbiguousCommit(t *testing.T) {
	cases := []struct {
		name string
		// commit is the first attempt's COMMIT; later attempts commit
		// normally.
		commit       func(ctx context.Context, tx pgx.Tx) error
		wantAttempts int
	}{
		{"committed, then the connection was lost", func(ctx context.Context, tx pgx.Tx) error {
			if err := tx.Commit(ctx); err != nil {
				return err
			}
			return errInjectedConnLoss
		}, 1},
		{"lost before it committed", func(ctx context.Context, tx pgx.Tx) error {
			if err := tx.Rollback(ctx); err != nil {
				return err
			}
			return errInjectedConnLoss
		}, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			tbl := simpleTable("amb")
			attempts := 0
			e.sink.hookCommit = func(ctx context.Context, tx pgx.Tx) error {
				attempts++
				if attempts == 1 {
					return c.commit(ctx, tx)
				}
				return tx.Commit(ctx)
			}
			st := e.apply(&tidemark.Batch{Source: "s", Checkpoint: gtid(3), Changes: []tidemark.Change{
				ins(tbl, v(3, 1), int64(1), "a", nil), ins(tbl, v(3, 2), int64(2), "b", nil)}})
			// Either way the stats are those of the transaction that
			// committed: nothing was applied twice.
			if st != (tidemark.ApplyStats{Inserted: 2}) {
				t.Errorf("stats = %+v, want 2 inserted", st)
			}
			if attempts != c.wantAttempts {
				t.Errorf("%d attempts, want %d", attempts, c.wantAttempts)
			}
			if got := e.rows(`SELECT count(*) FROM ` + e.table("amb")); got[0] != "2" {
				t.Errorf("rows = %q", got)
			}
			if pos, _ := e.checkpoint("s"); pos != gtid(3) {
				t.Errorf("checkpoint = %v", pos)
			}
		})
	}
}

// A batch without a checkpoint (part of a split transaction) cannot prove
// that a "committed" transaction id is its own (ids can be reissued after a
// crash), so it is replayed: the data stays right, the second attempt
// counts the rows as skipped.
func TestAmbiguousCommitWithoutCheckpointReplays(t *testing.T) {
	e := newEnv(t)
	tbl := simpleTable("ambnc")
	attempts := 0
	e.sink.hookCommit = func(ctx context.Context, tx pgx.Tx) error {
		attempts++
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		if attempts == 1 {
			return errInjectedConnLoss
		}
		return nil
	}
	st := e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{
		ins(tbl, v(3, 1), int64(1), "a", nil), ins(tbl, v(3, 2), int64(2), "b", nil)}})
	if attempts != 2 || st != (tidemark.ApplyStats{Skipped: 2}) {
		t.Fatalf("%d attempts, stats %+v; want a replay counted as 2 skipped", attempts, st)
	}
	if got := e.rows(`SELECT count(*) FROM ` + e.table("ambnc")); got[0] != "2" {
		t.Errorf("rows = %q", got)
	}
}

func TestCheckpointCommittedFallback(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.apply(&tidemark.Batch{Source: "s", Checkpoint: gtid(5)})
	for _, c := range []struct {
		name string
		cp   tidemark.Position
		want bool
	}{
		{"stored checkpoint is the batch's", gtid(5), true},
		{"stored checkpoint is older", gtid(6), false},
		{"batch without checkpoint", tidemark.Position{}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := e.sink.checkpointCommitted(ctx, &tidemark.Batch{Source: "s", Checkpoint: c.cp})
			if err != nil || got != c.want {
				t.Errorf("checkpointCommitted = %t, %v; want %t", got, err, c.want)
			}
		})
	}
}

func TestRetryAfterBackendTerminated(t *testing.T) {
	e := newEnv(t)
	tbl := simpleTable("term")
	attempts := 0
	e.sink.hookBeforeCommit = func(ctx context.Context, tx pgx.Tx) error {
		attempts++
		if attempts > 1 {
			return nil
		}
		var pid int32
		if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			return err
		}
		var ok bool
		if err := e.conn.QueryRow(ctx, "SELECT pg_terminate_backend($1, 5000)", pid).Scan(&ok); err != nil || !ok {
			t.Errorf("terminate backend %d: %t %v", pid, ok, err)
		}
		return nil
	}
	st := e.apply(&tidemark.Batch{Source: "s", Checkpoint: gtid(1), Changes: []tidemark.Change{ins(tbl, v(1, 1), int64(1), "a", nil)}})
	if st != (tidemark.ApplyStats{Inserted: 1}) || attempts != 2 {
		t.Errorf("stats = %+v after %d attempts, want 1 inserted after 2", st, attempts)
	}
	if pos, _ := e.checkpoint("s"); pos != gtid(1) {
		t.Errorf("checkpoint = %v", pos)
	}
}

func TestRetryClassificationInApply(t *testing.T) {
	cases := []struct {
		name         string
		err          error
		wantAttempts int
		wantErr      bool
	}{
		{"serialization failure is retried", &pgconn.PgError{Code: "40001", Message: "injected"}, 2, false},
		{"data error is not", &pgconn.PgError{Code: "22012", Message: "injected"}, 1, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			attempts := 0
			e.sink.hookBeforeCommit = func(ctx context.Context, tx pgx.Tx) error {
				attempts++
				if attempts == 1 {
					return c.err
				}
				return nil
			}
			_, err := e.sink.Apply(context.Background(), &tidemark.Batch{Source: "s", Checkpoint: gtid(1),
				Changes: []tidemark.Change{ins(simpleTable("cls"), v(1, 1), int64(1), "a", nil)}})
			if (err != nil) != c.wantErr || attempts != c.wantAttempts {
				t.Errorf("Apply = %v after %d attempts; want error %t after %d", err, attempts, c.wantErr, c.wantAttempts)
			}
			_, stored := e.checkpoint("s")
			if stored == c.wantErr {
				t.Errorf("checkpoint stored = %t after error = %v", stored, err)
			}
		})
	}
}

// TestConcurrentFirstSight has two sinks (two pools) create the same new
// schema and tables at once: CREATE SCHEMA/TABLE IF NOT EXISTS race without
// the DDL lock.
func TestConcurrentFirstSight(t *testing.T) {
	a := newEnv(t)
	schema := a.schema
	b := newEnv(t, func(c *Config) { c.TargetSchema = schema })
	for round := 0; round < 3; round++ {
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for _, e := range []*env{a, b, a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var changes []tidemark.Change
				for i := 0; i < 4; i++ {
					changes = append(changes, ins(simpleTable(fmt.Sprintf("r%d_t%d", round, i)), v(1, uint32(i+1)), int64(1), "x", nil))
				}
				if _, err := e.sink.Apply(context.Background(), &tidemark.Batch{Source: "s", Changes: changes}); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("round %d: %v", round, err)
		}
	}
}

func TestSSLModeWarning(t *testing.T) {
	cfg, err := parseTestDSN(testenv.PG(t))
	if err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf("postgres://%s:%s@%s:%d/%s", cfg.User, cfg.Password, cfg.Host, cfg.Port, cfg.Database)
	cases := []struct {
		name string
		dsn  string
		warn bool
	}{
		{"default prefer", base, true},
		{"explicit prefer", base + "?sslmode=prefer", true},
		{"disable", base + "?sslmode=disable", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			s, err := Open(context.Background(), Config{DSN: c.dsn, Checkpoints: newStore(t),
				Logger: slog.New(slog.NewTextHandler(&buf, nil))})
			if err != nil {
				t.Fatal(err)
			}
			s.Close()
			out := buf.String()
			if got := strings.Contains(out, "plaintext"); got != c.warn {
				t.Errorf("warning logged = %t, want %t; log: %s", got, c.warn, out)
			}
			if cfg.Password != "" && strings.Contains(out, cfg.Password) {
				t.Errorf("log leaks the password: %s", out)
			}
		})
	}
}

// A snapshot row (Index 0) with a newer version but the same values changes
// nothing, not even _tm_loaded_at; with other values it updates. Binlog
// changes with the same values still apply (their version matters).
func TestIdenticalSnapshotRowIsANoOp(t *testing.T) {
	for _, soft := range []bool{false, true} {
		t.Run(fmt.Sprintf("soft=%t", soft), func(t *testing.T) {
			var opts []envOption
			if soft {
				opts = append(opts, softDeletes)
			}
			e := newEnv(t, opts...)
			tbl := simpleTable("snapnoop")
			read := func(ver tidemark.Version, vals ...any) tidemark.Change {
				return tidemark.Change{Op: tidemark.OpRead, Table: tbl, After: vals, Version: ver, CommitTime: commitT0}
			}
			e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{ins(tbl, v(5, 1), int64(1), "a", int64(1))}})
			before := e.rows(`SELECT _tm_loaded_at::text || _tm_seq::text FROM ` + e.table("snapnoop"))
			time.Sleep(10 * time.Millisecond)
			st := e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{read(v(9, 0), int64(1), "a", int64(1))}})
			if st != (tidemark.ApplyStats{Skipped: 1}) {
				t.Fatalf("identical snapshot row: %+v, want 1 skipped", st)
			}
			if after := e.rows(`SELECT _tm_loaded_at::text || _tm_seq::text FROM ` + e.table("snapnoop")); after[0] != before[0] {
				t.Fatalf("identical snapshot row changed the target: %s → %s", before[0], after[0])
			}
			st = e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{read(v(10, 0), int64(1), "b", int64(1))}})
			if st != (tidemark.ApplyStats{Updated: 1}) {
				t.Fatalf("changed snapshot row: %+v, want 1 updated", st)
			}
			st = e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{upd(tbl, v(11, 1), row(int64(1), "b", int64(1)), row(int64(1), "b", int64(1)))}})
			if st != (tidemark.ApplyStats{Updated: 1}) {
				t.Fatalf("newer binlog change with the same values: %+v, want 1 updated", st)
			}
		})
	}
}
