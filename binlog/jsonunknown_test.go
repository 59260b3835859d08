package binlog

import (
	"context"
	"testing"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"tidemark"
	"tidemark/internal/testenv"
)

// TestJSONUnknownOfAnOlderLayout (nemesis seed 574095280397): a process
// that never saw a LONGTEXT column listed in information_schema (the
// source renamed it since: the layout is older than the catalog) cannot
// tell whether it was JSON; it announces it as text marked JSONUnknown.
// Columns information_schema lists are known (JSON or not), and a shorter
// text type can never be JSON. Real MariaDB answers the schema reads.
func TestJSONUnknownOfAnOlderLayout(t *testing.T) {
	addr, user, pass, c := testServer(t)
	db := testenv.Name("bju_")
	exec(t, c, "CREATE DATABASE "+db)
	t.Cleanup(func() { _, _ = c.Execute("DROP DATABASE " + db) })
	exec(t, c, "CREATE TABLE "+db+".t (id INT PRIMARY KEY, k JSON, s LONGTEXT)")
	tl := newTailer(t, addr, user, pass, db, "UTC")
	t.Cleanup(func() { _ = tl.Close() })
	// The layout before RENAME COLUMN j TO k and DROP COLUMN m.
	tm := &replication.TableMapEvent{
		TableID: 42, Schema: []byte(db), Table: []byte("t"), ColumnCount: 5,
		ColumnType:     []byte{mysql.MYSQL_TYPE_LONG, mysql.MYSQL_TYPE_BLOB, mysql.MYSQL_TYPE_BLOB, mysql.MYSQL_TYPE_BLOB, mysql.MYSQL_TYPE_BLOB},
		ColumnMeta:     []uint16{0, 4, 4, 4, 3},
		ColumnName:     [][]byte{[]byte("id"), []byte("j"), []byte("k"), []byte("s"), []byte("m")},
		PrimaryKey:     []uint64{0},
		DefaultCharset: []uint64{45},
	}
	ti, err := tl.tableFor(context.Background(), tm)
	if err != nil {
		t.Fatal(err)
	}
	if ti.table == nil {
		t.Fatalf("layout not decoded: %v", ti.err)
	}
	want := map[string]struct {
		kind    tidemark.Kind
		unknown bool
	}{
		"id": {tidemark.KindInt, false},
		"j":  {tidemark.KindText, true}, // LONGTEXT, not listed
		"k":  {tidemark.KindJSON, false},
		"s":  {tidemark.KindText, false}, // listed, not JSON
		"m":  {tidemark.KindText, false}, // MEDIUMTEXT: never JSON
	}
	for _, col := range ti.table.Columns {
		if w := want[col.Name]; col.Kind != w.kind || col.JSONUnknown != w.unknown {
			t.Errorf("column %s: %s, JSONUnknown %t; want %s, %t", col.Name, col.Kind, col.JSONUnknown, w.kind, w.unknown)
		}
	}
}
