package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"tidemark"
	"tidemark/binlog"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// TestPostgresAndKafkaExactlyOnce runs the daemon with both sinks against
// the real Apache Kafka broker (scripts/services.sh), kills it with SIGKILL several times
// under load, and checks that PostgreSQL equals the source and that a
// read_committed consumer sees every change of the source exactly once
// (one record per source version), with the envelope's op matching.
func TestPostgresAndKafkaExactlyOnce(t *testing.T) {
	f := newFixture(t)
	brokers := f.kafka(t)
	db := testenv.Name("it_kafka_")
	f.dropLater(t, db, db)
	start := f.binlogStart(t)
	wmy, err := f.env.MySQL()
	if err != nil {
		t.Fatal(err)
	}
	defer wmy.Close()
	w := &harness.Workload{My: wmy, Database: db, Zone: "Asia/Kolkata", Rand: rand.New(rand.NewPCG(71, 72)), BigTxRows: 200}
	if err := w.Setup(); err != nil {
		t.Fatal(err)
	}
	prefix := "tm" + strings.TrimPrefix(db, "it_kafka_")
	extra := "dedupe:\n  enabled: false\n"
	cfg := f.configYAMLWith(t, db, db, db, "Asia/Kolkata", start, extra)
	// Add the Kafka target to the generated config.
	addKafka(t, cfg, brokers, prefix)

	stop := make(chan struct{})
	loadErr := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				loadErr <- nil
				return
			default:
			}
			if err := w.Step(); err != nil {
				loadErr <- err
				return
			}
		}
	}()
	rnd := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 5))
	for i := 0; i < 5; i++ {
		d := f.startDaemon(t, cfg)
		time.Sleep(time.Duration(300+rnd.IntN(700)) * time.Millisecond)
		d.kill()
	}
	close(stop)
	if err := <-loadErr; err != nil {
		t.Fatal(err)
	}
	d := f.startDaemon(t, cfg)
	f.waitCaughtUp(t, db, d)
	// The fan-out resumes from the older checkpoint; wait for Kafka too by
	// a clean stop (which commits what was read) after the PostgreSQL one.
	time.Sleep(500 * time.Millisecond)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, d.stderr.String())
	}
	f.compare(t, harness.TableSpec{Database: db, Table: "orders", SourceZone: "Asia/Kolkata"})

	// Every source change, exactly once, on Kafka.
	ledger := sourceVersions(t, f, db, start)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(prefix+"."+db+".orders"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	seen := map[string]int{}
	ops := map[string]int{}
	deadline := time.Now().Add(30 * time.Second)
	for len(seen) < len(ledger) && time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			if r.Value == nil {
				return // tombstone
			}
			var env struct {
				Op     string `json:"op"`
				Source struct {
					Seq   uint64 `json:"seq"`
					Index uint32 `json:"index"`
				} `json:"source"`
			}
			if err := json.Unmarshal(r.Value, &env); err != nil {
				t.Fatalf("bad envelope: %v", err)
			}
			seen[fmt.Sprintf("%d.%d", env.Source.Seq, env.Source.Index)]++
			ops[env.Op]++
		})
	}
	dups := 0
	for v, n := range seen {
		if n > 1 {
			dups += n - 1
			t.Errorf("version %s published %d times", v, n)
		}
	}
	missing := 0
	for v := range ledger {
		if seen[v] == 0 {
			missing++
		}
	}
	if missing > 0 || dups > 0 || len(seen) != len(ledger) {
		t.Fatalf("kafka: %d source changes, %d distinct published, %d missing, %d duplicates (ops %v)", len(ledger), len(seen), missing, dups, ops)
	}
	t.Logf("kafka after 5 kills: %d changes exactly once (ops %v)", len(seen), ops)
}

