package binlog

import (
	"errors"
	"strings"
	"testing"

	"github.com/go-mysql-org/go-mysql/mysql"

	"tidemark"
)

// TestClassifyMySQLTexts: MySQL's 1236 texts (8.0.26+/8.4 and the older
// master/slave wording) map to the purged/ahead classes; nothing needs a
// server.
func TestClassifyMySQLTexts(t *testing.T) {
	tl, err := New(Config{Name: "my", Flavor: FlavorMySQL, Addr: "127.0.0.1:1", User: "u", ServerID: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		msg  string
		want error
	}{
		{"Cannot replicate because the source purged required binary logs. Replicate the missing transactions from elsewhere, or provision a new replica from backup. Consider increasing the source's binary log expiration period. The GTID set sent by the replica is 'a:1', and the missing transactions are 'a:2-3'", tidemark.ErrPositionPurged},
		{"The slave is connecting using CHANGE MASTER TO MASTER_AUTO_POSITION = 1, but the master has purged binary logs containing GTIDs that the slave requires.", tidemark.ErrPositionPurged},
		{"Could not find first log file name in binary log index file", tidemark.ErrPositionPurged},
		{"Replica has more GTIDs than the source has, using the source's SERVER_UUID. This may indicate that the end of the binary log was truncated", tidemark.ErrPositionAhead},
		{"Slave has more GTIDs than the master has, using the master's SERVER_UUID. This may indicate that the end of the binary log was truncated", tidemark.ErrPositionAhead},
		{"Client requested source to start replication from position > file size", tidemark.ErrPositionAhead},
		{"Client requested master to start replication from position > file size", tidemark.ErrPositionAhead},
	} {
		err := tl.classify(&mysql.MyError{Code: mysql.ER_MASTER_FATAL_ERROR_READING_BINLOG, Message: c.msg}, tidemark.Position{File: "binlog.000001", Offset: 4})
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.msg) || isTransient(err) {
			t.Errorf("%q: %v, want %v (not retried) with the server's text", c.msg, err, c.want)
		}
	}
}

// TestRenderMySQLJSONRejectsTruncated: a truncated binary JSON value is an
// error, never a shorter document.
func TestRenderMySQLJSONRejectsTruncated(t *testing.T) {
	// {"a": "xyz"} in MySQL's small-object format, then cut.
	full := []byte{0x00, 0x01, 0x00, 0x10, 0x00, 0x0b, 0x00, 0x01, 0x00, 0x0c, 0x0c, 0x00, 'a', 0x03, 'x', 'y', 'z'}
	got, err := renderMySQLJSON(full)
	if err != nil || got != `{"a": "xyz"}` {
		t.Fatalf("got %q, %v", got, err)
	}
	for n := 1; n < len(full); n++ {
		if s, err := renderMySQLJSON(full[:n]); err == nil {
			t.Fatalf("%d of %d bytes rendered as %q, want an error", n, len(full), s)
		}
	}
}
