package fallback

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"tidemark"
)

// fakeSource and fakeTarget are structs of function fields (house style).
type fakeSource struct {
	capture    func() (tidemark.Snapshot, error)
	tables     []tidemark.TableID
	table      *tidemark.Table
	tableOf    func(id tidemark.TableID) (*tidemark.Table, error) // optional: per table
	maxTime    func(col string) (time.Time, bool, error)
	countAbove func(t time.Time) (int64, error)
	read       func(req tidemark.ReadRequest) (tidemark.ReadResult, error)
	keyChunk   func(after []any, limit int) (tidemark.KeyChunk, error)
	keySum     func(after, upTo []any) tidemark.KeySum // optional
	keySumErr  func(after, upTo []any) error           // optional
}

func (f *fakeSource) Capture(ctx context.Context) (tidemark.Snapshot, error) { return f.capture() }
func (f *fakeSource) Tables(ctx context.Context) ([]tidemark.TableID, error) {
	return f.tables, nil
}
func (f *fakeSource) Table(ctx context.Context, id tidemark.TableID) (*tidemark.Table, error) {
	if f.tableOf != nil {
		return f.tableOf(id)
	}
	return f.table, nil
}
func (f *fakeSource) MaxTime(ctx context.Context, id tidemark.TableID, col string) (time.Time, bool, error) {
	return f.maxTime(col)
}
func (f *fakeSource) CountAbove(ctx context.Context, id tidemark.TableID, col string, t time.Time) (int64, error) {
	return f.countAbove(t)
}
func (f *fakeSource) Read(ctx context.Context, req tidemark.ReadRequest) (tidemark.ReadResult, error) {
	return f.read(req)
}
func (f *fakeSource) KeyChunk(ctx context.Context, id tidemark.TableID, after []any, limit int) (tidemark.KeyChunk, error) {
	if f.keyChunk == nil {
		return tidemark.KeyChunk{}, nil // no keys
	}
	return f.keyChunk(after, limit)
}
func (f *fakeSource) KeyRangeSum(ctx context.Context, id tidemark.TableID, after, upTo []any) (tidemark.KeySum, error) {
	if f.keySumErr != nil {
		if err := f.keySumErr(after, upTo); err != nil {
			return tidemark.KeySum{}, err
		}
	}
	if f.keySum == nil {
		return tidemark.KeySum{}, nil
	}
	return f.keySum(after, upTo), nil
}

type fakeTarget struct {
	batches   []tidemark.Batch
	apply     func(b *tidemark.Batch) error // optional
	watermark func() (time.Time, bool, error)
	keySum    func(after, upTo []any) tidemark.KeySum
	keys      func(after, upTo []any) [][]any
	// firstRun: no checkpoint stored yet (a first-run snapshot).
	firstRun bool
}

func (f *fakeTarget) Apply(ctx context.Context, b *tidemark.Batch) (tidemark.ApplyStats, error) {
	if f.apply != nil {
		if err := f.apply(b); err != nil {
			return tidemark.ApplyStats{}, err
		}
	}
	f.batches = append(f.batches, *b)
	var s tidemark.ApplyStats
	for _, c := range b.Changes {
		if c.Op == tidemark.OpDelete {
			s.Deleted++
		} else {
			s.Inserted++
		}
	}
	return s, nil
}
func (f *fakeTarget) Checkpoint(ctx context.Context, source string) (tidemark.Position, bool, error) {
	if f.firstRun {
		return tidemark.Position{}, false, nil
	}
	return tidemark.Position{GTID: "0-1-1"}, true, nil
}
func (f *fakeTarget) Close() error { return nil }
func (f *fakeTarget) Watermark(ctx context.Context, source string, t tidemark.TableID) (time.Time, bool, error) {
	return f.watermark()
}
func (f *fakeTarget) KeyRangeSum(ctx context.Context, t *tidemark.Table, after, upTo []any) (tidemark.KeySum, error) {
	if f.keySum == nil {
		return tidemark.KeySum{}, nil // no keys
	}
	return f.keySum(after, upTo), nil
}
func (f *fakeTarget) KeysInRange(ctx context.Context, t *tidemark.Table, after, upTo []any) ([][]any, error) {
	if f.keys == nil {
		return nil, nil
	}
	return f.keys(after, upTo), nil
}

