package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// TestApplyGroup runs the scale-out topology on the real broker: a source
// workload through the tailer (`tidemark run` with an apply section, a
// standby beside it) into a topic of 12 partitions, and 3 `tidemark apply`
// members writing PostgreSQL. Mid-run one member is killed with SIGKILL
// (while batches are in flight) and restarted, a 4th member joins (a
// rebalance), and the active tailer is killed (the standby takes over).
// Then: the target equals the source row by row with no business key
// twice, every partition's stored offset is the topic's end (no record
// left out), and no change reached the target twice: with soft deletes every
// row keeps its version, so a record applied again would be skipped by the
// version guard, and every member logs each batch that skips one.
func TestApplyGroup(t *testing.T) {
	f := newFixture(t)
	r, group := f.newApplyRun(t, "it_apply_", 95, 12, 300)
	brokers, cfg, w, db := r.brokers, r.cfg, r.w, r.db
	// Soft deletes keep every row's version: the version guard then skips
	// only a change the target already has (a hard delete of a row that a
	// batch inserted and deleted would count as skipped too).
	setYAML(t, cfg, "    schema: "+db+"\n", "    schema: "+db+"\n    delete_mode: soft\n")
	topic := r.prefix + "." + db + ".orders"
	ps := &procSet{f: f, t: t}
	defer ps.killAll()
	start1 := func(args ...string) *daemonProc { return ps.start(args...) }
	tailer := start1("run", "--config", cfg)
	standby := start1("run", "--config", cfg)
	appliers := []*daemonProc{start1("apply", "--config", cfg), start1("apply", "--config", cfg), start1("apply", "--config", cfg)}

	load := startLoad(t, f.env, w, false, 2*time.Millisecond)
	time.Sleep(3 * time.Second)
	// SIGKILL one member while it applies, then restart it.
	appliers[0].kill()
	time.Sleep(time.Second)
	appliers[0] = start1("apply", "--config", cfg)
	time.Sleep(3 * time.Second)
	// A 4th member joins: the group rebalances.
	appliers = append(appliers, start1("apply", "--config", cfg))
	time.Sleep(3 * time.Second)
	// The active tailer dies; the standby takes over.
	active, waiting := tailer, standby
	if strings.Contains(standby.stderr.String(), "starting pipeline") {
		active, waiting = standby, tailer
	}
	active.kill()
	killed := time.Now()
	if !testenv.WaitFor(60*time.Second, func() bool { return strings.Contains(waiting.stderr.String(), "starting pipeline") }) {
		t.Fatalf("the standby tailer did not take over:\n%s", tail(waiting.stderr.String(), 20))
	}
	takeover := time.Since(killed)
	time.Sleep(2 * time.Second)
	if err := load.Stop(); err != nil {
		t.Fatal(err)
	}

	// Converged: the target equals the source.
	spec := harness.TableSpec{Database: db, Table: "orders", SourceZone: "UTC", SoftDelete: true}
	var diff *harness.Diff
	if !testenv.WaitFor(180*time.Second, func() bool {
		d, err := harness.Compare(f.ctx, f.my, f.pg, spec)
		if err != nil {
			return false
		}
		diff = d
		return d.Equal()
	}) {
		msg := ""
		for i, d := range appliers {
			msg += fmt.Sprintf("\napplier %d:\n%s", i, tail(d.stderr.String(), 15))
		}
		t.Fatalf("target did not converge: %v%s\ntailer:\n%s", diff, msg, tail(waiting.stderr.String(), 15))
	}
	for i, d := range appliers {
		if d.exited() {
			t.Fatalf("applier %d exited:\n%s", i, tail(d.stderr.String(), 20))
		}
	}
	// Every record of every partition applied: the stored offsets are
	// the topic's end offsets.
	adm := kadmClient(t, brokers)
	ends, err := adm.ListEndOffsets(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	stored := map[int32]int64{}
	rows, err := f.pg.Query(f.ctx, "SELECT partition, next_offset FROM tidemark.stream_offsets WHERE consumer_group = $1 AND topic = $2", group, topic)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var p int32
		var n int64
		if err := rows.Scan(&p, &n); err != nil {
			t.Fatal(err)
		}
		stored[p] = n
	}
	rows.Close()
	if !testenv.WaitFor(30*time.Second, func() bool {
		ok := true
		ends.Each(func(o kadm.ListedOffset) {
			var n int64
			_ = f.pg.QueryRow(f.ctx, "SELECT next_offset FROM tidemark.stream_offsets WHERE consumer_group = $1 AND topic = $2 AND partition = $3", group, topic, o.Partition).Scan(&n)
			stored[o.Partition] = n
			// The end may be one past the last record (a commit marker).
			if n < o.Offset-1 {
				ok = false
			}
		})
		return ok
	}) {
		t.Fatalf("stored offsets %v do not reach the topic's ends %v", stored, ends)
	}
	if len(stored) != 12 {
		t.Fatalf("offsets stored for %d partitions, want 12: %v", len(stored), stored)
	}
	// tidemark status shows the group: every partition assigned to one of
	// the 4 live members, caught up.
	code, out := runBinary(t, 60*time.Second, []string{"TM_IT_MYSQL_PASSWORD=" + f.env.MySQLPassword, "TM_IT_PG_DSN=" + f.env.PGDSN},
		"status", "--config", cfg, "--json")
	if code != 0 {
		t.Fatalf("status: exit %d\n%s", code, out)
	}
	var st struct {
		Apply struct {
			Group      string `json:"group"`
			Partitions []struct {
				Partition int32  `json:"partition"`
				Lag       int64  `json:"lag"`
				Member    string `json:"member"`
			} `json:"partitions"`
		} `json:"apply"`
	}
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	owners := map[string]int{}
	for _, p := range st.Apply.Partitions {
		if p.Member == "" || p.Lag > 1 {
			t.Errorf("status: partition %d: member %q, lag %d", p.Partition, p.Member, p.Lag)
		}
		owners[p.Member]++
	}
	if st.Apply.Group != group || len(st.Apply.Partitions) != 12 || len(owners) != 4 {
		t.Fatalf("status: group %q, %d partitions over %d members %v, want %s, 12 over 4", st.Apply.Group, len(st.Apply.Partitions), len(owners), owners, group)
	}
	// Stop the members cleanly: every one of them must exit 0.
	for i, d := range appliers {
		if code := d.stop(t); code != 0 {
			t.Fatalf("applier %d exit %d:\n%s", i, code, tail(d.stderr.String(), 20))
		}
	}
	if code := waiting.stop(t); code != 0 {
		t.Fatalf("tailer exit %d:\n%s", code, tail(waiting.stderr.String(), 20))
	}
	moved, skipped := 0, 0
	for _, d := range ps.procs {
		moved += strings.Count(d.stderr.String(), "another member applied a partition")
		skipped += strings.Count(d.stderr.String(), "changes skipped by the version guard")
	}
	// No change reached the target twice: a record applied again (a
	// replay after a crash or a rebalance) would be skipped by the
	// version guard, and the member logs every batch that skips one.
	if skipped > 0 {
		t.Fatalf("%d batches skipped changes the target already had: records were applied twice", skipped)
	}
	t.Logf("apply group: %d rows equal; standby tailer took over %s after SIGKILL; offsets %v; %d offset conflicts resolved by re-reading",
		diff.SourceRows, takeover.Round(time.Millisecond), stored, moved)
}

