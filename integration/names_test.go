package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"tidemark"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// Names MySQL accepts and PostgreSQL refuses or changes (review findings 16
// and 8): PostgreSQL's system column names, tidemark's reserved _tm_ prefix,
// and names longer than PostgreSQL's 63 bytes (it truncates them silently,
// so two long non-ASCII table names land in one target table, and a long
// multi-byte column name is read back truncated after a restart). Each such
// table is quarantined with an error naming the table and the identifier;
// the other tables keep streaming.

// TestTargetRefusedNames: tables with such names, one snapshotted at the
// first run, the others created while the daemon streams.
func TestTargetRefusedNames(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_names_")
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	// snap_sys exists before the start position: it is snapshotted when
	// its first change streams.
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE snap_sys (id INT PRIMARY KEY, ctid INT)", "INSERT INTO snap_sys VALUES (1, 1)")
	start, err := harness.SourcePosition(f.my)
	if err != nil {
		t.Fatal(err)
	}
	long1 := strings.Repeat("ж", 32) + "_1" // 66 bytes: the first 63 equal
	long2 := strings.Repeat("ж", 32) + "_2"
	longCol := strings.Repeat("ц", 40) // 80 bytes
	f.exec(t, "USE "+db,
		"CREATE TABLE good (id INT PRIMARY KEY, v INT)",
		"INSERT INTO good SELECT seq, seq FROM seq_1_to_10", "INSERT INTO snap_sys VALUES (2, 2)")
	cfg := f.schemaConfig(t, db, db, start, "", "", "")
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	f.waitCaughtUp(t, db, d)

	f.exec(t, "USE "+db,
		"CREATE TABLE extents (id INT PRIMARY KEY, xmin DOUBLE, xmax DOUBLE, ymin DOUBLE, ymax DOUBLE)",
		"INSERT INTO extents VALUES (1, 0, 1, 0, 1)",
		"CREATE TABLE sys2 (id INT PRIMARY KEY, cmin INT, cmax INT, tableoid INT)",
		"INSERT INTO sys2 VALUES (1, 1, 1, 1)",
		"CREATE TABLE tmcol (id INT PRIMARY KEY, _tm_note INT)",
		"INSERT INTO tmcol VALUES (1, 1)",
		"CREATE TABLE `"+long1+"` (id INT PRIMARY KEY, v VARCHAR(10))",
		"CREATE TABLE `"+long2+"` (id INT PRIMARY KEY, w VARCHAR(10))",
		"INSERT INTO `"+long1+"` VALUES (1, 'first')",
		"INSERT INTO `"+long2+"` VALUES (1, 'second')",
		"CREATE TABLE longcol (id INT PRIMARY KEY, `"+longCol+"` INT)",
		"INSERT INTO longcol VALUES (1, 1)",
		"INSERT INTO good VALUES (100, 100)", "UPDATE good SET v = 7 WHERE id = 1")
	want := map[string][]string{
		"snap_sys": {`"ctid"`, "system column"},
		"extents":  {`"xmin"`, "system column"},
		"sys2":     {`"cmin"`, "system column"},
		"tmcol":    {`"_tm_note"`, "reserved"},
		long1:      {long1, "66 bytes", "63"},
		long2:      {long2, "66 bytes", "63"},
		"longcol":  {longCol, "80 bytes", "63"},
	}
	ok := testenv.WaitFor(60*time.Second, func() bool {
		for table := range want {
			if mode, _ := f.tableState(t, db, db, table); mode != "quarantined" {
				return d.exited()
			}
		}
		return true
	})
	if d.exited() {
		t.Fatalf("the daemon stopped on a table with a name PostgreSQL refuses:\n%s", tail(d.stderr.String(), 20))
	}
	if !ok {
		for table := range want {
			mode, reason := f.tableState(t, db, db, table)
			t.Logf("%s: %q %q", table, mode, reason)
		}
		t.Fatalf("not every table quarantined within 60 s:\n%s", tail(d.stderr.String(), 30))
	}
	for table, words := range want {
		_, reason := f.tableState(t, db, db, table)
		for _, w := range words {
			if !strings.Contains(reason, w) {
				t.Errorf("%s: the reason %q does not say %q", table, reason, w)
			}
		}
		if f.pgTableExists(t, db, table) {
			t.Errorf("%s: a target table was created", table)
		}
	}
	// PostgreSQL truncates at a character boundary (62 bytes here): no table under that name.
	if f.pgTableExists(t, db, string([]byte(long1)[:62])) {
		t.Errorf("a target table under the truncated name %q exists", string([]byte(long1)[:62]))
	}
	f.waitCaughtUp(t, db, d)
	f.compareTable(t, db, "good")
	f.stopOK(t, d)
}

