package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/internal/testenv"
	"tidemark/sink/kafka"
)

// TestApplyLayoutShownAgain (nemesis seed 105): the scale-out tailer's
// Kafka sink publishes rows of a table's layout A, then of layout B (one
// more column), then of A again, as a snapshot or catch-up read beside the
// stream, or a stream read again after a reconnect, does. Every applier
// writes a row only with the schema last announced on its partition, so
// the sink must announce A again before those rows; it announced each
// layout once per process, and every member stopped in turn with "the row
// was written with table schema X, but the schema last announced on the
// partition is Y". On the real broker with `tidemark apply`: the target
// holds every row and the applier keeps running.
func TestApplyLayoutShownAgain(t *testing.T) {
	f := newFixture(t)
	r, _ := f.newApplyRun(t, "it_applyback_", 105, 2, 50)
	ctx, cancel := context.WithTimeout(f.ctx, 2*time.Minute)
	defer cancel()
	sink, err := kafka.Open(ctx, kafka.Config{Brokers: r.brokers, TopicPrefix: r.prefix, CreateTopics: true, Partitions: 2,
		ExactlyOnce: true, TransactionalID: "tm-it-" + r.db, ControlRecords: true, Tombstones: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	id := tidemark.TableID{Database: r.db, Name: "layouts"}
	a := &tidemark.Table{ID: id, Key: []int{0}, Columns: []tidemark.Column{
		{Name: "id", Kind: tidemark.KindInt, Bits: 64}, {Name: "v", Kind: tidemark.KindText, Nullable: true}}}
	b := &tidemark.Table{ID: id, Key: []int{0}, Columns: append(append([]tidemark.Column(nil), a.Columns...),
		tidemark.Column{Name: "w", Kind: tidemark.KindText, Nullable: true})}
	seq := uint64(0)
	publish := func(tb *tidemark.Table, ids ...int64) {
		t.Helper()
		var chs []tidemark.Change
		seq++
		for i, k := range ids {
			row := []any{k, "v"}
			if tb == b {
				row = append(row, "w")
			}
			chs = append(chs, tidemark.Change{Op: tidemark.OpInsert, Table: tb, Version: tidemark.Version{Seq: 1000 + seq, Index: uint32(i + 1)},
				CommitTime: time.Now().UTC(), After: row})
		}
		if _, err := sink.Apply(ctx, &tidemark.Batch{Source: r.db, Checkpoint: tidemark.Position{GTID: fmt.Sprintf("0-1001-%d", 1000+seq)}, Changes: chs}); err != nil {
			t.Fatal(err)
		}
	}
	publish(a, 1, 2, 3, 4)
	publish(b, 5, 6, 7, 8)
	publish(a, 9, 10, 11, 12)
	ps := &procSet{f: f, t: t}
	defer ps.killAll()
	applier := ps.start("apply", "--config", r.cfg)
	var n int
	if !testenv.WaitFor(90*time.Second, func() bool {
		_ = f.pg.QueryRow(f.ctx, `SELECT count(*) FROM "`+r.db+`".layouts`).Scan(&n)
		return n == 12 || applier.exited()
	}) || n != 12 {
		t.Fatalf("the target holds %d of 12 rows (applier exited: %v):\n%s", n, applier.exited(), grepLines(applier.stderr.String(), "level=ERROR")+tail(applier.stderr.String(), 5))
	}
	if s := applier.stderr.String(); strings.Contains(s, "level=ERROR") {
		t.Fatalf("the applier logged an error:\n%s", grepLines(s, "level=ERROR"))
	}
	var w int
	if err := f.pg.QueryRow(f.ctx, `SELECT count(*) FROM "`+r.db+`".layouts WHERE w = 'w'`).Scan(&w); err != nil || w != 4 {
		t.Fatalf("rows of layout B with w: %d (%v), want 4", w, err)
	}
	if code := applier.stop(t); code != 0 {
		t.Fatalf("applier exit %d:\n%s", code, tail(applier.stderr.String(), 20))
	}
}
