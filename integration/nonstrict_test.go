package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"tidemark/internal/testenv"
)

// TestNonStrictGTIDGoingBackwardsReachesKafka is review finding 11: on a
// MariaDB without gtid_strict_mode (allowed under version: filepos), a
// transaction with a lower GTID sequence (SET SESSION gtid_seq_no, as a
// mysqlbinlog replay for point-in-time recovery does) gave a checkpoint
// that compared below the one stored in Kafka, and the Kafka sink dropped
// its batch as "already published". Positions of one server and epoch are
// now ordered by binlog file and offset.
func TestNonStrictGTIDGoingBackwardsReachesKafka(t *testing.T) {
	f := newFixture(t)
	brokers := f.kafka(t)
	db := testenv.Name("it_nstrict_")
	f.dropLater(t, db)
	f.exec(t, "SET GLOBAL gtid_strict_mode = 0")
	t.Cleanup(func() {
		// A transaction with the domain's highest sequence number last,
		// so that @@gtid_binlog_pos is ordinary again for later tests.
		_, _ = f.my.Execute("SET SESSION gtid_seq_no = 0")
		_, _ = f.my.Execute("CREATE DATABASE IF NOT EXISTS " + db + "_end")
		_, _ = f.my.Execute("DROP DATABASE IF EXISTS " + db + "_end")
		_, _ = f.my.Execute("SET GLOBAL gtid_strict_mode = 1")
	})
	start := f.binlogStart(t)
	prefix := "tk" + strings.TrimPrefix(db, "it_nstrict_")
	cfg := f.kafkaOnlyConfig(t, db, prefix, start, "")
	setSourceOption(t, cfg, "version", "filepos")
	f.exec(t, "CREATE DATABASE "+db, "USE "+db, "CREATE TABLE t (id INT PRIMARY KEY, v INT)")
	for i := 1; i <= 5; i++ {
		f.exec(t, fmt.Sprintf("INSERT INTO %s.t VALUES (%d, %d)", db, i, i))
	}
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	want := 5
	if !testenv.WaitFor(60*time.Second, func() bool { return topicCounts(t, brokers, prefix, 2*time.Second)[prefix+"."+db+".t"] >= want }) {
		t.Fatalf("the first %d rows did not reach Kafka:\n%s", want, tail(d.stderr.String(), 20))
	}
	// A GTID sequence far below the domain's: the binlog's order is
	// still the commit order.
	f.exec(t, "SET SESSION gtid_seq_no = 3", fmt.Sprintf("INSERT INTO %s.t VALUES (100, 100)", db), "SET SESSION gtid_seq_no = 0")
	f.exec(t, fmt.Sprintf("INSERT INTO %s.t VALUES (101, 101)", db))
	want = 7
	var got int
	testenv.WaitFor(30*time.Second, func() bool {
		got = topicCounts(t, brokers, prefix, 2*time.Second)[prefix+"."+db+".t"]
		return got >= want
	})
	log := d.stderr.String()
	if got != want {
		t.Fatalf("the topic has %d of %d changes after a GTID sequence went backwards:\n%s", got, want, grepLines(log, "skipping batch"))
	}
	if strings.Contains(log, "skipping batch already published") {
		t.Fatalf("a batch was dropped as already published:\n%s", grepLines(log, "skipping batch"))
	}
	f.stopOK(t, d)
}