// kafkaOnlyConfig writes a config with Kafka (the real broker) as the only
// target, topics prefixed with prefix; extra goes into target.kafka.
func (f *fixture) kafkaOnlyConfig(t *testing.T, db, prefix string, start tidemark.Position, kafkaLines string) string {
	t.Helper()
	cfg := f.configYAMLWith(t, db, db, db, "UTC", start, "dedupe:\n  enabled: false\n")
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	y := string(b)
	i, j := strings.Index(y, "  postgres:\n"), strings.Index(y, "\nbatch:")
	if i < 0 || j < i {
		t.Fatalf("unexpected config layout:\n%s", y)
	}
	y = y[:i] + y[j+1:]
	if err := os.WriteFile(cfg, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	addKafka(t, cfg, f.kafka(t), prefix)
	if kafkaLines != "" {
		setYAML(t, cfg, "    tombstones: true\n", "    tombstones: true\n"+kafkaLines)
	}
	return cfg
}

// topicCounts reads every topic whose name starts with prefix for a while
// (read_committed) and counts the change records of each.
func topicCounts(t *testing.T, brokers []string, prefix string, wait time.Duration) map[string]int {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeRegex(), kgo.ConsumeTopics("^"+regexp.QuoteMeta(prefix)+`\..*`),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.MetadataMinAge(500*time.Millisecond), kgo.MetadataMaxAge(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	counts := map[string]int{}
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			if r.Value != nil {
				counts[r.Topic]++
			}
		})
	}
	return counts
}

// TestKafkaRecordTooLargeAndTopicNames: with Kafka as the only target, a
// change whose record is larger than max_record_bytes quarantines its table
// (the others keep streaming), and two tables whose names differ only in
// non-ASCII letters of the same length get two topics, not one.
func TestKafkaRecordTooLargeAndTopicNames(t *testing.T) {
	f := newFixture(t)
	brokers := f.kafka(t)
	db := testenv.Name("it_kbig_")
	f.dropLater(t, db)
	start := f.binlogStart(t)
	prefix := "tk" + strings.TrimPrefix(db, "it_kbig_")
	cfg := f.kafkaOnlyConfig(t, db, prefix, start, "    max_record_bytes: 4096\n")
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE good (id INT PRIMARY KEY, v INT)",
		"CREATE TABLE big (id INT PRIMARY KEY, doc TEXT)",
		"CREATE TABLE `жж` (id INT PRIMARY KEY, v INT)",
		"CREATE TABLE `ёё` (id INT PRIMARY KEY, v INT)")
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	f.exec(t, "USE "+db,
		"INSERT INTO good VALUES (1, 1)",
		"INSERT INTO big VALUES (1, REPEAT('x', 10000))",
		"INSERT INTO good VALUES (2, 2)",
		"INSERT INTO `жж` VALUES (1, 1)",
		"INSERT INTO `ёё` VALUES (1, 2), (2, 2)",
		"INSERT INTO good VALUES (3, 3)")
	ok := testenv.WaitFor(60*time.Second, func() bool {
		return d.exited() || strings.Contains(grepLines(d.stderr.String(), "quarantined"), db+".big")
	})
	log := d.stderr.String()
	if d.exited() || !ok {
		t.Fatalf("big was not quarantined (exited %v):\n%s", d.exited(), tail(log, 20))
	}
	for _, w := range []string{"max_record_bytes", "4096"} {
		if !strings.Contains(grepLines(log, "quarantined"), w) {
			t.Errorf("the quarantine does not say %q:\n%s", w, grepLines(log, "quarantined"))
		}
	}
	counts := topicCounts(t, brokers, prefix, 8*time.Second)
	if d.exited() {
		t.Fatalf("the daemon stopped:\n%s", tail(d.stderr.String(), 20))
	}
	if n := counts[prefix+"."+db+".good"]; n != 3 {
		t.Errorf("good: %d records, want 3 (topics %v)", n, counts)
	}
	var cyr []int
	for topic, n := range counts {
		if strings.HasPrefix(topic, prefix+"."+db+".__") {
			cyr = append(cyr, n)
		}
	}
	sort.Ints(cyr)
	if fmt.Sprint(cyr) != "[1 2]" {
		t.Errorf("the tables жж and ёё: records per topic %v, want [1 2] (two topics); topics %v", cyr, counts)
	}
	f.stopOK(t, d)
}

