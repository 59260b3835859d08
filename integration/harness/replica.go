package harness

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	"github.com/jackc/pgx/v5"

	"tidemark"
	"tidemark/binlog"
	"tidemark/checkpoint"
	"tidemark/internal/testenv"
	"tidemark/sink/postgres"
)

// Replica is one test's source database, target schema (of the same name)
// and control schema on the local services, replicated on demand by a real
// tailer → pipeline → PostgreSQL sink. Everything is dropped when the test
// ends.
type Replica struct {
	T       testing.TB
	Env     Env
	My      *client.Conn
	PG      *pgx.Conn
	DB      string // source database = target schema
	Control string // control schema
	// Start is the source position before the test wrote anything.
	Start tidemark.Position
}

// NewReplica connects to the local services and creates the source
// database; prefix starts the database and control schema names.
func NewReplica(t testing.TB, prefix string) *Replica {
	t.Helper()
	env, err := EnvFromOS()
	if err != nil {
		t.Fatal(err) // names the command that sets the environment
	}
	my, err := env.MySQL()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { my.Close() })
	ctx := context.Background()
	pg, err := env.PG(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close(context.Background()) })
	r := &Replica{T: t, Env: env, My: my, PG: pg, DB: testenv.Name(prefix + "_"), Control: testenv.Name(prefix + "c_")}
	t.Cleanup(func() {
		_, _ = my.Execute("DROP DATABASE IF EXISTS " + r.DB)
		c, err := env.PG(context.Background())
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		_, _ = c.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+r.DB+`" CASCADE`)
		_, _ = c.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+r.Control+`" CASCADE`)
	})
	if r.Start, err = SourcePosition(my); err != nil {
		t.Fatal(err)
	}
	r.Source("CREATE DATABASE " + r.DB)
	return r
}

// Source runs statements on the source, failing the test at the first
// error.
func (r *Replica) Source(sqls ...string) {
	r.T.Helper()
	for _, q := range sqls {
		if _, err := r.My.Execute(q); err != nil {
			r.T.Fatalf("source: %s: %v", q, err)
		}
	}
}

// Target runs statements on the target, failing the test at the first
// error.
func (r *Replica) Target(sqls ...string) {
	r.T.Helper()
	for _, q := range sqls {
		if _, err := r.PG.Exec(context.Background(), q); err != nil {
			r.T.Fatalf("target: %s: %v", q, err)
		}
	}
}

// Replicate runs the pipeline from Start until it has committed everything
// the source has written so far, then stops it. bc is the tailer's config;
// pc the sink's (its checkpoints go to the control schema, its log is
// discarded).
func (r *Replica) Replicate(bc binlog.Config, pc postgres.Config) {
	r.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tailer, err := binlog.New(bc)
	if err != nil {
		r.T.Fatal(err)
	}
	store, err := checkpoint.New(checkpoint.Config{Schema: r.Control})
	if err != nil {
		r.T.Fatal(err)
	}
	pc.Checkpoints, pc.Logger = store, slog.New(slog.DiscardHandler)
	sink, err := postgres.Open(ctx, pc)
	if err != nil {
		r.T.Fatal(err)
	}
	defer sink.Close()
	p, err := tidemark.NewPipeline(tidemark.PipelineConfig{Source: bc.Name, MaxDelay: 20 * time.Millisecond}, tailer, nil, sink)
	if err != nil {
		r.T.Fatal(err)
	}
	target, err := SourcePosition(r.My)
	if err != nil {
		r.T.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx, r.Start) }()
	for {
		_, last := p.Totals()
		if c, err := (tidemark.Position{GTID: last.GTID}).Compare(target); err == nil && c >= 0 {
			break
		}
		select {
		case err := <-done:
			stop()
			r.T.Fatalf("pipeline stopped: %v", err)
		case <-ctx.Done():
			stop()
			r.T.Fatalf("not caught up to %s", target)
		case <-time.After(20 * time.Millisecond):
		}
	}
	stop()
	// Run may report the cancellation when it lands during an apply (a
	// pipeline race, reported separately); everything needed is committed.
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		r.T.Fatal(err)
	}
}