// sourceVersions lists the version (GTID seq.row index) of every row change
// of db.orders from the binlog, as tidemark numbers them, by reading the
// table's changes back from the target's history: the PostgreSQL target
// only keeps the latest version, so the ledger comes from a fresh tailer.
func sourceVersions(t *testing.T, f *fixture, db string, from tidemark.Position) map[string]bool {
	t.Helper()
	to, err := harness.SourcePosition(f.my)
	if err != nil {
		t.Fatal(err)
	}
	end, _ := tidemark.ParseMariaDBGTIDSet(to.GTID)
	tl, err := binlog.New(binlog.Config{Name: "ledger", Addr: f.env.MySQLAddr, User: f.env.MySQLUser, Password: f.env.MySQLPassword,
		ServerID: 6001, Include: []string{db + ".orders"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out := make(chan tidemark.Chunk, 4)
	errc := make(chan error, 1)
	go func() { errc <- tl.Stream(ctx, from, out) }()
	versions := map[string]bool{}
	for {
		select {
		case ch := <-out:
			for _, c := range ch.Changes {
				versions[fmt.Sprintf("%d.%d", c.Version.Seq, c.Version.Index)] = true
			}
			if !ch.Commit.IsZero() {
				cur, _ := tidemark.ParseMariaDBGTIDSet(ch.Commit.GTID)
				if c, err := cur.Compare(end); err == nil && c >= 0 {
					cancel()
					<-errc
					return versions
				}
			}
		case err := <-errc:
			t.Fatalf("ledger tailer stopped: %v", err)
		}
	}
}

// kafka returns the real broker's addresses (TIDEMARK_TEST_KAFKA_BROKERS);
// the test fails when they are not set, since CI starts the broker.
func (f *fixture) kafka(t *testing.T) []string {
	t.Helper()
	brokers, err := f.env.Kafka()
	if err != nil {
		t.Fatal(err)
	}
	return brokers
}

// binlogStart returns the source's current GTID position, writing one
// transaction first on a server that has none: an empty start position
// means "snapshot first", and these tests count binlog changes.
func (f *fixture) binlogStart(t *testing.T) tidemark.Position {
	t.Helper()
	start, err := harness.SourcePosition(f.my)
	if err != nil {
		t.Fatal(err)
	}
	if start.GTID != "" {
		return start
	}
	seed := testenv.Name("it_seed_")
	for _, q := range []string{"CREATE DATABASE " + seed, "DROP DATABASE " + seed} {
		if _, err := f.my.Execute(q); err != nil {
			t.Fatal(err)
		}
	}
	if start, err = harness.SourcePosition(f.my); err != nil || start.GTID == "" {
		t.Fatalf("source has no GTID position after a write: %q, %v", start.GTID, err)
	}
	return start
}

// kafkaRun is the set-up of a scenario with PostgreSQL and Kafka
// (exactly_once, the real broker) as targets: a source database with the
// workload's table, the daemon's config, and the source position before it.
type kafkaRun struct {
	brokers         []string
	db, cfg, prefix string
	start           tidemark.Position
	w               *harness.Workload
}

// newKafkaRun sets a scenario up; tag prefixes the database's name, extra
// is added to the config.
func (f *fixture) newKafkaRun(t *testing.T, tag string, seed uint64, extra string) *kafkaRun {
	t.Helper()
	r := &kafkaRun{brokers: f.kafka(t), db: testenv.Name(tag)}
	f.dropLater(t, r.db, r.db)
	r.start = f.binlogStart(t)
	r.w = &harness.Workload{My: f.my, Database: r.db, Zone: "UTC", Rand: rand.New(rand.NewPCG(seed, seed+1)), BigTxRows: 50}
	if err := r.w.Setup(); err != nil {
		t.Fatal(err)
	}
	r.cfg = f.configYAMLWith(t, r.db, r.db, r.db, "UTC", r.start, "dedupe:\n  enabled: false\n"+extra)
	r.prefix = "tk" + strings.TrimPrefix(r.db, tag)
	addKafka(t, r.cfg, r.brokers, r.prefix)
	return r
}

// requireExactlyOnce checks that PostgreSQL equals the source and that the
// table's topic holds every binlog change since the start exactly once
// (snapshot rows, op r with index 0, may repeat: a resync publishes them
// again). It returns the number of changes.
func (f *fixture) requireExactlyOnce(t *testing.T, r *kafkaRun) int {
	t.Helper()
	f.compare(t, harness.TableSpec{Database: r.db, Table: "orders", SourceZone: "UTC"})
	ledger := sourceVersions(t, f, r.db, r.start)
	seen, ops := consumeVersions(t, r.brokers, r.prefix+"."+r.db+".orders", len(ledger), 60*time.Second)
	missing, dups := 0, 0
	for v := range ledger {
		if seen[v] == 0 {
			missing++
		}
	}
	for v, n := range seen {
		if !strings.HasSuffix(v, ".0") {
			dups += n - 1
		}
	}
	if missing > 0 || dups > 0 {
		t.Fatalf("kafka: %d source changes, %d missing, %d duplicates (ops %v)", len(ledger), missing, dups, ops)
	}
	return len(ledger)
}

// addKafka adds a target.kafka section to a config written by configYAML.
func addKafka(t *testing.T, cfgPath string, brokers []string, prefix string) {
	t.Helper()
	b, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	y := strings.Replace(string(b), "\nbatch:", fmt.Sprintf(`
  kafka:
    brokers: [%s]
    topic_prefix: %s
    exactly_once: true
    tombstones: true
batch:`, strings.Join(brokers, ", "), prefix), 1)
	if err := os.WriteFile(cfgPath, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestKafkaOnlyExactlyOnce runs the daemon with Kafka (the real broker) as
// its only target (checkpoints in the checkpoint topic), kills it three times under load,
// and requires every source change exactly once on a read_committed
// consumer.
func TestKafkaOnlyExactlyOnce(t *testing.T) {
	f := newFixture(t)
	brokers := f.kafka(t)
	db := testenv.Name("it_konly_")
	f.dropLater(t, db)
	start := f.binlogStart(t)
	w := &harness.Workload{My: f.my, Database: db, Zone: "UTC", Rand: rand.New(rand.NewPCG(81, 82)), BigTxRows: 100}
	if err := w.Setup(); err != nil {
		t.Fatal(err)
	}
	prefix := "tk" + strings.TrimPrefix(db, "it_konly_")
	cfg := f.kafkaOnlyConfig(t, db, prefix, start, "")
	rnd := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	for i := 0; i < 3; i++ {
		if err := w.Run(60); err != nil {
			t.Fatal(err)
		}
		d := f.startDaemon(t, cfg)
		time.Sleep(time.Duration(300+rnd.IntN(500)) * time.Millisecond)
		d.kill()
	}
	if err := w.Run(60); err != nil {
		t.Fatal(err)
	}
	ledger := sourceVersions(t, f, db, start)
	d := f.startDaemon(t, cfg)
	defer d.stop(t)
	seen, ops := consumeVersions(t, brokers, prefix+"."+db+".orders", len(ledger), 60*time.Second)
	dups, missing := 0, 0
	for v, n := range seen {
		if n > 1 {
			dups += n - 1
		}
		if !ledger[v] {
			t.Errorf("version %s published but not in the source", v)
		}
	}
	for v := range ledger {
		if seen[v] == 0 {
			missing++
		}
	}
	if missing > 0 || dups > 0 {
		t.Fatalf("kafka only: %d source changes, %d missing, %d duplicates (ops %v)\n%s", len(ledger), missing, dups, ops, tail(d.stderr.String(), 20))
	}
	t.Logf("kafka only, 3 kills: %d changes exactly once (ops %v)", len(seen), ops)
}

// consumeVersions reads a topic with read_committed until want distinct
// versions are seen or the timeout passes, then a little longer to catch
// duplicates.
func consumeVersions(t *testing.T, brokers []string, topic string, want int, timeout time.Duration) (map[string]int, map[string]int) {
	t.Helper()
	cl := readCommitted(t, brokers, topic)
	seen, ops := map[string]int{}, map[string]int{}
	deadline := time.Now().Add(timeout)
	extra := time.Time{}
	for time.Now().Before(deadline) {
		if len(seen) >= want && extra.IsZero() {
			extra = time.Now().Add(2 * time.Second)
		}
		if !extra.IsZero() && time.Now().After(extra) {
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			if r.Value == nil {
				return
			}
			var env struct {
				Op     string `json:"op"`
				Source struct {
					Seq   uint64 `json:"seq"`
					Index uint32 `json:"index"`
				} `json:"source"`
			}
			if err := json.Unmarshal(r.Value, &env); err != nil {
				t.Fatalf("bad envelope: %v", err)
			}
			seen[fmt.Sprintf("%d.%d", env.Source.Seq, env.Source.Index)]++
			ops[env.Op]++
		})
	}
	return seen, ops
}
