package postgres

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"tidemark"
)

// The benchmarks compare Apply with the ceiling of a plain binary COPY of
// the same rows, in the same run (ratios, not absolute numbers, are what to
// read; see the field notes for this machine type). Run with
//
//	go test -run '^$' -bench . -benchtime 20x ./sink/postgres/

const benchBatch = 5000

func benchTable() *tidemark.Table {
	return &tidemark.Table{
		ID: tidemark.TableID{Database: "bench", Name: "orders"},
		Columns: []tidemark.Column{
			{Name: "id", Kind: tidemark.KindInt, Bits: 64},
			{Name: "customer", Kind: tidemark.KindText, Nullable: true},
			{Name: "qty", Kind: tidemark.KindInt, Bits: 32, Nullable: true},
			{Name: "price", Kind: tidemark.KindDecimal, Precision: 12, Scale: 2, Nullable: true},
			{Name: "created", Kind: tidemark.KindDateTime, Nullable: true},
			{Name: "note", Kind: tidemark.KindBytes, Nullable: true},
		},
		Key: []int{0},
	}
}

func benchChanges(tbl *tidemark.Table, firstKey int64, seq uint64) []tidemark.Change {
	out := make([]tidemark.Change, benchBatch)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range out {
		k := firstKey + int64(i)
		out[i] = tidemark.Change{
			Op: tidemark.OpInsert, Table: tbl, Version: tidemark.Version{Seq: seq, Index: uint32(i + 1)}, CommitTime: t0,
			After: []any{k, fmt.Sprintf("customer-%d", k%977), int64(i % 50), tidemark.Decimal(fmt.Sprintf("%d.%02d", k%100000, k%100)),
				t0.Add(time.Duration(k) * time.Second), []byte("some bytes of a note")},
		}
	}
	return out
}

func newBenchEnv(b *testing.B) *env {
	return newEnv(b, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil)) })
}

// BenchmarkApply applies batches of 5000 changes: new keys (all inserts),
// the same keys again with newer versions (all updates), and deletes of
// existing keys (hard deletes, each writing a tombstone).
func BenchmarkApply(b *testing.B) {
	for _, mode := range []string{"insert", "update", "delete"} {
		b.Run(mode, func(b *testing.B) {
			e := newBenchEnv(b)
			tbl := benchTable()
			ctx := context.Background()
			if mode == "update" {
				if _, err := e.sink.Apply(ctx, &tidemark.Batch{Source: "s", Changes: benchChanges(tbl, 0, 1)}); err != nil {
					b.Fatal(err)
				}
			}
			batches := make([]*tidemark.Batch, b.N)
			for i := range batches {
				first := int64(0)
				if mode != "update" {
					first = int64(i+1) * benchBatch
				}
				batches[i] = &tidemark.Batch{Source: "s", Checkpoint: gtid(i + 2), Changes: benchChanges(tbl, first, uint64(i+2))}
			}
			if mode == "delete" {
				// The rows first (untimed), then their deletes.
				for i, bt := range batches {
					if _, err := e.sink.Apply(ctx, bt); err != nil {
						b.Fatal(err)
					}
					dels := make([]tidemark.Change, len(bt.Changes))
					for j, c := range bt.Changes {
						dels[j] = tidemark.Change{Op: tidemark.OpDelete, Table: tbl, Before: c.After, Version: tidemark.Version{Seq: uint64(b.N + i + 2), Index: uint32(j + 1)}, CommitTime: c.CommitTime}
					}
					batches[i] = &tidemark.Batch{Source: "s", Checkpoint: gtid(b.N + i + 2), Changes: dels}
				}
			}
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				st, err := e.sink.Apply(ctx, batches[i])
				if err != nil {
					b.Fatal(err)
				}
				if (mode == "insert" && st.Inserted != benchBatch) || (mode == "update" && st.Updated != benchBatch) || (mode == "delete" && st.Deleted != benchBatch) {
					b.Fatalf("stats %+v", st)
				}
			}
			b.ReportMetric(float64(b.N*benchBatch)/time.Since(start).Seconds(), "rows/s")
		})
	}
}

// BenchmarkCopyCeiling is the ceiling: one binary CopyFrom of the same
// (already converted) rows into a plain table per transaction.
func BenchmarkCopyCeiling(b *testing.B) {
	e := newBenchEnv(b)
	ctx := context.Background()
	tbl := benchTable()
	d, err := newTableDef(tbl, e.schema, DeleteHard, true, "", "")
	if err != nil {
		b.Fatal(err)
	}
	if _, err := e.conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+tidemark.QuotePostgres(e.schema)); err != nil {
		b.Fatal(err)
	}
	if _, err := e.conn.Exec(ctx, d.createTableSQL); err != nil {
		b.Fatal(err)
	}
	cols := d.copyColumns[1:]
	batches := make([][][]any, b.N)
	for i := range batches {
		for _, c := range benchChanges(tbl, int64(i)*benchBatch, uint64(i+1)) {
			r := make([]any, 0, len(cols))
			for ci := range tbl.Columns {
				v, err := convert(tbl.ID, &tbl.Columns[ci], c.After[ci])
				if err != nil {
					b.Fatal(err)
				}
				r = append(r, v)
			}
			batches[i] = append(batches[i], append(r, int64(c.Version.Seq), int32(c.Version.Index), c.CommitTime.UTC()))
		}
	}
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		err := pgx.BeginFunc(ctx, e.conn, func(tx pgx.Tx) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{e.schema, tbl.ID.Name}, cols, pgx.CopyFromRows(batches[i]))
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*benchBatch)/time.Since(start).Seconds(), "rows/s")
}
