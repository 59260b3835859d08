package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"tidemark/status"
)

// holdExpire sets the source's binlog expiry to 30 days (which purges
// nothing on the test server) under the named lock the binlog package's
// tests use too, and restores it at cleanup.
func (e *e2e) holdExpire() {
	e.t.Helper()
	r, err := e.my.Execute("SELECT GET_LOCK('tidemark_test_binlog_expire', 120)")
	if err != nil {
		e.t.Fatal(err)
	}
	if ok, _ := r.GetInt(0, 0); ok != 1 {
		e.t.Fatal("could not take the lock on binlog_expire_logs_seconds")
	}
	e.t.Cleanup(func() { _, _ = e.my.Execute("SELECT RELEASE_LOCK('tidemark_test_binlog_expire')") })
	r, err = e.my.Execute("SELECT @@global.binlog_expire_logs_seconds")
	if err != nil {
		e.t.Fatal(err)
	}
	old, _ := r.GetInt(0, 0)
	e.my1("SET GLOBAL binlog_expire_logs_seconds = 2592000")
	e.t.Cleanup(func() { _, _ = e.my.Execute(fmt.Sprintf("SET GLOBAL binlog_expire_logs_seconds = %d", old)) })
}

func (e *e2e) writeConfig() string {
	e.t.Helper()
	path := e.daemon("${TM_STATUS_TEST_PW}", "${TM_STATUS_TEST_DSN}", e.db).Write(e.t)
	e.t.Setenv("TM_STATUS_TEST_PW", e.env.MySQLPassword)
	e.t.Setenv("TM_STATUS_TEST_DSN", e.env.PGDSN)
	return path
}

func (e *e2e) status(path string, args ...string) (*status.Report, string) {
	e.t.Helper()
	var out, errb bytes.Buffer
	if code := cmdStatus(context.Background(), append([]string{"--config", path}, args...), &out, &errb); code != exitOK {
		e.t.Fatalf("status: exit %d: %s", code, errb.String())
	}
	if len(args) == 0 {
		return nil, out.String()
	}
	var rep status.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		e.t.Fatalf("status --json: %v\n%s", err, out.String())
	}
	return &rep, out.String()
}

// TestStatusRetentionShrinksOnRotation is the status test: the
// checkpoint, the tables with their lag, and a retention headroom that
// shrinks once the binlog file holding the checkpoint is rotated away.
func TestStatusRetentionShrinksOnRotation(t *testing.T) {
	e := newE2E(t)
	e.holdExpire()
	e.my1("USE "+e.db, "CREATE TABLE t (id INT PRIMARY KEY, v INT)", "INSERT INTO t VALUES (1, 1), (2, 2)")
	e.replicate()
	path := e.writeConfig()

	before, _ := e.status(path, "--json")
	if before.Checkpoint == "" || before.Retention == nil || before.Retention.ExpireSeconds != 2592000 || before.Retention.HeadroomSeconds == nil {
		t.Fatalf("status: %+v (retention %+v)", before, before.Retention)
	}
	if len(before.Tables) != 1 || before.Tables[0].Table != e.db+".t" || before.Tables[0].Mode != status.ModeStreaming || before.Tables[0].LagSeconds == nil {
		t.Fatalf("tables: %+v", before.Tables)
	}
	if *before.Tables[0].LagSeconds < 0 || *before.Tables[0].LagSeconds > 120 {
		t.Fatalf("lag %v s", *before.Tables[0].LagSeconds)
	}
	if before.Retention.Open && *before.Retention.HeadroomSeconds != 2592000 {
		t.Fatalf("open file: headroom %v, want the full expiry", *before.Retention.HeadroomSeconds)
	}

	e.my1("FLUSH BINARY LOGS")
	time.Sleep(1100 * time.Millisecond)
	after, text := e.status(path, "--json")
	r := after.Retention
	if r == nil || r.Open || r.Purged || r.HeadroomSeconds == nil || r.PurgeAfter == nil || r.File != before.Retention.File {
		t.Fatalf("after rotation: %+v", r)
	}
	if *r.HeadroomSeconds >= *before.Retention.HeadroomSeconds || *r.HeadroomSeconds < 2592000-600 {
		t.Fatalf("headroom %v s after rotation, %v s before: want it to shrink\n%s", *r.HeadroomSeconds, *before.Retention.HeadroomSeconds, text)
	}
	if got := r.PurgeAfter.Sub(*r.ClosedAt); got != 30*24*time.Hour {
		t.Fatalf("purge after − closed = %s", got)
	}

	_, readable := e.status(path)
	for _, s := range []string{"checkpoint   " + after.Checkpoint, "retention    7", "h (file closed ", e.db + ".t", "streaming"} {
		if !strings.Contains(readable, s) {
			t.Errorf("status output lacks %q:\n%s", s, readable)
		}
	}
}
