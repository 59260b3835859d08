package fallback

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"tidemark"
)

// lockedTarget is a fakeTarget safe for the concurrent Apply calls of a
// catch-up with several readers.
type lockedTarget struct {
	mu sync.Mutex
	*fakeTarget
}

func (l *lockedTarget) Apply(ctx context.Context, b *tidemark.Batch) (tidemark.ApplyStats, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fakeTarget.Apply(ctx, b)
}

// atOnceFixture is a first run of the tables named (db "shop"), none
// with a watermark column, with readers readers; read answers each
// chunk request.
func atOnceFixture(t *testing.T, names []string, readers int, read func(req tidemark.ReadRequest) (tidemark.ReadResult, error)) (*CatchUp, *lockedTarget) {
	t.Helper()
	var ids []tidemark.TableID
	for _, n := range names {
		ids = append(ids, tidemark.TableID{Database: "shop", Name: n})
	}
	newSrc := func() *fakeSource {
		return &fakeSource{
			capture: func() (tidemark.Snapshot, error) { return snap, nil },
			tables:  ids,
			tableOf: func(id tidemark.TableID) (*tidemark.Table, error) {
				if id.Name == "nokey" {
					return nil, &tidemark.TableError{Table: id, Err: errors.New("no primary key and no business_keys")}
				}
				return &tidemark.Table{ID: id, Columns: table.Columns, Key: []int{0}}, nil
			},
			read: read,
		}
	}
	tgt := &lockedTarget{fakeTarget: &fakeTarget{firstRun: true, watermark: func() (time.Time, bool, error) { return time.Time{}, false, nil }}}
	c, err := New(Config{Source: "s", ChunkRows: 2}, newSrc(), tgt)
	if err != nil {
		t.Fatal(err)
	}
	var extra []tidemark.SnapshotSource
	for range readers - 1 {
		extra = append(extra, newSrc())
	}
	c.SetReaders(extra)
	return c, tgt
}

// TestFirstRunReadsTablesAtOnce (issue 25 §2, tables in parallel at a
// first run): with two readers, the first run reads table a and table b
// at the same time: a's first chunk is answered only once b's has been
// asked for, and b's only once a's has. One table at a time (before)
// waits for the other table forever, which the test turns into the run's
// error after a minute: "a was read alone".
func TestFirstRunReadsTablesAtOnce(t *testing.T) {
	asked := map[string]chan struct{}{"a": make(chan struct{}), "b": make(chan struct{})}
	var once sync.Map
	c, tgt := atOnceFixture(t, []string{"a", "b"}, 2, func(req tidemark.ReadRequest) (tidemark.ReadResult, error) {
		name := req.Table.Name
		if _, loaded := once.LoadOrStore(name, true); !loaded {
			close(asked[name])
		}
		other := map[string]string{"a": "b", "b": "a"}[name]
		select {
		case <-asked[other]:
		case <-time.After(time.Minute):
			return tidemark.ReadResult{}, fmt.Errorf("%s was read alone: no chunk of %s was asked for while it was read", name, other)
		}
		return tidemark.ReadResult{Changes: rows(1)}, nil
	})
	full, err := c.RunReport(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(full.Tables) != 2 || full.Tables[0].Table.Name != "a" || full.Tables[1].Table.Name != "b" || full.Tables[0].Rows != 1 || full.Tables[1].Rows != 1 {
		t.Fatalf("report %+v, want a then b with a row each", full.Tables)
	}
	last := tgt.batches[len(tgt.batches)-1]
	if last.Checkpoint != snap.Position || len(last.Changes) != 0 {
		t.Fatalf("last batch %+v, want the checkpoint alone, after every table", last)
	}
}

// TestTablesAtOnceQuarantineGoesOn: a table the run cannot follow (no
// key) among tables read at once is quarantined, and every other table
// is read to its end; a failure that is not one table's stops the run
// naming its table.
func TestTablesAtOnceQuarantineGoesOn(t *testing.T) {
	var mu sync.Mutex
	read := map[string]int{}
	c, tgt := atOnceFixture(t, []string{"a", "b", "c", "d", "nokey"}, 3, func(req tidemark.ReadRequest) (tidemark.ReadResult, error) {
		mu.Lock()
		defer mu.Unlock()
		read[req.Table.Name]++
		if read[req.Table.Name] < 3 {
			return tidemark.ReadResult{Changes: rows(1, 2), Next: []any{int64(2)}}, nil
		}
		return tidemark.ReadResult{Changes: rows(3)}, nil
	})
	reg := &fakeRegistry{states: map[tidemark.TableID]tidemark.TableState{}}
	rep, err := c.RunStreaming(context.Background(), noIndexes{}, reg, tgt)
	if err != nil {
		t.Fatal(err)
	}
	nokey := tidemark.TableID{Database: "shop", Name: "nokey"}
	if st := reg.states[nokey]; st.Mode != tidemark.TableQuarantined || !strings.Contains(st.Reason, "no primary key") {
		t.Fatalf("nokey: state %+v, want quarantined naming why", st)
	}
	var names []string
	for _, tr := range rep.Tables {
		names = append(names, tr.Table.Name)
		if tr.Rows != 5 {
			t.Errorf("%s: %d rows read, want 5 (three chunks)", tr.Table, tr.Rows)
		}
	}
	if strings.Join(names, " ") != "a b c d" {
		t.Fatalf("report tables %v, want a b c d in order", names)
	}

	boom := errors.New("connection refused")
	c, _ = atOnceFixture(t, []string{"a", "b", "c"}, 2, func(req tidemark.ReadRequest) (tidemark.ReadResult, error) {
		if req.Table.Name == "b" {
			return tidemark.ReadResult{}, boom
		}
		return tidemark.ReadResult{Changes: rows(1)}, nil
	})
	if _, err := c.Run(context.Background()); !errors.Is(err, boom) || !strings.Contains(err.Error(), "shop.b") {
		t.Fatalf("run: %v, want the read error naming shop.b", err)
	}
}
