package integration

import (
	"fmt"
	"strings"
	"testing"

	"tidemark/integration/harness"
)

// TestApplyOnlineSchemaChangeCutOver runs the scale-out topology (tailer
// and two appliers, 4 partitions, ddl.drop_table: apply) through a gh-ost
// / pt-online-schema-change cut-over: a copy table filled from orders,
// then RENAME TABLE orders TO _orders_del, _orders_gho TO orders, then an
// update. The table renamed into orders brings rows the stream never
// showed under that name: the tailer snapshots it for the appliers, and the
// target equals the source row by row (review finding 5: the appliers'
// orders held only the rows changed after the cut-over).
func TestApplyOnlineSchemaChangeCutOver(t *testing.T) {
	f, r, ps, converge := startDDLTopology(t, "it_applycut_", 103, "    ddl: {drop_table: apply}\n")
	defer ps.killAll()
	if err := r.w.Run(60); err != nil {
		t.Fatal(err)
	}
	converge("before the copy")
	if err := harness.Exec(f.my, "USE "+r.db, "CREATE TABLE _orders_gho LIKE orders", "INSERT INTO _orders_gho SELECT * FROM orders",
		"RENAME TABLE orders TO _orders_del, _orders_gho TO orders",
		"UPDATE orders SET note = 'after the cut-over' WHERE order_id = 1"); err != nil {
		t.Fatal(err)
	}
	converge("after the cut-over")
	ps.converge(harness.TableSpec{Database: r.db, Table: "_orders_del", SourceZone: "UTC"}, "the table renamed away")
}

// TestApplyRestoreOfANewTable runs the scale-out topology (tailer and two
// appliers, 4 partitions, ddl.drop_table: refuse, the default) through what
// a mysqldump restore does for a table the source never had: DROP TABLE IF
// EXISTS, CREATE TABLE, INSERT. The DROP drops nothing the appliers have,
// so it is not refused (as without the topology); the table streams and
// the target equals the source (review finding 5: the tailer quarantined
// it for good).
func TestApplyRestoreOfANewTable(t *testing.T) {
	f, r, ps, converge := startDDLTopology(t, "it_applyrestore_", 104, "")
	defer ps.killAll()
	if err := r.w.Run(20); err != nil {
		t.Fatal(err)
	}
	converge("before the restore")
	var vals []string
	for i := range 100 {
		vals = append(vals, fmt.Sprintf("(%d, 'restored %d')", i, i))
	}
	if err := harness.Exec(f.my, "USE "+r.db, "DROP TABLE IF EXISTS restored",
		"CREATE TABLE restored (id INT NOT NULL PRIMARY KEY, v VARCHAR(40))",
		"INSERT INTO restored VALUES "+strings.Join(vals, ",")); err != nil {
		t.Fatal(err)
	}
	ps.converge(harness.TableSpec{Database: r.db, Table: "restored", SourceZone: "UTC"}, "after the restore")
	if strings.Contains(ps.procs[0].stderr.String(), "table quarantined") {
		t.Errorf("the tailer quarantined a table:\n%s", tail(ps.procs[0].stderr.String(), 10))
	}
}
