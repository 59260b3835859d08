package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"tidemark/binlog"
	"tidemark/checkpoint"
	"tidemark/sink/postgres"
)

// cmdPlan prints the DDL tidemark would run on the PostgreSQL target for
// every included source table — the table when it is missing, what aligning
// an existing one takes (columns, types, NOT NULL), and the secondary
// indexes it mirrors — without running any of it (the target's catalog is
// read in read-only transactions). Indexes that cannot be mirrored are
// named on stderr.
func cmdPlan(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, _, err := loadConfigFlag("plan", args, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "tidemark:", err)
		return exitUsage
	}
	if err := cfg.needPostgres("plan"); err != nil {
		fmt.Fprintln(stderr, err)
		return exitUsage
	}
	log := newLogger(cfg.Log, stderr)
	bc, err := cfg.BinlogConfig()
	if err != nil {
		fmt.Fprintln(stderr, "tidemark:", err)
		return exitUsage
	}
	bc.Logger = log.With("component", "binlog")
	reader, err := binlog.NewReader(bc)
	if err != nil {
		fmt.Fprintln(stderr, "tidemark:", err)
		return exitUsage
	}
	defer reader.Close()
	sink, err := openCommandSink(ctx, cfg, log, true)
	if err != nil {
		log.Error("plan failed", "err", err)
		return exitFailed
	}
	defer sink.Close()
	tables, err := reader.Tables(ctx)
	if err != nil {
		log.Error("plan failed", "err", err)
		return exitFailed
	}
	fmt.Fprintf(stdout, "-- tidemark plan for source %s: %d tables (nothing is run)\n", cfg.Source.Name, len(tables))
	failed := false
	for _, id := range tables {
		t, err := reader.Table(ctx, id)
		if err != nil {
			fmt.Fprintf(stdout, "\n-- %s: not replicated: %v\n", id, err)
			continue
		}
		idx, err := reader.Indexes(ctx, id)
		if err != nil {
			log.Error("plan failed", "table", id.String(), "err", err)
			return exitFailed
		}
		stmts, err := sink.Plan(ctx, t, idx)
		if err != nil {
			fmt.Fprintf(stdout, "\n-- %s: cannot be aligned: %v\n", id, err)
			failed = true
			continue
		}
		if len(stmts) == 0 {
			fmt.Fprintf(stdout, "\n-- %s: up to date\n", id)
			continue
		}
		fmt.Fprintf(stdout, "\n-- %s\n", id)
		for _, s := range stmts {
			fmt.Fprintf(stdout, "%s;\n", s)
		}
	}
	if failed {
		return exitFailed
	}
	return exitOK
}

// openCommandSink opens the PostgreSQL sink for a command that is not the
// daemon (3 attempts per operation). With readOnly it leaves the control
// tables alone.
func openCommandSink(ctx context.Context, cfg *Config, log *slog.Logger, readOnly bool) (*postgres.Sink, error) {
	store, err := checkpoint.New(checkpoint.Config{Schema: cfg.Target.Postgres.ControlSchema})
	if err != nil {
		return nil, err
	}
	pc := cfg.PostgresSinkConfig()
	pc.Checkpoints = store
	pc.Logger = log.With("component", "postgres")
	pc.Retry.Attempts = 3
	pc.SkipInit = readOnly
	return postgres.Open(ctx, pc)
}