var (
	tid   = tidemark.TableID{Database: "shop", Name: "orders"}
	table = &tidemark.Table{ID: tid, Columns: []tidemark.Column{{Name: "id", Kind: tidemark.KindInt}, {Name: "updated_at", Kind: tidemark.KindDateTime}}, Key: []int{0}}
	now   = time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	snap  = tidemark.Snapshot{Position: tidemark.Position{GTID: "0-1-100"}, Version: tidemark.Version{Seq: 100}, ServerTime: now}
)

func rows(ids ...int64) []tidemark.Change {
	out := make([]tidemark.Change, len(ids))
	for i, id := range ids {
		out[i] = tidemark.Change{Op: tidemark.OpRead, Table: table, After: []any{id, now}, Version: snap.Version}
	}
	return out
}

func newCatchUp(t *testing.T, src *fakeSource, tgt *fakeTarget, tc TableConfig) *CatchUp {
	t.Helper()
	c, err := New(Config{Source: "s", ChunkRows: 2, Tables: map[string]TableConfig{"shop.orders": tc}}, src, tgt)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestWindowBoundsAndWatermarkCommit(t *testing.T) {
	w := now.Add(-time.Hour)
	var reqs []tidemark.ReadRequest
	src := &fakeSource{
		capture: func() (tidemark.Snapshot, error) { return snap, nil },
		tables:  []tidemark.TableID{tid}, table: table,
		maxTime: func(string) (time.Time, bool, error) { return now.Add(-time.Minute), true, nil },
		read: func(req tidemark.ReadRequest) (tidemark.ReadResult, error) {
			if req.Undated {
				return tidemark.ReadResult{}, nil
			}
			reqs = append(reqs, req)
			if req.After == nil {
				return tidemark.ReadResult{Changes: rows(1, 2), Next: []any{now, int64(2)}}, nil
			}
			return tidemark.ReadResult{Changes: rows(3)}, nil
		},
	}
	tgt := &fakeTarget{watermark: func() (time.Time, bool, error) { return w, true, nil }}
	c := newCatchUp(t, src, tgt, TableConfig{Column: "updated_at", Lookback: 15 * time.Minute})
	pos, err := c.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if pos != snap.Position {
		t.Fatalf("resume position %v", pos)
	}
	if len(reqs) != 2 || !reqs[0].Lower.Equal(w.Add(-15*time.Minute)) || !reqs[0].Upper.Equal(now.Add(-time.Minute)) || reqs[0].Column != "updated_at" {
		t.Fatalf("requests %+v", reqs)
	}
	if reqs[1].After == nil || reqs[0].Snapshot != snap {
		t.Fatal("cursor or snapshot not passed on")
	}
	// Batch 1: rows 1-2, no watermark. Batch 2: row 3 with the watermark.
	// Batch 3: the checkpoint alone, after every table.
	if len(tgt.batches) != 3 {
		t.Fatalf("%d batches", len(tgt.batches))
	}
	if len(tgt.batches[0].Watermarks) != 0 || !tgt.batches[0].Checkpoint.IsZero() {
		t.Fatal("watermark or checkpoint stored before the window's last chunk")
	}
	if wm := tgt.batches[1].Watermarks; len(wm) != 1 || !wm[0].Value.Equal(now.Add(-time.Minute)) {
		t.Fatalf("last chunk watermarks %v", wm)
	}
	if b := tgt.batches[2]; b.Checkpoint != snap.Position || len(b.Changes) != 0 {
		t.Fatalf("final batch %+v", b)
	}
}

func TestFarFutureIsClamped(t *testing.T) {
	future := time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)
	var upper time.Time
	src := &fakeSource{
		capture: func() (tidemark.Snapshot, error) { return snap, nil },
		tables:  []tidemark.TableID{tid}, table: table,
		maxTime:    func(string) (time.Time, bool, error) { return future, true, nil },
		countAbove: func(t time.Time) (int64, error) { return 3, nil },
		read: func(req tidemark.ReadRequest) (tidemark.ReadResult, error) {
			if req.Undated {
				return tidemark.ReadResult{}, nil
			}
			upper = req.Upper
			return tidemark.ReadResult{Changes: rows(1)}, nil
		},
	}
	tgt := &fakeTarget{watermark: func() (time.Time, bool, error) { return now.Add(-time.Hour), true, nil }}
	c := newCatchUp(t, src, tgt, TableConfig{Column: "updated_at"})
	rep, err := c.RunReport(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	limit := now.Add(5 * time.Minute)
	if !upper.Equal(limit) || rep.Tables[0].BeyondUpper != 3 {
		t.Fatalf("upper %v (want %v), beyond %d", upper, limit, rep.Tables[0].BeyondUpper)
	}
	if wm := tgt.batches[0].Watermarks; len(wm) != 1 || !wm[0].Value.Equal(limit) {
		t.Fatalf("watermark %v dragged past the clamp", wm)
	}
}

// TestEmptyTableStoresNothing: MAX(column) finds no value. The table is
// still read in full (its rows may all have a NULL column), and an empty one
// stores nothing.
func TestEmptyTableStoresNothing(t *testing.T) {
	var reads []tidemark.ReadRequest
	src := &fakeSource{
		capture: func() (tidemark.Snapshot, error) { return snap, nil },
		tables:  []tidemark.TableID{tid}, table: table,
		maxTime: func(string) (time.Time, bool, error) { return time.Time{}, false, nil },
		read: func(req tidemark.ReadRequest) (tidemark.ReadResult, error) {
			reads = append(reads, req)
			return tidemark.ReadResult{}, nil
		},
	}
	tgt := &fakeTarget{watermark: func() (time.Time, bool, error) { return time.Time{}, false, nil }}
	c := newCatchUp(t, src, tgt, TableConfig{Column: "updated_at"})
	rep, err := c.RunReport(context.Background(), []tidemark.TableID{tid})
	if err != nil {
		t.Fatal(err)
	}
	if len(reads) != 1 || reads[0].Column != "" || rep.Tables[0].Mode != "empty" {
		t.Fatalf("reads %+v, mode %s; want one full read, mode empty", reads, rep.Tables[0].Mode)
	}
	if len(tgt.batches) != 0 {
		t.Fatalf("an empty table stored %d batches", len(tgt.batches))
	}
}

func TestFirstSightIsAFullSnapshot(t *testing.T) {
	var req0 tidemark.ReadRequest
	src := &fakeSource{
		capture: func() (tidemark.Snapshot, error) { return snap, nil },
		tables:  []tidemark.TableID{tid}, table: table,
		maxTime: func(string) (time.Time, bool, error) { return now, true, nil },
		read: func(req tidemark.ReadRequest) (tidemark.ReadResult, error) {
			req0 = req
			return tidemark.ReadResult{Changes: rows(1)}, nil
		},
	}
	tgt := &fakeTarget{watermark: func() (time.Time, bool, error) { return time.Time{}, false, nil }}
	rep, err := newCatchUp(t, src, tgt, TableConfig{Column: "updated_at"}).RunReport(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if req0.Column != "" || rep.Tables[0].Mode != "snapshot" {
		t.Fatalf("first sight read %+v, mode %s", req0, rep.Tables[0].Mode)
	}
	if wm := tgt.batches[0].Watermarks; len(wm) != 1 || !wm[0].Value.Equal(now) {
		t.Fatalf("snapshot did not store the bound captured before reading: %v", wm)
	}
}

func TestKeyDiffDeletesOnlyExtraKeys(t *testing.T) {
	src := &fakeSource{
		capture: func() (tidemark.Snapshot, error) { return snap, nil },
		tables:  []tidemark.TableID{tid}, table: table,
		read: func(req tidemark.ReadRequest) (tidemark.ReadResult, error) {
			return tidemark.ReadResult{}, nil
		},
		keyChunk: func(after []any, limit int) (tidemark.KeyChunk, error) {
			if after == nil {
				return tidemark.KeyChunk{Keys: [][]any{{int64(1)}, {int64(2)}}, Last: []any{int64(2)}, Sum: tidemark.KeySum{Count: 2, Sum: "a"}}, nil
			}
			return tidemark.KeyChunk{Keys: [][]any{{int64(5)}}, Sum: tidemark.KeySum{Count: 1, Sum: "b"}}, nil
		},
	}
	tgt := &fakeTarget{
		watermark: func() (time.Time, bool, error) { return time.Time{}, false, nil },
		keySum: func(after, upTo []any) tidemark.KeySum {
			if after == nil {
				return tidemark.KeySum{Count: 2, Sum: "a"} // equal: not listed
			}
			return tidemark.KeySum{Count: 3, Sum: "c"}
		},
		keys: func(after, upTo []any) [][]any {
			if after == nil {
				t.Error("a matching chunk was listed")
			}
			if upTo != nil {
				t.Error("the last chunk must run to the end of the target")
			}
			return [][]any{{"3"}, {"5"}, {"9"}}
		},
	}
	rep, err := newCatchUp(t, src, tgt, TableConfig{DeleteDetection: DeletesKeyDiff}).RunReport(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Tables[0].Deletes != 2 || !rep.Tables[0].DeletesChecked {
		t.Fatalf("deletes %d", rep.Tables[0].Deletes)
	}
	var got []string
	for _, b := range tgt.batches {
		for _, c := range b.Changes {
			if c.Op == tidemark.OpDelete {
				got = append(got, keyString(c.Before[:1]))
				if c.Before[0] != int64(3) && c.Before[0] != int64(9) {
					t.Fatalf("delete key typed %T", c.Before[0])
				}
				if c.Version != snap.Version {
					t.Fatal("delete not stamped with the snapshot version")
				}
			}
		}
	}
	if strings.Join(got, ",") != "3,9" {
		t.Fatalf("deleted %v, want 3,9", got)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "source"},
		{Config{Source: "s", Lookback: -1}, "lookback"},
		{Config{Source: "s", Tables: map[string]TableConfig{"orders": {}}}, "tables"},
		{Config{Source: "s", Tables: map[string]TableConfig{"a.b": {DeleteDetection: "magic"}}}, "delete_detection"},
		{Config{Source: "s", Tables: map[string]TableConfig{"a.b": {Column: "x`; DROP"}}}, "column"},
	} {
		if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err %v, want it to name %q", tc.cfg, err, tc.want)
		}
	}
}

func TestKeyDiffNeedsAKeyTarget(t *testing.T) {
	type sinkOnly struct{ Target }
	_, err := New(Config{Source: "s", Tables: map[string]TableConfig{"a.b": {DeleteDetection: DeletesKeyDiff}}}, &fakeSource{}, sinkOnly{&fakeTarget{}})
	if err == nil || !strings.Contains(err.Error(), "delete_detection") {
		t.Fatalf("err = %v", err)
	}
}

// The next chunk is read while the previous one applies: the first apply
// waits for the second read, which a read-then-apply loop never starts.
func TestReadAheadOverlapsApply(t *testing.T) {
	secondRead := make(chan struct{})
	src := &fakeSource{
		capture: func() (tidemark.Snapshot, error) { return snap, nil },
		tables:  []tidemark.TableID{tid}, table: table,
		maxTime: func(string) (time.Time, bool, error) { return now, true, nil },
		read: func(req tidemark.ReadRequest) (tidemark.ReadResult, error) {
			switch {
			case req.After == nil:
				return tidemark.ReadResult{Changes: rows(1, 2), Next: []any{int64(2)}}, nil
			case req.After[0] == int64(2):
				close(secondRead)
				return tidemark.ReadResult{Changes: rows(3, 4), Next: []any{int64(4)}}, nil
			default:
				return tidemark.ReadResult{Changes: rows(5)}, nil
			}
		},
	}
	tgt := &fakeTarget{watermark: func() (time.Time, bool, error) { return time.Time{}, false, nil }}
	tgt.apply = func(b *tidemark.Batch) error {
		if len(tgt.batches) == 0 {
			select {
			case <-secondRead:
			case <-time.After(10 * time.Second):
				return errors.New("chunk 2 was not read while chunk 1 was applied")
			}
		}
		return nil
	}
	rep, err := newCatchUp(t, src, tgt, TableConfig{Column: "updated_at"}).RunReport(context.Background(), []tidemark.TableID{tid})
	if err != nil {
		t.Fatal(err)
	}
	if tr := rep.Tables[0]; tr.Rows != 5 || tr.Chunks != 3 || tr.Mode != "snapshot" {
		t.Fatalf("report %+v", tr)
	}
	var ids []int64
	for i, b := range tgt.batches {
		for _, c := range b.Changes {
			ids = append(ids, c.After[0].(int64))
		}
		if last := i == len(tgt.batches)-1; last != (len(b.Watermarks) == 1) {
			t.Fatalf("batch %d of %d has %d watermarks: the watermark commits with the last chunk only", i+1, len(tgt.batches), len(b.Watermarks))
		}
	}
	if fmt.Sprint(ids) != "[1 2 3 4 5]" {
		t.Fatalf("applied %v, want the chunks in order", ids)
	}
}

// A failed apply stops the reads: nothing is read after RunReport returns,
// and at most ReadAhead chunks were read past the failed one.
func TestReadAheadStopsOnApplyError(t *testing.T) {
	var reads, afterReturn atomic.Int64
	var returned atomic.Bool
	src := &fakeSource{
		capture: func() (tidemark.Snapshot, error) { return snap, nil },
		tables:  []tidemark.TableID{tid}, table: table,
		maxTime: func(string) (time.Time, bool, error) { return now, true, nil },
		read: func(req tidemark.ReadRequest) (tidemark.ReadResult, error) {
			n := reads.Add(1)
			if returned.Load() {
				afterReturn.Add(1)
			}
			return tidemark.ReadResult{Changes: rows(n), Next: []any{n}}, nil // never ends
		},
	}
	boom := errors.New("target refused")
	tgt := &fakeTarget{watermark: func() (time.Time, bool, error) { return time.Time{}, false, nil },
		apply: func(*tidemark.Batch) error { return boom }}
	c := newCatchUp(t, src, tgt, TableConfig{Column: "updated_at"})
	_, err := c.RunReport(context.Background(), []tidemark.TableID{tid})
	returned.Store(true)
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the apply's", err)
	}
	time.Sleep(50 * time.Millisecond)
	if n := afterReturn.Load(); n != 0 {
		t.Fatalf("%d reads after RunReport returned: the reader was not stopped", n)
	}
	if n := reads.Load(); n > int64(1+c.cfg.ReadAhead) {
		t.Fatalf("%d chunks read for one failed apply, want at most 1 + ReadAhead (%d)", n, c.cfg.ReadAhead)
	}
}