// TestApplyTopologyRefusedNames: in the scale-out topology the tailer
// quarantines a table whose names the appliers' PostgreSQL cannot hold
// before publishing it; the applier goes on with the other tables.
func TestApplyTopologyRefusedNames(t *testing.T) {
	f := newFixture(t)
	r, _ := f.newApplyRun(t, "it_anames_", 17, 2, 100)
	f.forgetStates(t, r.db)
	ps := &procSet{f: f, t: t}
	defer ps.killAll()
	tailer := ps.start("run", "--config", r.cfg)
	applier := ps.start("apply", "--config", r.cfg)
	if err := r.w.Run(20); err != nil {
		t.Fatal(err)
	}
	f.exec(t, "USE "+r.db,
		"CREATE TABLE extents (id INT PRIMARY KEY, xmin DOUBLE, xmax DOUBLE)",
		"INSERT INTO extents VALUES (1, 0, 1)")
	if err := r.w.Run(20); err != nil {
		t.Fatal(err)
	}
	ok := testenv.WaitFor(60*time.Second, func() bool {
		mode, _ := f.tableState(t, r.db, r.db, "extents")
		return mode == "quarantined" || tailer.exited() || applier.exited()
	})
	mode, reason := f.tableState(t, r.db, r.db, "extents")
	if !ok || mode != "quarantined" || !strings.Contains(reason, `"xmin"`) {
		t.Fatalf("extents: state %q reason %q (tailer exited %v, applier exited %v)\ntailer:\n%s\napplier:\n%s",
			mode, reason, tailer.exited(), applier.exited(), tail(tailer.stderr.String(), 10), tail(applier.stderr.String(), 10))
	}
	spec := harness.TableSpec{Database: r.db, Table: "orders", SourceZone: "UTC"}
	if !testenv.WaitFor(90*time.Second, func() bool {
		d, err := harness.Compare(f.ctx, f.my, f.pg, spec)
		return err == nil && d.Equal()
	}) || applier.exited() || tailer.exited() {
		t.Fatalf("orders did not converge (tailer exited %v, applier exited %v)\napplier:\n%s", tailer.exited(), applier.exited(), tail(applier.stderr.String(), 20))
	}
}

// TestKafkaLegacyCharsets: a latin1 ENUM member and latin2 text reach the
// Kafka envelope as the text the source holds (review finding 7: the
// member was the table map's latin1 bytes, which the envelope turned into
// U+FFFD; latin2 bytes that happen to be valid UTF-8 were published as
// other letters).
func TestKafkaLegacyCharsets(t *testing.T) {
	f := newFixture(t)
	brokers := f.kafka(t)
	db := testenv.Name("it_kcs_")
	f.dropLater(t, db)
	start := f.binlogStart(t)
	prefix := "tk" + strings.TrimPrefix(db, "it_kcs_")
	cfg := f.kafkaOnlyConfig(t, db, prefix, start, "")
	f.exec(t, "CREATE DATABASE "+db, "USE "+db, "SET NAMES utf8mb4",
		"CREATE TABLE t (id INT PRIMARY KEY, city ENUM('Köln','Zürich') CHARACTER SET latin1, v VARCHAR(20) CHARACTER SET latin2)",
		"INSERT INTO t VALUES (1, 'Köln', 'ĹĄ')")
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(prefix+"."+db+".t"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.MetadataMinAge(500*time.Millisecond), kgo.MetadataMaxAge(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var after map[string]any
	deadline := time.Now().Add(60 * time.Second)
	for after == nil && time.Now().Before(deadline) && !d.exited() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			var env struct {
				After map[string]any `json:"after"`
			}
			if r.Value != nil && json.Unmarshal(r.Value, &env) == nil && env.After != nil {
				after = env.After
			}
		})
	}
	if after == nil {
		t.Fatalf("no change record within 60 s:\n%s", tail(d.stderr.String(), 20))
	}
	if after["city"] != "Köln" || after["v"] != "ĹĄ" {
		t.Fatalf("envelope after = %q, want city Köln and v ĹĄ", after)
	}
	f.stopOK(t, d)
}
