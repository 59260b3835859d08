package binlog

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"tidemark/internal/testenv"
)

// TestCaptureOutsidePreparedXA (nemesis seed 198201436100), on the real
// MariaDB: a snapshot position must not fall between an XA transaction's XA
// PREPARE and its XA COMMIT, whose rows would then be in no read of the
// snapshot (not committed) and not in the stream (their group is before
// the position); the stream stopped at the XA COMMIT. Capture now waits
// while XA RECOVER lists a transaction not prepared after its position,
// finds one that committed between its position and the check (its XA
// COMMIT in the binlog after the position, its XA PREPARE not), and fails
// naming the transaction after xaCaptureWait.
func TestCaptureOutsidePreparedXA(t *testing.T) {
	addr, user, pass, c := testServer(t)
	db := testenv.Name("bxc_")
	exec(t, c, "CREATE DATABASE "+db, "CREATE TABLE "+db+".t (id INT PRIMARY KEY)")
	t.Cleanup(func() { _, _ = c.Execute("DROP DATABASE " + db) })
	xids := []string{testenv.Name("xa1_"), testenv.Name("xa2_"), testenv.Name("xa3_"), testenv.Name("xa4_")}
	t.Cleanup(func() {
		for _, x := range xids {
			_, _ = c.Execute(fmt.Sprintf("XA ROLLBACK '%s'", x))
		}
	})
	prepare := func(xid string, id int) {
		t.Helper()
		xaRun(t, c, addr, user, pass, xid, fmt.Sprintf("XA START '%s'", xid), fmt.Sprintf("INSERT INTO %s.t VALUES (%d)", db, id), fmt.Sprintf("XA END '%s'", xid), fmt.Sprintf("XA PREPARE '%s'", xid))
	}
	resolve := func(stmt string) { t.Helper(); xaResolve(t, c, stmt) }
	end := func() (string, uint64) {
		t.Helper()
		r, err := c.Execute("SHOW MASTER STATUS")
		if err != nil {
			t.Fatal(err)
		}
		f, _ := r.GetString(0, 0)
		p, _ := r.GetUint(0, 1)
		return f, p
	}
	hex := func(xid string) string { return fmt.Sprintf("X'%x',X'',1", xid) }
	r, err := NewReader(Config{Name: "test", Addr: addr, User: user, Password: pass, ServerID: 1, Include: []string{db + ".*"}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// 1. Prepared before the capture and committed while it waits: the
	// position is after the XA COMMIT.
	prepare(xids[0], 1)
	type captured struct {
		file string
		pos  uint64
		err  error
	}
	got := make(chan captured, 1)
	go func() {
		s, err := r.Capture(ctx)
		got <- captured{s.Position.File, s.Position.Offset, err}
	}()
	time.Sleep(500 * time.Millisecond) // (the capture is waiting or, before the fix, done)
	resolve(fmt.Sprintf("XA COMMIT '%s'", xids[0]))
	cf, cp := end()
	g := <-got
	if g.err != nil {
		t.Fatal(g.err)
	}
	if g.file == cf && g.pos < cp {
		t.Errorf("capture at %s:%d, before the XA COMMIT of %s (prepared before the capture) ending at %s:%d: its rows are in neither the snapshot nor the stream", g.file, g.pos, xids[0], cf, cp)
	}

	// 2. Committed between a position and the check: found in the binlog
	// after the position. An XA prepared and committed after the position
	// is not named.
	prepare(xids[1], 2)
	f0, p0 := end()
	resolve(fmt.Sprintf("XA COMMIT '%s'", xids[1]))
	prepare(xids[2], 3)
	resolve(fmt.Sprintf("XA COMMIT '%s'", xids[2]))
	open, err := r.xaAcross(ctx, f0, p0)
	if err != nil {
		t.Fatal(err)
	}
	if s := strings.Join(open, " "); !strings.Contains(s, hex(xids[1])) || strings.Contains(s, hex(xids[2])) {
		t.Errorf("XA transactions across %s:%d: %v, want %s (committed after the position, prepared before) and not %s (prepared after it)", f0, p0, open, hex(xids[1]), hex(xids[2]))
	}

	// 3. Prepared and never resolved: the capture fails naming it.
	prepare(xids[3], 4)
	defer func(w time.Duration) { xaCaptureWait = w }(xaCaptureWait)
	xaCaptureWait = time.Second
	_, err = r.Capture(ctx)
	if err == nil || !strings.Contains(err.Error(), hex(xids[3])) || !strings.Contains(err.Error(), "XA RECOVER") {
		t.Errorf("capture with %s prepared and unresolved: %v, want an error naming it and XA RECOVER", xids[3], err)
	}
	resolve(fmt.Sprintf("XA ROLLBACK '%s'", xids[3]))
}
