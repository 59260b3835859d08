package tidemark

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestCursorRoundTrip: a chunk cursor of every type a source's Read
// returns comes back with its type and value; other types are an error
// naming the value's position.
func TestCursorRoundTrip(t *testing.T) {
	at := time.Date(2026, 12, 2, 1, 2, 3, 456789000, time.UTC)
	in := []any{int64(-9223372036854775808), uint64(18446744073709551615), 1.5e300, "a:b\"c\x00é", at}
	enc, err := EncodeCursor(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeCursor(enc)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(out, in) {
		t.Fatalf("decoded %#v, want %#v", out, in)
	}
	if out, err := DecodeCursor(""); err != nil || out != nil {
		t.Fatalf("empty cursor: %v, %v", out, err)
	}
	if _, err := EncodeCursor([]any{int64(1), struct{}{}}); err == nil || !strings.Contains(err.Error(), "value 1") {
		t.Fatalf("unknown type: %v", err)
	}
	if _, err := DecodeCursor(`["x:1"]`); err == nil || !strings.Contains(err.Error(), "value 0") {
		t.Fatalf("unknown tag: %v", err)
	}
}

// TestTableSetApplying: the changes and DDL of a snapshotting table whose
// snapshot runs beside the stream are applied (whatever the floor) until
// it is no longer marked; other snapshotting tables' are skipped.
func TestTableSetApplying(t *testing.T) {
	a, b := &Table{ID: TableID{Database: "d", Name: "a"}}, &Table{ID: TableID{Database: "d", Name: "b"}}
	var s tableSet
	s.put(TableState{Table: a.ID, Mode: TableSnapshotting, Floor: Version{Seq: 9}})
	s.put(TableState{Table: b.ID, Mode: TableSnapshotting})
	s.setApplying(a.ID, true)
	batch := &Batch{Changes: []Change{{Table: a, Version: Version{Seq: 1}}, {Table: b, Version: Version{Seq: 2}}}}
	s.filter(batch)
	if len(batch.Changes) != 1 || batch.Changes[0].Table != a {
		t.Fatalf("kept %+v, want a's change only", batch.Changes)
	}
	if known, skip := s.skips(a.ID, Version{Seq: 1}); !known || skip {
		t.Fatalf("a: known %v skip %v, want known and applied", known, skip)
	}
	s.setApplying(a.ID, false)
	if _, skip := s.skips(a.ID, Version{Seq: 1}); !skip {
		t.Fatal("a's changes applied after it is no longer marked")
	}
	if known, _ := s.skips(TableID{Database: "d", Name: "c"}, Version{}); known {
		t.Fatal("an unknown table is known")
	}
}
