package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"tidemark"
)

// pgShape is one table layout the same rows are loaded into.
type pgShape struct {
	name    string
	ddl     string // CREATE TABLE of %s (the quoted table name)
	narrow  bool   // the rows without tidemark's four _tm_ columns
	after   string // run after the load (the key built then), of %s; empty: none
	summary string
}

// pgShapes: tidemark's target table of the peers' table first (the
// reference), then each difference from it that the peers' tables have.
// pgloader and pg_chameleon both load MariaDB's JSON (a LONGTEXT) as text,
// carry no metadata columns and build the key after the load.
var pgShapes = []pgShape{
	{name: "tidemark's target", ddl: `CREATE TABLE %s (id bigint PRIMARY KEY, amount numeric(12,2) NOT NULL, name text NOT NULL,
		created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL, doc jsonb, _tm_seq bigint NOT NULL, _tm_idx integer NOT NULL,
		_tm_commit_time timestamptz, _tm_loaded_at timestamptz NOT NULL DEFAULT now())`, summary: "jsonb, _tm_ columns, key during the load"},
	{name: "key built after the load", ddl: `CREATE TABLE %s (id bigint NOT NULL, amount numeric(12,2) NOT NULL, name text NOT NULL,
		created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL, doc jsonb, _tm_seq bigint NOT NULL, _tm_idx integer NOT NULL,
		_tm_commit_time timestamptz, _tm_loaded_at timestamptz NOT NULL DEFAULT now())`, after: "ALTER TABLE %s ADD PRIMARY KEY (id)", summary: "as tidemark's, the key after"},
	{name: "doc as text", ddl: `CREATE TABLE %s (id bigint PRIMARY KEY, amount numeric(12,2) NOT NULL, name text NOT NULL,
		created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL, doc text, _tm_seq bigint NOT NULL, _tm_idx integer NOT NULL,
		_tm_commit_time timestamptz, _tm_loaded_at timestamptz NOT NULL DEFAULT now())`, summary: "as tidemark's, doc text"},
	{name: "no _tm_ columns", ddl: `CREATE TABLE %s (id bigint PRIMARY KEY, amount numeric(12,2) NOT NULL, name text NOT NULL,
		created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL, doc jsonb)`, narrow: true, summary: "as tidemark's, without the 4 columns"},
	{name: "the peers' shape", ddl: `CREATE TABLE %s (id bigint NOT NULL, amount numeric(12,2) NOT NULL, name text NOT NULL,
		created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL, doc text)`, narrow: true, after: "ALTER TABLE %s ADD PRIMARY KEY (id)", summary: "doc text, no _tm_ columns, the key after"},
}