// newApplyRun sets up a scale-out scenario: a Kafka run (newKafkaRun) whose
// config has an apply section (a random group, max_records) and topics of
// the given number of partitions; the group's offsets are deleted at
// cleanup.
func (f *fixture) newApplyRun(t *testing.T, tag string, seed uint64, partitions, maxRecords int) (*kafkaRun, string) {
	t.Helper()
	group := testenv.Name(tag + "group_")
	r := f.newKafkaRun(t, tag, seed, fmt.Sprintf("apply:\n  group: %s\n  max_records: %d\n", group, maxRecords))
	setKafkaPartitions(t, r.cfg, partitions)
	t.Cleanup(func() {
		_, _ = f.pg.Exec(f.ctx, "DELETE FROM tidemark.stream_offsets WHERE consumer_group = $1", group)
	})
	return r, group
}

// procSet is the tidemark processes a test started; killAll ends the ones
// still running.
type procSet struct {
	f     *fixture
	t     *testing.T
	procs []*daemonProc
}

func (p *procSet) start(args ...string) *daemonProc {
	d := p.f.startCommand(p.t, args)
	p.procs = append(p.procs, d)
	return d
}

func (p *procSet) killAll() {
	for _, d := range p.procs {
		if !d.exited() {
			d.kill()
		}
	}
}

// setKafkaPartitions sets target.kafka.partitions in a config written by
// addKafka (the change topics are created with that many).
func setKafkaPartitions(t *testing.T, cfgPath string, n int) {
	t.Helper()
	setYAML(t, cfgPath, "    exactly_once: true\n", fmt.Sprintf("    exactly_once: true\n    partitions: %d\n", n))
}

// setYAML replaces the first old in a config file by new, failing when old
// is not there.
func setYAML(t *testing.T, cfgPath, old, new string) {
	t.Helper()
	b, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), old) {
		t.Fatalf("config has no %q:\n%s", old, b)
	}
	if err := os.WriteFile(cfgPath, []byte(strings.Replace(string(b), old, new, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
}

func kadmClient(t *testing.T, brokers []string) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}
