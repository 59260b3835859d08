package postgres

import (
	"context"
	"errors"
	"strings"
	"testing"

	"tidemark"
)

// TestJSONUnknownColumns (nemesis seed 574095280397): a layout whose text
// column the source could not tell from JSON (tidemark.Column.JSONUnknown)
// is JSON when the target table has the column as JSON, text otherwise;
// the resolved layout is the one a source that knew would have announced
// (one definition), the batch given to Apply is left as it was (a fan-out
// gives it to another sink too), and a value that is not JSON is an error
// naming table and column.
func TestJSONUnknownColumns(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	id := tidemark.Column{Name: "id", Kind: tidemark.KindInt, Bits: 64}
	j := tidemark.Column{Name: "j", Kind: tidemark.KindJSON, Nullable: true}
	unknown := tidemark.Column{Name: "j", Kind: tidemark.KindText, Nullable: true, JSONUnknown: true}
	n := tidemark.Column{Name: "n", Kind: tidemark.KindInt, Bits: 32, Nullable: true}
	x := tidemark.Column{Name: "x", Kind: tidemark.KindInt, Bits: 32, Nullable: true}

	e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{
		ins(evoTable("ju", id, j, n), v(1, 1), int64(1), tidemark.JSON(`{"a": 1}`), int64(1)),
	}})
	// A newer layout (x added) as a tailer started after the source
	// renamed j announces it: j is JSON-unknown.
	older := evoTable("ju", id, unknown, n, x)
	b := &tidemark.Batch{Source: "s", Changes: []tidemark.Change{
		ins(older, v(2, 1), int64(2), `{"b": [1, 2]}`, int64(2), int64(2)),
		upd(older, v(2, 2), row(int64(1), `{"a": 1}`, int64(1), nil), row(int64(1), `{"a": 10}`, int64(1), nil)),
		ins(older, v(2, 3), int64(3), nil, nil, nil),
	}}
	if err := e.sink.EnsureTable(ctx, older); err != nil {
		t.Fatalf("EnsureTable: %v", err)
	}
	e.apply(b)
	if got := strings.Join(e.columnTypes("ju"), ", "); got != "id bigint, j jsonb, n integer, x integer" {
		t.Fatalf("columns %s", got)
	}
	if got := strings.Join(e.rows(`SELECT id, j::text FROM `+e.table("ju")+` ORDER BY id`), ","); got != `1|{"a": 10},2|{"b": [1, 2]},3|∅` {
		t.Errorf("rows %s", got)
	}
	if c, ok := e.alignment("ju").column("j"); !ok || c.Kind != tidemark.KindJSON {
		t.Errorf("alignment of j: %+v", c)
	}
	if b.Changes[0].Table != older || b.Changes[0].After[1] != `{"b": [1, 2]}` {
		t.Errorf("the batch given to Apply was changed: %+v", b.Changes[0])
	}
	// The layout as a tailer that knew j would have announced it: the
	// same definition as the resolved one.
	known := evoTable("ju", id, j, n, x)
	e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{
		ins(known, v(3, 1), int64(4), tidemark.JSON(`[]`), nil, nil),
	}})
	defs := 0
	for k := range e.sink.defs {
		if k.id == known.ID {
			defs++
		}
	}
	if defs != 2 { // (id, j, n) and (id, j, n, x)
		t.Errorf("%d definitions of the table, want 2: the resolved layout is the known one", defs)
	}
	// A value that is not JSON in a column resolved as JSON.
	_, err := e.sink.Apply(ctx, &tidemark.Batch{Source: "s", Changes: []tidemark.Change{
		ins(older, v(4, 1), int64(5), `{"unterminated"`, nil, nil),
	}})
	if ve, ok := errors.AsType[*tidemark.ValueError](err); !ok || ve.Column != "j" || !strings.Contains(err.Error(), "shop.ju.j") || !strings.Contains(err.Error(), "not valid JSON") {
		t.Errorf("Apply of a value that is not JSON: %v, want a ValueError naming shop.ju.j", err)
	}

	// No target table, or one that has the column as text: text.
	e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{
		ins(evoTable("jt", id, unknown), v(5, 1), int64(1), "not JSON at all"),
	}})
	e.apply(&tidemark.Batch{Source: "s", Changes: []tidemark.Change{
		ins(evoTable("jt", id, unknown, x), v(5, 2), int64(2), "plain", int64(1)),
	}})
	if got := strings.Join(e.columnTypes("jt"), ", "); got != "id bigint, j text, x integer" {
		t.Fatalf("columns %s", got)
	}
	if got := strings.Join(e.rows(`SELECT id, j FROM `+e.table("jt")+` ORDER BY id`), ","); got != "1|not JSON at all,2|plain" {
		t.Errorf("rows %s", got)
	}
}
