package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// TestControlRecordsOutsideTheTopology runs the daemon with
// target.kafka.control_records: true but without the apply topology — a
// PostgreSQL + Kafka fan-out, and Kafka alone — through a TRUNCATE of a
// source table: the table's topic carries a tm_control: truncate record, as
// docs/kafka.md promises (review finding 6: neither published one). The
// fan-out's resync also encloses its snapshot rows in snapshot_begin and
// snapshot_end records.
func TestControlRecordsOutsideTheTopology(t *testing.T) {
	for _, mode := range []string{"fanout", "kafka-only"} {
		t.Run(mode, func(t *testing.T) {
			f := newFixture(t)
			var r *kafkaRun
			var cfg string
			if mode == "fanout" {
				r = f.newKafkaRun(t, "it_kctl_", 105, "")
				cfg = r.cfg
			} else {
				r = &kafkaRun{brokers: f.kafka(t), db: testenv.Name("it_kctlk_")}
				f.dropLater(t, r.db)
				r.start = f.binlogStart(t)
				r.w = &harness.Workload{My: f.my, Database: r.db, Zone: "UTC", BigTxRows: 20}
				if err := r.w.Setup(); err != nil {
					t.Fatal(err)
				}
				r.prefix = "tk" + strings.TrimPrefix(r.db, "it_kctlk_")
				cfg = f.kafkaOnlyConfig(t, r.db, r.prefix, r.start, "")
			}
			setYAML(t, cfg, "    tombstones: true\n", "    tombstones: true\n    control_records: true\n")
			d := f.startDaemon(t, cfg)
			defer d.stop(t)
			if err := r.w.Run(30); err != nil {
				t.Fatal(err)
			}
			if mode == "fanout" {
				// Past the new table's snapshot, so that the TRUNCATE
				// streams after it.
				f.waitCaughtUp(t, r.db, d)
			} else {
				time.Sleep(3 * time.Second)
			}
			if err := harness.Exec(f.my, "TRUNCATE TABLE "+r.db+".orders"); err != nil {
				t.Fatal(err)
			}
			if err := r.w.Run(10); err != nil {
				t.Fatal(err)
			}
			want := []string{"truncate"}
			if mode == "fanout" {
				env := []string{"TM_IT_MYSQL_PASSWORD=" + f.env.MySQLPassword, "TM_IT_PG_DSN=" + f.env.PGDSN}
				if code, out := runBinary(t, 120*time.Second, env, "resync", "--config", cfg, "--table", r.db+".orders", "--wait", "100s"); code != 0 {
					t.Fatalf("resync: exit %d\n%s\ndaemon:\n%s", code, out, tail(d.stderr.String(), 15))
				}
				want = append(want, "snapshot_begin", "snapshot_end")
			}
			got := controlKinds(t, r.brokers, r.prefix+"."+r.db+".orders", want, 60*time.Second)
			for _, k := range want {
				if got[k] == 0 {
					t.Errorf("no tm_control: %s record on the topic (control records seen: %v)\n%s", k, got, tail(withoutLines(d.stderr.String(), "applied"), 25))
				}
			}
		})
	}
}

// controlKinds reads a topic (read_committed) until every kind of want has
// a control record or the timeout passes, and counts the control records
// by kind.
func controlKinds(t *testing.T, brokers []string, topic string, want []string, timeout time.Duration) map[string]int {
	t.Helper()
	cl := readCommitted(t, brokers, topic)
	got := map[string]int{}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		all := true
		for _, k := range want {
			all = all && got[k] > 0
		}
		if all {
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			for _, h := range r.Headers {
				if h.Key == "tm_control" {
					got[string(h.Value)]++
				}
			}
		})
	}
	return got
}

// readCommitted returns a read_committed client of topic from its start,
// closed at the end of the test.
func readCommitted(t *testing.T, brokers []string, topic string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}