// benchPGShapes measures PostgreSQL's own share of a first-run snapshot:
// tidemark's copy of the peers' table (`tidemark catchup`, no checkpoint)
// is read out once in COPY's binary format, then loaded, o.runs times and
// interleaved, into each of pgShapes by one COPY from memory (then its
// after statement), each after the same quiet point. No MariaDB and no
// tidemark in the timed part: what the target's layout costs PostgreSQL.
func benchPGShapes(ctx context.Context, o options) error {
	sv, err := connect(ctx)
	if err != nil {
		return err
	}
	defer sv.close(ctx)
	env, pg := sv.env, sv.pg
	cleanup, err := buildTidemark(&o)
	if err != nil {
		return err
	}
	defer cleanup()
	rows := o.pgShapeRows
	if err := loadPeersTable(sv.my, rows); err != nil {
		return err
	}
	if err := resetTargets(ctx, pg, "pgshapes_"); err != nil {
		return err
	}
	defer resetTargets(context.WithoutCancel(ctx), pg, "pgshapes_")
	const source = "pgshapes_tm"
	cfg, err := writeConfigDB(env, source, peersDB, "t", tidemark.Position{})
	if err != nil {
		return err
	}
	defer os.Remove(cfg)
	if out, err := tidemarkCmd(o.bin, cfg, env, "catchup"); err != nil {
		return fmt.Errorf("tidemark catchup: %v\n%s", err, out)
	}
	src := pgx.Identifier{source, "t"}.Sanitize()
	var wide, narrow bytes.Buffer
	if _, err := pg.PgConn().CopyTo(ctx, &wide, "COPY "+src+" (id, amount, name, created_at, updated_at, doc, _tm_seq, _tm_idx, _tm_commit_time, _tm_loaded_at) TO STDOUT (FORMAT binary)"); err != nil {
		return fmt.Errorf("copy out %s: %w", src, err)
	}
	if _, err := pg.PgConn().CopyTo(ctx, &narrow, "COPY "+src+" (id, amount, name, created_at, updated_at, doc) TO STDOUT (FORMAT binary)"); err != nil {
		return fmt.Errorf("copy out %s: %w", src, err)
	}
	fmt.Fprintf(os.Stderr, "== %d rows of tidemark's copy read out: %d MB with the _tm_ columns, %d MB without\n", rows, wide.Len()>>20, narrow.Len()>>20)
	type run struct{ copy, after time.Duration }
	runs := make([][]run, len(pgShapes))
	var loads []string
	for i := 1; i <= o.runs; i++ {
		fmt.Fprintf(os.Stderr, "== [%d] each shape (load %s)\n", i, loadAvg())
		for k, sh := range pgShapes {
			tbl := pgx.Identifier{"pgshapes_x", "t"}.Sanitize()
			if _, err := pg.Exec(ctx, "DROP SCHEMA IF EXISTS pgshapes_x CASCADE"); err != nil {
				return err
			}
			if _, err := pg.Exec(ctx, "CREATE SCHEMA pgshapes_x; "+fmt.Sprintf(sh.ddl, tbl)); err != nil {
				return fmt.Errorf("%s: %w", sh.name, err)
			}
			if err := quiescePG(ctx, pg, "pgshapes_"); err != nil {
				return err
			}
			cols := "id, amount, name, created_at, updated_at, doc, _tm_seq, _tm_idx, _tm_commit_time, _tm_loaded_at"
			data := wide.Bytes()
			if sh.narrow {
				cols, data = "id, amount, name, created_at, updated_at, doc", narrow.Bytes()
			}
			var r run
			t0 := time.Now()
			tag, err := pg.PgConn().CopyFrom(ctx, bytes.NewReader(data), "COPY "+tbl+" ("+cols+") FROM STDIN (FORMAT binary)")
			if err != nil {
				return fmt.Errorf("%s: copy: %w", sh.name, err)
			}
			if tag.RowsAffected() != int64(rows) {
				return fmt.Errorf("%s: copied %d rows, want %d", sh.name, tag.RowsAffected(), rows)
			}
			r.copy = time.Since(t0)
			if sh.after != "" {
				t1 := time.Now()
				if _, err := pg.Exec(ctx, fmt.Sprintf(sh.after, tbl)); err != nil {
					return fmt.Errorf("%s: %w", sh.name, err)
				}
				r.after = time.Since(t1)
			}
			runs[k] = append(runs[k], r)
			fmt.Fprintf(os.Stderr, "   %-26s copy %s, after %s\n", sh.name, r.copy.Round(time.Millisecond), r.after.Round(time.Millisecond))
		}
		loads = append(loads, strings.Fields(loadAvg())[0])
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "table layout\twhat differs\tCOPY (median of %d)\tkey built after\ttotal\tper run\t÷ tidemark's target\n", o.runs)
	var ref float64
	for k, sh := range pgShapes {
		var c, a, tot []float64
		var per []string
		for _, r := range runs[k] {
			c, a = append(c, r.copy.Seconds()), append(a, r.after.Seconds())
			tot = append(tot, (r.copy + r.after).Seconds())
			per = append(per, fmt.Sprintf("%.2f", (r.copy+r.after).Seconds()))
		}
		m := medianOf(tot)
		if k == 0 {
			ref = m
		}
		after := "-"
		if sh.after != "" {
			after = fmt.Sprintf("%.2fs", medianOf(a))
		}
		fmt.Fprintf(tw, "%s\t%s\t%.2fs\t%s\t%.2fs\t%s\t%.2f\n", sh.name, sh.summary, medianOf(c), after, m, strings.Join(per, " "), m/ref)
	}
	tw.Flush()
	fmt.Print(b.String())
	if o.out == "" {
		return nil
	}
	return replaceSection(o.out, "pg-shapes", fmt.Sprintf("## PostgreSQL's share: the same rows into the target's layout and the peers' (`tidemark-bench -pg-shapes %d`, %s)\n\ntidemark's copy of the %d-row peers table (its first-run snapshot), read out once in COPY's binary format and loaded from memory by one COPY per layout, runs interleaved, each after the same quiet point (CHECKPOINT, no autovacuum worker); no MariaDB and no tidemark in the timed part. pgloader and pg_chameleon both load MariaDB's JSON column (a LONGTEXT) as text, carry no metadata columns and build the key after the load: the last row. Load after each run: %s. %s\n\n```\n%s```\n",
		rows, time.Now().UTC().Format("2006-01-02 15:04 UTC"), rows, strings.Join(loads, " "), machine(), b.String()))
}
