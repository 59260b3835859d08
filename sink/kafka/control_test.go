package kafka

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"tidemark"
)

// TestChangeRoundTrip publishes a change of every op through the schema
// control record and the envelope, and decodes it back as an applier does:
// the same table, op, version, commit time and values (DATETIME truncated
// to the envelope's microseconds).
func TestChangeRoundTrip(t *testing.T) {
	tbl, row, c, as := allKindsCodec(t)
	withSince := *tbl
	withSince.Since = tidemark.Version{Seq: 7, Index: 1}     // the version the record was announced before
	withSince.AfterDrop = tidemark.Version{Seq: 5, Index: 2} // the DROP TABLE it was announced after
	if !reflect.DeepEqual(as.table, &withSince) || as.fingerprint != string(c.fingerprint) || as.source != "src" {
		t.Fatalf("schema round trip: %+v / %s, want %+v / %s", as.table, as.fingerprint, tbl, c.fingerprint)
	}
	want := append([]any(nil), row...)
	want[11] = want[11].(time.Time).Truncate(time.Microsecond)
	other := append([]any(nil), row...)
	other[5] = "before"
	for _, op := range []tidemark.Op{tidemark.OpInsert, tidemark.OpUpdate, tidemark.OpDelete, tidemark.OpRead} {
		ch := tidemark.Change{Op: op, Table: tbl, Version: tidemark.Version{Seq: 42, Index: 3},
			CommitTime: time.Date(2026, 11, 29, 10, 5, 0, 0, time.UTC)}
		switch op {
		case tidemark.OpInsert, tidemark.OpRead:
			ch.After = row
		case tidemark.OpUpdate:
			ch.Before, ch.After = other, row
		case tidemark.OpDelete:
			ch.Before = row
		}
		value, err := c.appendEnvelope(nil, &ch, tidemark.Position{GTID: "0-1001-42"}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeChange(value, as.table)
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		if got.Op != op || got.Version != ch.Version || !got.CommitTime.Equal(ch.CommitTime) || got.Table != as.table {
			t.Errorf("%s: decoded %v %v %v", op, got.Op, got.Version, got.CommitTime)
		}
		img := got.After
		if op == tidemark.OpDelete {
			img = got.Before
		}
		if !reflect.DeepEqual(img, want) {
			t.Errorf("%s: row\n got %#v\nwant %#v", op, img, want)
		}
		if op == tidemark.OpUpdate && (len(got.Before) != len(other) || got.Before[5] != "before") {
			t.Errorf("update: before image %#v", got.Before)
		}
	}
	if _, err := decodeChange([]byte(`{"op":"c","before":null,"after":{"id":"x"},"source":{"database":"db","table":"all kinds"}}`), as.table); err == nil {
		t.Error("a row with one column decoded without error")
	}
}

// TestControlRecordsPrecedeRows publishes with ControlRecords: every
// partition of each table's topic starts with the table's schema record,
// announced once per schema (not again with later batches), again after a
// schema change, and again by a new instance (which cannot know what the
// last one announced). A failed batch does not count as announced.
func TestControlRecordsPrecedeRows(t *testing.T) {
	c := newCluster(t)
	cfg := testConfig(t, c, true)
	cfg.ControlRecords = true
	s := openSink(t, cfg)
	st := newStream("src", "shop", 40)
	bs := st.batches(tidemark.Position{}, 5)
	s.hookBeforeCommit = func() error { return errCrash }
	if _, err := s.Apply(context.Background(), bs[0]); !errors.Is(err, errCrash) {
		t.Fatalf("failed batch: %v", err)
	}
	s.hookBeforeCommit = nil
	for _, b := range bs[:4] {
		apply(t, s, b)
	}
	// A schema change of orders: a new column.
	altered := ordersTable("shop")
	altered.Columns = append(altered.Columns, tidemark.Column{Name: "extra", Kind: tidemark.KindInt, Bits: 64, Nullable: true})
	row := []any{int64(99), "t9", tidemark.Decimal("1.00"), nil, epoch, int64(7)}
	apply(t, s, &tidemark.Batch{Source: "src", Changes: []tidemark.Change{
		{Op: tidemark.OpInsert, Table: altered, After: row, Version: tidemark.Version{Seq: 1000, Index: 1}, CommitTime: epoch, Size: 100}}})
	s2 := openSink(t, s.cfg)
	apply(t, s2, bs[4])

	for _, topic := range topicsOf(s.cfg, "shop") {
		recs := consume(t, c, topic)
		first := map[int32]bool{}
		announced := map[string]int{}
		for _, r := range recs {
			_, ctl := header(r, controlHeader)
			if !first[r.Partition] {
				first[r.Partition] = true
				if !ctl {
					t.Fatalf("%s partition %d: first record (offset %d) is not a schema record", topic, r.Partition, r.Offset)
				}
			}
			if ctl {
				as, err := parseSchema(r.Value)
				if err != nil {
					t.Fatal(err)
				}
				announced[as.fingerprint]++
			}
		}
		if len(first) != int(s.cfg.Partitions) {
			t.Fatalf("%s: records on %d partitions, want %d", topic, len(first), s.cfg.Partitions)
		}
		var want map[string]int
		if topic == topicsOf(s.cfg, "shop")[0] {
			// orders: its schema by two instances, the altered one once
			want = map[string]int{string(mustCodec(t, ordersTable("shop")).fingerprint): 8, string(mustCodec(t, altered).fingerprint): 4}
		} else {
			n := 4 // by the first instance; by the second if its batch has items
			for _, ch := range bs[4].Changes {
				if ch.Table.ID.Name == "items" {
					n = 8
					break
				}
			}
			want = map[string]int{string(mustCodec(t, itemsTable("shop")).fingerprint): n}
		}
		if len(announced) != len(want) {
			t.Fatalf("%s: schemas announced %v, want %v", topic, announced, want)
		}
		for k, n := range want {
			if announced[k] != n {
				t.Errorf("%s: schema %s announced %d times, want %d (4 partitions)", topic, k, announced[k], n)
			}
		}
	}
}

func mustCodec(t *testing.T, tbl *tidemark.Table) *codec {
	t.Helper()
	c, err := newCodec(tbl, "src", "x", 0)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestSchemaAnnouncedAgainAfterAnotherLayout: rows of layout A after rows
// of layout B of the same table are preceded by A's schema record again,
// with the version A was first announced with (an applier writes a row
// only with the schema last announced on its partition, and never evolves
// a target table to an older layout).
func TestSchemaAnnouncedAgainAfterAnotherLayout(t *testing.T) {
	c := newCluster(t)
	cfg := testConfig(t, c, true)
	cfg.ControlRecords = true
	s := openSink(t, cfg)
	a := itemsTable("db")
	b := itemsTable("db")
	b.Columns = append(b.Columns, tidemark.Column{Name: "extra", Kind: tidemark.KindText, Nullable: true})
	batch := func(tb *tidemark.Table, seq uint64, row []any) *tidemark.Batch {
		return &tidemark.Batch{Source: "src", Checkpoint: gtid(seq), Changes: []tidemark.Change{
			{Op: tidemark.OpInsert, Table: tb, Version: tidemark.Version{Seq: seq, Index: 1}, After: row}}}
	}
	apply(t, s, batch(a, 1, []any{"k1", int64(1)}))
	apply(t, s, batch(b, 2, []any{"k1", int64(2), "x"}))
	apply(t, s, batch(a, 3, []any{"k1", int64(3)}))
	shown := map[int32]string{} // per partition: the fingerprint last announced
	var since []uint64
	for _, r := range consume(t, c, cfg.TopicPrefix+".db.items") {
		shape, _ := header(r, "table_schema")
		if ctl, _ := header(r, "tm_control"); ctl == "schema" {
			shown[r.Partition] = shape
			as, err := parseSchema(r.Value)
			if err != nil {
				t.Fatal(err)
			}
			if r.Partition == 0 {
				since = append(since, as.table.Since.Seq)
			}
			continue
		}
		if shown[r.Partition] != shape {
			t.Fatalf("partition %d offset %d: a row of schema %s after schema %s was announced", r.Partition, r.Offset, shape, shown[r.Partition])
		}
	}
	if !reflect.DeepEqual(since, []uint64{1, 2, 1}) {
		t.Fatalf("schema records announced before versions %v, want [1 2 1]", since)
	}
}
