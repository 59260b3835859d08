package tidemark

import (
	"fmt"
	"testing"
	"time"
)

// TestBatcherCuts: a batch is cut at the first commit once it is full (by
// changes or by bytes), and without a commit only when it is twice over; a
// split transaction's batch carries the last boundary inside it (none
// here).
func TestBatcherCuts(t *testing.T) {
	tbl := &Table{ID: TableID{Database: "d", Name: "t"}}
	chg := func(seq uint64, n int) []Change {
		out := make([]Change, n)
		for i := range out {
			out[i] = Change{Table: tbl, Version: Version{Seq: seq, Index: uint32(i + 1)}, Size: 100}
		}
		return out
	}
	pos := func(n int) Position { return Position{GTID: fmt.Sprintf("0-1-%d", n)} }
	type step struct {
		ch      Chunk
		cut     bool
		changes int      // in the batch when cut
		cp      Position // its checkpoint when cut
	}
	for _, tc := range []struct {
		name       string
		maxChanges int
		maxBytes   int
		steps      []step
	}{
		{"by changes at a commit", 5, 1 << 20, []step{
			{ch: Chunk{Changes: chg(1, 3), Commit: pos(1)}},
			{ch: Chunk{Changes: chg(2, 3), Commit: pos(2)}, cut: true, changes: 6, cp: pos(2)},
		}},
		{"full without a commit waits for one", 5, 1 << 20, []step{
			{ch: Chunk{Changes: chg(1, 6)}},
			{ch: Chunk{Changes: chg(1, 1), Commit: pos(1)}, cut: true, changes: 7, cp: pos(1)},
		}},
		{"twice over without a commit", 5, 1 << 20, []step{
			{ch: Chunk{Changes: chg(1, 2), Commit: pos(1)}},
			{ch: Chunk{Changes: chg(2, 4)}},
			{ch: Chunk{Changes: chg(2, 3)}},
			{ch: Chunk{Changes: chg(2, 1)}, cut: true, changes: 10, cp: pos(1)},
			{ch: Chunk{Changes: chg(2, 9)}},
			{ch: Chunk{Changes: chg(2, 1)}, cut: true, changes: 10},
		}},
		{"by bytes at a commit", 1000, 450, []step{
			{ch: Chunk{Changes: chg(1, 4), Commit: pos(1)}},
			{ch: Chunk{Changes: chg(2, 1), Commit: pos(2)}, cut: true, changes: 5, cp: pos(2)},
		}},
		{"twice over in bytes", 1000, 450, []step{
			{ch: Chunk{Changes: chg(1, 8)}},
			{ch: Chunk{Changes: chg(1, 1)}, cut: true, changes: 9},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBatcher(&PipelineConfig{Source: "s", MaxBatchChanges: tc.maxChanges, MaxBatchBytes: tc.maxBytes, MaxDelay: time.Hour})
			defer b.disarm()
			for i, s := range tc.steps {
				if cut := b.add(&s.ch); cut != s.cut {
					t.Fatalf("step %d: cut %v, want %v (batch of %d changes, %d bytes)", i, cut, s.cut, len(b.batch.Changes), b.bytes)
				}
				if !s.cut {
					continue
				}
				got := b.take()
				if len(got.Changes) != s.changes || got.Checkpoint != s.cp || got.Source != "s" {
					t.Fatalf("step %d: cut a batch of %d changes at %v (source %q), want %d at %v", i, len(got.Changes), got.Checkpoint, got.Source, s.changes, s.cp)
				}
				if len(b.batch.Changes) != 0 || b.bytes != 0 || !b.batch.Checkpoint.IsZero() {
					t.Fatalf("step %d: take left %d changes, %d bytes, checkpoint %v", i, len(b.batch.Changes), b.bytes, b.batch.Checkpoint)
				}
			}
		})
	}
}

// TestBatcherDelay: the delay timer is armed by a batch's first change or
// by a commit that arrives alone (only positions moved), not by a chunk of
// watermarks or a transaction's empty part, and take disarms it.
func TestBatcherDelay(t *testing.T) {
	pos := Position{GTID: "0-1-1"}
	one := []Change{{Table: &Table{}, Size: 1}}
	for _, tc := range []struct {
		name  string
		chunk Chunk
		armed bool
	}{
		{"first change", Chunk{Changes: one}, true},
		{"first change with its commit", Chunk{Changes: one, Commit: pos}, true},
		{"a commit alone", Chunk{Commit: pos}, true},
		{"watermarks with a commit", Chunk{Commit: pos, Watermarks: []Watermark{{}}}, false},
		{"nothing", Chunk{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBatcher(&PipelineConfig{Source: "s", MaxBatchChanges: 10, MaxBatchBytes: 1 << 20, MaxDelay: time.Hour})
			defer b.disarm()
			b.add(&tc.chunk)
			if armed := b.expired() != nil; armed != tc.armed {
				t.Fatalf("armed %v, want %v", armed, tc.armed)
			}
			b.take()
			if b.expired() != nil {
				t.Fatal("take left the timer armed")
			}
		})
	}
	// A timer already running is not restarted by later changes.
	b := newBatcher(&PipelineConfig{Source: "s", MaxBatchChanges: 10, MaxBatchBytes: 1 << 20, MaxDelay: time.Hour})
	defer b.disarm()
	b.add(&Chunk{Changes: one})
	first := b.timer
	b.add(&Chunk{Changes: one, Commit: pos})
	if b.timer != first {
		t.Fatal("a later change restarted the delay")
	}
}