// TestFirstRunAfterAnInterruptedSnapshot: no checkpoint, but the target
// holds rows and a watermark of a first snapshot that was killed. The run
// reads the table in full (the watermark is not trusted) and removes the
// target rows the read did not carry (a key diff, with delete_detection
// unset): the table ends as an uninterrupted first snapshot would.
// recordingSource is a source of table whose watermark column's newest
// value is a minute old and whose every read returns rows 1 and 2; the
// read requests go to reqs.
func recordingSource(reqs *[]tidemark.ReadRequest) *fakeSource {
	return &fakeSource{
		capture: func() (tidemark.Snapshot, error) { return snap, nil },
		tables:  []tidemark.TableID{tid}, table: table,
		maxTime: func(string) (time.Time, bool, error) { return now.Add(-time.Minute), true, nil },
		read: func(req tidemark.ReadRequest) (tidemark.ReadResult, error) {
			*reqs = append(*reqs, req)
			return tidemark.ReadResult{Changes: rows(1, 2)}, nil
		},
	}
}

func TestFirstRunAfterAnInterruptedSnapshot(t *testing.T) {
	var reqs []tidemark.ReadRequest
	src := recordingSource(&reqs)
	src.keyChunk = func(after []any, limit int) (tidemark.KeyChunk, error) {
		return tidemark.KeyChunk{Keys: [][]any{{int64(1)}, {int64(2)}}, Sum: tidemark.KeySum{Count: 2, Sum: "a"}}, nil
	}
	tgt := &fakeTarget{
		firstRun:  true,
		watermark: func() (time.Time, bool, error) { return now.Add(-time.Hour), true, nil },
		keySum:    func(after, upTo []any) tidemark.KeySum { return tidemark.KeySum{Count: 3, Sum: "b"} },
		keys:      func(after, upTo []any) [][]any { return [][]any{{"1"}, {"2"}, {"3"}} },
	}
	rep, err := newCatchUp(t, src, tgt, TableConfig{Column: "updated_at"}).RunReport(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	tr := rep.Tables[0]
	if tr.Mode != "snapshot" || len(reqs) != 1 || !reqs[0].Lower.IsZero() {
		t.Fatalf("want a full first snapshot despite the watermark: mode %s, requests %+v", tr.Mode, reqs)
	}
	if tr.Deletes != 1 || !tr.DeletesChecked {
		t.Fatalf("want the stale key 3 removed by a key diff: %+v", tr)
	}
	// With a checkpoint the same target is a window catch-up.
	tgt.firstRun, reqs = false, nil
	rep, err = newCatchUp(t, src, tgt, TableConfig{Column: "updated_at"}).RunReport(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Tables[0].Mode != "window" {
		t.Fatalf("with a checkpoint: mode %s", rep.Tables[0].Mode)
	}
}

// boundaries records the snapshot boundaries a catch-up writes.
type boundaries struct{ begun, ended int }

func (b *boundaries) BeginSnapshot(ctx context.Context, source string, table tidemark.TableID, reason string) error {
	b.begun++
	return nil
}
func (b *boundaries) EndSnapshot(ctx context.Context, source string, table tidemark.TableID, v tidemark.Version) error {
	b.ended++
	return nil
}

// TestResyncInsideCallersBoundaries: a resync (RunReport with tables) into
// a target that lists no keys but takes snapshot boundaries (the scale-out
// tailer) is enclosed by its caller (tidemark.Resnapshot): the table, whose
// watermark is stored, is read in full (a window would not carry every
// row), writes no boundaries of its own, and the caller's snapshot_end
// removes the rows the read did not carry. Nemesis seed 294 quarantined it
// after f8a0fb2 ("the target lists no keys to diff and takes no snapshot
// boundaries"). Without boundaries at all (Kafka alone without control
// records) the deletes cannot be found, and the run says so.
func TestResyncInsideCallersBoundaries(t *testing.T) {
	var reqs []tidemark.ReadRequest
	src := recordingSource(&reqs)
	// The target lists no keys (the scale-out tailer's).
	tgt := struct{ Target }{&fakeTarget{watermark: func() (time.Time, bool, error) { return now.Add(-time.Hour), true, nil }}}
	b := &boundaries{}
	cfg := Config{Source: "s", ChunkRows: 2, Tables: map[string]TableConfig{"shop.orders": {Column: "updated_at"}}, Boundaries: b}
	c, err := New(cfg, src, tgt)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := c.RunReport(context.Background(), []tidemark.TableID{tid})
	if err != nil {
		t.Fatalf("a resync inside its caller's boundaries: %v", err)
	}
	if tr := rep.Tables[0]; tr.Mode != "snapshot" || len(reqs) != 1 || !reqs[0].Lower.IsZero() {
		t.Fatalf("want a full read of the resynced table: mode %s, requests %+v", tr.Mode, reqs)
	}
	if b.begun != 0 || b.ended != 0 {
		t.Fatalf("the resync's caller encloses it: the catch-up wrote %d begin and %d end boundaries", b.begun, b.ended)
	}
	cfg.Boundaries = nil
	if c, err = New(cfg, src, tgt); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunReport(context.Background(), []tidemark.TableID{tid}); err == nil || !strings.Contains(err.Error(), "cannot be found") {
		t.Fatalf("without boundaries or keys: err %v, want the deletes 'cannot be found'", err)
	}
}

// keySet is a set of integer keys with the checksums both sides compute
// (count and the sum of a 60-bit hash of each key's text).
type keySet []int64

func (ks keySet) in(after, upTo []any) keySet {
	var out keySet
	for _, k := range ks {
		if (after == nil || k > after[0].(int64)) && (upTo == nil || k <= upTo[0].(int64)) {
			out = append(out, k)
		}
	}
	return out
}

func (ks keySet) sum() tidemark.KeySum {
	var total uint64 // 64 keys of 60 bits cannot overflow it
	for _, k := range ks {
		h := sha256.Sum256([]byte(strconv.FormatInt(k, 10)))
		total += binary.BigEndian.Uint64(h[:8]) >> 4
	}
	return tidemark.KeySum{Count: int64(len(ks)), Sum: strconv.FormatUint(total, 10)}
}

// TestKeyDiffFindsADeleteHiddenByEqualCounts: the target holds key 7,
// deleted on the source, and lacks key 21, which the source holds (a row
// the window did not read): the whole table and the chunk of both have the
// same count on either side. Only the extra key is deleted. With equal key
// sets, neither side lists a key (the whole-table sums match).
func TestKeyDiffFindsADeleteHiddenByEqualCounts(t *testing.T) {
	var all keySet
	for k := int64(1); k <= 20; k++ {
		all = append(all, k)
	}
	for _, tc := range []struct {
		name     string
		src, tgt keySet
		want     string
		sumFails bool // the source's whole-table KeyRangeSum fails
	}{
		{"delete hidden by a missing key", append(append(keySet{}, all[:6]...), append(all[7:], 21)...), all, "7", false},
		{"equal keys", all, all, "", false},
		// One statement over a very big table outlasts query_timeout:
		// the chunk pass still finds the delete.
		{"whole-table checksum fails", append(append(keySet{}, all[:6]...), all[7:]...), all, "7", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			listed := 0
			src := &fakeSource{
				capture: func() (tidemark.Snapshot, error) { return snap, nil },
				tables:  []tidemark.TableID{tid}, table: table,
				read: func(req tidemark.ReadRequest) (tidemark.ReadResult, error) {
					return tidemark.ReadResult{}, nil
				},
				keyChunk: func(after []any, limit int) (tidemark.KeyChunk, error) {
					listed++
					ks := tc.src.in(after, nil)
					var kc tidemark.KeyChunk
					if len(ks) > limit {
						ks = ks[:limit]
						kc.Last = []any{ks[limit-1]}
					}
					for _, k := range ks {
						kc.Keys = append(kc.Keys, []any{k})
					}
					kc.Sum = ks.sum()
					return kc, nil
				},
				keySum: func(after, upTo []any) tidemark.KeySum { return tc.src.in(after, upTo).sum() },
				keySumErr: func(after, upTo []any) error {
					if tc.sumFails && after == nil && upTo == nil {
						return errors.New("no answer within query_timeout")
					}
					return nil
				},
			}
			tgt := &fakeTarget{
				watermark: func() (time.Time, bool, error) { return time.Time{}, false, nil },
				keySum:    func(after, upTo []any) tidemark.KeySum { return tc.tgt.in(after, upTo).sum() },
				keys: func(after, upTo []any) [][]any {
					listed++
					var out [][]any
					for _, k := range tc.tgt.in(after, upTo) {
						out = append(out, []any{strconv.FormatInt(k, 10)})
					}
					return out
				},
			}
			cu, err := New(Config{Source: "s", KeyChunkRows: 10, Tables: map[string]TableConfig{tid.String(): {DeleteDetection: DeletesKeyDiff}}}, src, tgt)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cu.RunReport(context.Background(), nil); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, b := range tgt.batches {
				for _, c := range b.Changes {
					if c.Op == tidemark.OpDelete {
						got = append(got, keyString(c.Before[:1]))
					}
				}
			}
			if strings.Join(got, ",") != tc.want {
				t.Fatalf("deleted %v, want %q", got, tc.want)
			}
			if tc.want == "" && listed != 0 {
				t.Fatalf("equal key sets: %d key listings, want none", listed)
			}
		})
	}
}
