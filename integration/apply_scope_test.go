package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// TestApplyRefusesForeignControlRecord runs the scale-out topology (tailer
// and two appliers, 4 partitions) with two tables, then produces into the
// orders table's topic a TRUNCATE control record that names the other
// table (what anyone who can produce to the brokers could do, issue 26): the
// applier that owns the partition refuses it with one error naming the
// topic, partition, offset and the mismatch and stops that partition; the
// other table keeps its rows, and keeps applying.
func TestApplyRefusesForeignControlRecord(t *testing.T) {
	f, r, ps, converge := startDDLTopology(t, "it_applyscope_", 101, "")
	defer ps.killAll()
	other := func(n int) {
		t.Helper()
		var stmts []string
		for i := 0; i < n; i++ {
			stmts = append(stmts, fmt.Sprintf("INSERT INTO %s.other (v) SELECT 'x' FROM DUAL", r.db))
		}
		if err := harness.Exec(f.my, stmts...); err != nil {
			t.Fatal(err)
		}
	}
	if err := harness.Exec(f.my, "CREATE TABLE "+r.db+".other (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(10))"); err != nil {
		t.Fatal(err)
	}
	other(20)
	if err := r.w.Run(40); err != nil {
		t.Fatal(err)
	}
	converge("before the foreign record")
	otherSpec := harness.TableSpec{Database: r.db, Table: "other", SourceZone: "UTC"}
	ps.converge(otherSpec, "table other before the foreign record")

	// A truncate record for table other, in the orders table's topic.
	topic := r.prefix + "." + r.db + ".orders"
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.brokers...), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	value := fmt.Sprintf(`{"control":"truncate","source":%q,"database":%q,"table":"other","seq":9223372036854775807,"index":0}`, r.db, r.db)
	rec := &kgo.Record{Partition: 0, Value: []byte(value), Headers: []kgo.RecordHeader{{Key: "tm_control", Value: []byte("truncate")}, {Key: "schema_version", Value: []byte("1")}}}
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	res := cl.ProduceSync(ctx, rec)
	if err := res.FirstErr(); err != nil {
		t.Fatal(err)
	}
	offset := res[0].Record.Offset
	want := fmt.Sprintf("%s partition 0 offset %d", topic, offset)
	if !testenv.WaitFor(60*time.Second, func() bool { return ps.count(1, want) > 0 }) {
		var n int
		_ = f.pg.QueryRow(f.ctx, `SELECT count(*) FROM "`+r.db+`".other`).Scan(&n)
		t.Fatalf("no applier refused the foreign control record (no line naming %q); table other has %d target rows of 20:\n%s\n%s",
			want, n, tail(ps.procs[1].stderr.String(), 8), tail(ps.procs[2].stderr.String(), 8))
	}
	line := ""
	for _, d := range ps.procs[1:] {
		if l := grepLines(d.stderr.String(), want); l != "" {
			line = l
		}
	}
	if !strings.Contains(line, "other") || !strings.Contains(line, "orders") {
		t.Errorf("the refusal does not name the mismatch (tables other and orders):\n%s", line)
	}
	if c := strings.Count(ps.procs[1].stderr.String()+ps.procs[2].stderr.String(), want); c != 1 {
		t.Errorf("the refusal was logged %d times, want once:\n%s", c, line)
	}
	// The other table is untouched and keeps applying; so do the orders
	// table's other partitions.
	other(10)
	ps.converge(otherSpec, "table other after the foreign record")
	t.Logf("refused: %s", line)
}
