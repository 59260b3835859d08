package checkpoint_test

import (
	"context"
	"errors"
	"testing"

	"tidemark"
	"tidemark/checkpoint"
	"tidemark/internal/testenv"
)

// TestStreamOffsets stores an applier's offsets with compare-and-set: the
// first save of a partition inserts, later ones move it from the offset the
// saver read; a save from a stale offset (another member applied the
// partition meanwhile) fails with ErrOffsetMoved and changes nothing.
func TestStreamOffsets(t *testing.T) {
	ctx := context.Background()
	conn := testenv.PGConn(t)
	s, err := checkpoint.New(checkpoint.Config{Schema: testenv.Schema(t)})
	if err != nil {
		t.Fatal(err)
	}
	q := newQuerier(conn)
	if err := s.Init(ctx, q); err != nil {
		t.Fatal(err)
	}
	o := tidemark.StreamOffset{Group: "g", Topic: "t.db.orders", Partition: 3, Next: 10, Schema: `{"x":1}`, Prev: -1}
	if err := s.SaveOffset(ctx, q, o); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveOffset(ctx, q, o); !errors.Is(err, tidemark.ErrOffsetMoved) {
		t.Fatalf("second first save: %v, want ErrOffsetMoved", err)
	}
	o.Prev, o.Next = 10, 25
	if err := s.SaveOffset(ctx, q, o); err != nil {
		t.Fatal(err)
	}
	stale := o
	stale.Prev, stale.Next = 10, 40
	if err := s.SaveOffset(ctx, q, stale); !errors.Is(err, tidemark.ErrOffsetMoved) {
		t.Fatalf("save from a stale offset: %v, want ErrOffsetMoved", err)
	}
	other := tidemark.StreamOffset{Group: "g", Topic: "t.db.orders", Partition: 0, Next: 7, Prev: -1}
	if err := s.SaveOffset(ctx, q, other); err != nil {
		t.Fatal(err)
	}
	got, err := s.LoadOffsets(ctx, q, "g", "t.db.orders")
	if err != nil {
		t.Fatal(err)
	}
	want := []tidemark.StreamOffset{
		{Group: "g", Topic: "t.db.orders", Partition: 0, Next: 7, Prev: 7},
		{Group: "g", Topic: "t.db.orders", Partition: 3, Next: 25, Prev: 25, Schema: `{"x":1}`},
	}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("offsets %+v, want %+v", got, want)
	}
	if got, err := s.LoadOffsets(ctx, q, "other", "t.db.orders"); err != nil || len(got) != 0 {
		t.Fatalf("other group: %+v, %v", got, err)
	}
}
