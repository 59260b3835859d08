package fallback

import (
	"context"
	"errors"
	"testing"
	"time"

	"tidemark"
)

// firstRunSource reads tid in chunks of two rows, ids 1 to 6, counting the
// captures and recording each read; every chunk's progress is recorded
// (with ProgressEvery everyChunk).
func firstRunSource(t *testing.T) (src *fakeSource, captures *int, reqs *[]tidemark.ReadRequest) {
	captures, reqs = new(int), &[]tidemark.ReadRequest{}
	return &fakeSource{
		capture: func() (tidemark.Snapshot, error) {
			*captures++
			s := snap
			s.Version.Seq += uint64(100 * *captures)
			return s, nil
		},
		tables: []tidemark.TableID{tid}, table: table,
		read: func(req tidemark.ReadRequest) (tidemark.ReadResult, error) {
			*reqs = append(*reqs, req)
			from := int64(0)
			if req.After != nil {
				from = req.After[0].(int64)
			}
			res := tidemark.ReadResult{Changes: rows(from+1, from+2)}
			if from+2 < 6 {
				res.Next = []any{from + 2}
			}
			return res, nil
		},
	}, captures, reqs
}

// everyChunk is a Config.ProgressEvery that records every chunk's cursor.
const everyChunk = time.Nanosecond

// killedAtSecondChunk is a first-run target whose apply of the second
// chunk fails with killed, as a kill would stop the run there.
func killedAtSecondChunk() (tgt *fakeTarget, killed error) {
	applies := 0
	killed = errors.New("killed")
	return &fakeTarget{firstRun: true, apply: func(b *tidemark.Batch) error {
		if len(b.Changes) > 0 {
			if applies++; applies == 2 {
				return killed
			}
		}
		return nil
	}}, killed
}

// TestFirstRunResumesWithItsCapture: a first run that stops after its
// first chunk (the apply of the second fails, as a kill would stop it)
// leaves its progress recorded; the next first run takes no new capture,
// reads after the recorded cursor with the first capture's version, and
// records the table streaming from that version before the checkpoint.
// Before, the next run captured again and read the table from its start.
func TestFirstRunResumesWithItsCapture(t *testing.T) {
	src, captures, reqs := firstRunSource(t)
	ctx := context.Background()
	tgt, killed := killedAtSecondChunk()
	c, err := New(Config{Source: "s", ChunkRows: 2, ProgressEvery: everyChunk}, src, tgt)
	if err != nil {
		t.Fatal(err)
	}
	reg := &fakeRegistry{states: map[tidemark.TableID]tidemark.TableState{}}
	if _, err := c.RunStreaming(ctx, noIndexes{}, reg, tgt); !errors.Is(err, killed) {
		t.Fatalf("first run: %v, want the apply's failure", err)
	}
	first := snap
	first.Version.Seq += 100
	st := reg.states[tid]
	if st.Mode != tidemark.TableSnapshotting || st.Floor != first.Version || st.Cursor == "" {
		t.Fatalf("recorded after the interruption: %+v", st)
	}
	*reqs, tgt.apply = nil, nil
	rep, err := c.RunStreaming(ctx, noIndexes{}, reg, tgt)
	if err != nil {
		t.Fatal(err)
	}
	if *captures != 1 || rep.Snapshot.Version != first.Version {
		t.Fatalf("the resumed run captured again (%d captures) or took version %s, want %s", *captures, rep.Snapshot.Version, first.Version)
	}
	if r := *reqs; len(r) == 0 || r[0].After == nil || r[0].After[0] != int64(2) || r[0].Snapshot.Version != first.Version {
		t.Fatalf("the resumed run did not read after the recorded cursor with the first capture: %+v", *reqs)
	}
	if tr := rep.Tables[0]; tr.Resumed != "ranges" || tr.Rows != 4 {
		t.Fatalf("report %+v, want resumed ranges with 4 rows read", tr)
	}
	if st := reg.states[tid]; st.Mode != tidemark.TableStreaming || st.Floor != first.Version || st.Cursor != "" {
		t.Fatalf("state after the resumed run %+v, want streaming from %s", st, first.Version)
	}
	last := tgt.batches[len(tgt.batches)-1]
	if last.Checkpoint != first.Position {
		t.Fatalf("checkpoint %s, want the first capture's %s", last.Checkpoint, first.Position)
	}
}

// TestFirstRunKeepsAResyncRequested: a resync asked for while the first
// run reads the table is not overwritten by the run's progress or its end:
// the stream performs it afterwards.
func TestFirstRunKeepsAResyncRequested(t *testing.T) {
	src, _, _ := firstRunSource(t)
	ctx := context.Background()
	reg := &fakeRegistry{states: map[tidemark.TableID]tidemark.TableState{}}
	tgt := &fakeTarget{firstRun: true, apply: func(b *tidemark.Batch) error {
		if len(b.Changes) > 0 && b.Changes[0].After[0] == int64(3) {
			_ = reg.SetTableState(ctx, "s", tidemark.TableState{Table: tid, Mode: tidemark.TableResyncRequested})
		}
		return nil
	}}
	c, err := New(Config{Source: "s", ChunkRows: 2, ProgressEvery: everyChunk}, src, tgt)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunStreaming(ctx, noIndexes{}, reg, tgt); err != nil {
		t.Fatal(err)
	}
	if st := reg.states[tid]; st.Mode != tidemark.TableResyncRequested {
		t.Fatalf("state after the first run %+v, want the resync requested during it", st)
	}
}

// TestFirstRunProgressEvery: Config.ProgressEvery (snapshot.progress_every)
// spaces the cursor writes. With an hour, a first run stopped after its
// first chunk has recorded only its begin, and the next run reads the
// table from its start (with everyChunk, the cursor after the first
// chunk is recorded: TestFirstRunResumesWithItsCapture).
func TestFirstRunProgressEvery(t *testing.T) {
	src, _, reqs := firstRunSource(t)
	ctx := context.Background()
	tgt, killed := killedAtSecondChunk()
	c, err := New(Config{Source: "s", ChunkRows: 2, ProgressEvery: time.Hour}, src, tgt)
	if err != nil {
		t.Fatal(err)
	}
	reg := &fakeRegistry{states: map[tidemark.TableID]tidemark.TableState{}}
	if _, err := c.RunStreaming(ctx, noIndexes{}, reg, tgt); !errors.Is(err, killed) {
		t.Fatalf("first run: %v, want the apply's failure", err)
	}
	if st := reg.states[tid]; st.Mode != tidemark.TableSnapshotting || st.Cursor == "" {
		t.Fatalf("recorded after the interruption: %+v, want the begin", st)
	}
	*reqs, tgt.apply = nil, nil
	if _, err := c.RunStreaming(ctx, noIndexes{}, reg, tgt); err != nil {
		t.Fatal(err)
	}
	if r := *reqs; len(r) == 0 || r[0].After != nil {
		t.Fatalf("the resumed run read after a cursor written within progress_every of the begin: %+v", *reqs)
	}
}
