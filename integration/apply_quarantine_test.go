package integration

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// TestApplyQuarantinesOneTable runs the scale-out topology (tailer and two
// appliers, 4 partitions) with two tables and puts a poison record (a text
// column holding a number) into table other's topic. The member that reads
// it must not stop (and hand the partition to the next member, which would
// stop too: review finding 15); it quarantines table other in the table
// states `tidemark status` shows, with the cause, skips other's rows, and
// the orders table keeps applying. `tidemark resync --table db.other`
// recovers it: the appliers apply other again from its snapshot on.
func TestApplyQuarantinesOneTable(t *testing.T) {
	f, r, ps, converge := startDDLTopology(t, "it_applyquar_", 109, "")
	defer ps.killAll()
	insertOther := func(n int) {
		t.Helper()
		var stmts []string
		for i := 0; i < n; i++ {
			stmts = append(stmts, fmt.Sprintf("INSERT INTO %s.other (v) VALUES ('x%d')", r.db, i))
		}
		if err := harness.Exec(f.my, stmts...); err != nil {
			t.Fatal(err)
		}
	}
	if err := harness.Exec(f.my, "CREATE TABLE "+r.db+".other (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(10))"); err != nil {
		t.Fatal(err)
	}
	insertOther(20)
	if err := r.w.Run(30); err != nil {
		t.Fatal(err)
	}
	converge("before the poison record")
	otherSpec := harness.TableSpec{Database: r.db, Table: "other", SourceZone: "UTC"}
	ps.converge(otherSpec, "table other before the poison record")

	// Copy a row record of table other and make its text value a number.
	topic := r.prefix + "." + r.db + ".other"
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.brokers...), kgo.ConsumeTopics(topic), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	var poison *kgo.Record
	for poison == nil && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(rec *kgo.Record) {
			if poison == nil && rec.Value != nil && strings.Contains(string(rec.Value), `"v":"x`) && header(rec, "tm_control") == "" {
				poison = &kgo.Record{Topic: topic, Partition: rec.Partition, Key: rec.Key, Headers: rec.Headers,
					Value: regexp.MustCompile(`"v":"x[0-9]*"`).ReplaceAll(rec.Value, []byte(`"v":42`))}
			}
		})
	}
	if poison == nil {
		t.Fatal("no row record of table other found")
	}
	if err := cl.ProduceSync(ctx, poison).FirstErr(); err != nil {
		t.Fatal(err)
	}
	insertOther(10)
	if err := r.w.Run(30); err != nil {
		t.Fatal(err)
	}
	converge("orders after the poison record in table other")
	var state, reason string
	if !testenv.WaitFor(30*time.Second, func() bool {
		err := f.pg.QueryRow(f.ctx, "SELECT state, coalesce(reason, '') FROM tidemark.tables WHERE source = $1 AND database = $2 AND table_name = 'other'", r.db, r.db).Scan(&state, &reason)
		return err == nil && state == "quarantined"
	}) {
		t.Fatalf("table other is not quarantined (state %q, reason %q)", state, reason)
	}
	if !strings.Contains(reason, "other") {
		t.Errorf("the quarantine's reason does not name the cause: %q", reason)
	}
	t.Logf("quarantined: %s", reason)
	env := []string{"TM_IT_MYSQL_PASSWORD=" + f.env.MySQLPassword, "TM_IT_PG_DSN=" + f.env.PGDSN}
	if code, out := runBinary(t, 120*time.Second, env, "resync", "--config", r.cfg, "--table", r.db+".other", "--wait", "100s"); code != 0 {
		t.Fatalf("resync: exit %d\n%s", code, out)
	}
	insertOther(5)
	ps.converge(otherSpec, "table other after the resync")
	converge("orders at the end")
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
