package binlog

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/client"

	"tidemark"
	"tidemark/internal/testenv"
)

// TestCaptureSeesEverythingBeforeIt provokes the group-commit window: a
// transaction is in the binlog (and in @@gtid_binlog_pos) before its rows
// are visible to a new read. A capture taken in that window promises a
// position whose transactions the catch-up's reads then miss, and the binlog
// resumes after them: the rows are lost. Many concurrent writers and a
// widened group commit (binlog_commit_wait_count/usec, sync_binlog=1) make
// the window wide; each round captures, reads the table at once, and every
// row whose GTID is at or before the captured one must be in the read.
func TestCaptureSeesEverythingBeforeIt(t *testing.T) {
	addr, user, pass, c := testServer(t)
	db := testenv.Name("cap_")
	exec(t, c, "CREATE DATABASE "+db)
	t.Cleanup(func() { _, _ = c.Execute("DROP DATABASE " + db) })
	exec(t, c, "USE "+db, "CREATE TABLE g (id BIGINT PRIMARY KEY, w INT) ENGINE=InnoDB")

	// Widen the window between the binlog write and the engine commit.
	r0, err := c.Execute("SELECT @@global.binlog_commit_wait_count, @@global.binlog_commit_wait_usec, @@global.sync_binlog")
	if err != nil {
		t.Fatal(err)
	}
	wc, _ := r0.GetInt(0, 0)
	wu, _ := r0.GetInt(0, 1)
	sb, _ := r0.GetInt(0, 2)
	t.Cleanup(func() {
		_, _ = c.Execute(fmt.Sprintf("SET GLOBAL binlog_commit_wait_count = %d, GLOBAL binlog_commit_wait_usec = %d, GLOBAL sync_binlog = %d", wc, wu, sb))
	})
	exec(t, c, "SET GLOBAL binlog_commit_wait_count = 4, GLOBAL binlog_commit_wait_usec = 2000, GLOBAL sync_binlog = 1")

	const writers = 24
	type written struct{ id, seq uint64 }
	var mu sync.Mutex
	var done []written
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			wc, err := client.Connect(addr, user, pass, db)
			if err != nil {
				errs <- err
				return
			}
			defer wc.Close()
			for i := 0; ctx.Err() == nil; i++ {
				id := uint64(w)<<32 | uint64(i)
				if _, err := wc.Execute("INSERT INTO g VALUES (?, ?)", id, w); err != nil {
					errs <- err
					return
				}
				res, err := wc.Execute("SELECT @@last_gtid")
				if err != nil {
					errs <- err
					return
				}
				s, _ := res.GetString(0, 0)
				set, err := tidemark.ParseMariaDBGTIDSet(s)
				if err != nil || len(set) != 1 {
					errs <- fmt.Errorf("last_gtid %q: %v", s, err)
					return
				}
				for _, g := range set {
					mu.Lock()
					done = append(done, written{id, g.Seq})
					mu.Unlock()
				}
			}
		}(w)
	}

	r, err := NewReader(Config{Name: "test", Addr: addr, User: user, Password: pass, ServerID: 1, Include: []string{db + ".*"}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	id := tidemark.TableID{Database: db, Name: "g"}
	type round struct {
		seq  uint64
		seen map[uint64]bool
	}
	var rounds []round
	var captureTime time.Duration
	// 150 rounds, or 6 s of them (a capture that waits for the binlog scan
	// takes longer).
	stop := time.Now().Add(6 * time.Second)
	for i := 0; i < 150 && time.Now().Before(stop); i++ {
		t0 := time.Now()
		snap, err := r.Capture(ctx)
		captureTime += time.Since(t0)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[uint64]bool{}
		req := tidemark.ReadRequest{Table: id, Limit: 1 << 20, Snapshot: snap}
		res, err := r.Read(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		for _, ch := range res.Changes {
			seen[uint64(ch.After[0].(int64))] = true
		}
		rounds = append(rounds, round{snap.Version.Seq, seen})
	}
	cancel()
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	lostRounds, lost := 0, 0
	for _, rd := range rounds {
		n := 0
		for _, w := range done {
			if w.seq < rd.seq && !rd.seen[w.id] { // the version is just above the last transaction seen
				n++
			}
		}
		if n > 0 {
			lostRounds++
			lost += n
		}
	}
	t.Logf("capture: %s on average; %d of %d needed BINLOG_GTID_POS", captureTime/time.Duration(len(rounds)), r.gtidScans.Load(), len(rounds))
	t.Logf("%d rounds, %d rows written; %d rounds missed %d rows at or before their captured position", len(rounds), len(done), lostRounds, lost)
	if lost > 0 {
		t.Fatalf("%d of %d captures promised a position whose rows the read that followed did not see (%d rows would be lost)", lostRounds, len(rounds), lost)
	}
}

// TestCaptureWithoutWritesNeedsNoScan: when nothing is written to the binlog
// during the capture, the GTID state is read, not computed by
// BINLOG_GTID_POS (which scans the binlog file up to the position: a catch-up
// of a few rows took 100-170 ms on a large file), and it is exactly the
// state BINLOG_GTID_POS gives for the captured position. Tests of other
// packages write to the same server at the same time (make test runs them
// in parallel), so a capture counts as quiet only when the binlog end was
// the captured position both before and after it; three quiet captures
// must need no scan.
func TestCaptureWithoutWritesNeedsNoScan(t *testing.T) {
	addr, user, pass, c := testServer(t)
	db := testenv.Name("capnoscan_")
	exec(t, c, "CREATE DATABASE "+db)
	t.Cleanup(func() { _, _ = c.Execute("DROP DATABASE " + db) })
	exec(t, c, "USE "+db, "CREATE TABLE g (id BIGINT PRIMARY KEY)")
	r, err := NewReader(Config{Name: "test", Addr: addr, User: user, Password: pass, ServerID: 1, Include: []string{db + ".*"}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	end := func() string {
		res, err := c.Execute("SHOW MASTER STATUS")
		if err != nil {
			t.Fatal(err)
		}
		f, _ := res.GetString(0, 0)
		p, _ := res.GetInt(0, 1)
		return fmt.Sprintf("%s:%d", f, p)
	}
	ctx := context.Background()
	quiet := 0
	for i := 0; quiet < 3; i++ {
		if i == 50 {
			t.Fatalf("%d quiet captures of 50: other writers never left the server idle for a capture", quiet)
		}
		before, scans := end(), r.gtidScans.Load()
		snap, err := r.Capture(ctx)
		if err != nil {
			t.Fatal(err)
		}
		at := fmt.Sprintf("%s:%d", snap.Position.File, snap.Position.Offset)
		if after := end(); before == at && after == at {
			quiet++
			if n := r.gtidScans.Load() - scans; n != 0 {
				t.Fatalf("capture %d on a quiet server (binlog end %s before and after) scanned the binlog with BINLOG_GTID_POS", i, at)
			}
		}
		res, err := c.Execute("SELECT BINLOG_GTID_POS(?, ?)", snap.Position.File, snap.Position.Offset)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := res.GetString(0, 0)
		if snap.Position.GTID != want {
			t.Fatalf("capture %d: GTID %q at %s:%d, BINLOG_GTID_POS says %q", i, snap.Position.GTID, snap.Position.File, snap.Position.Offset, want)
		}
		exec(t, c, fmt.Sprintf("INSERT INTO g VALUES (%d)", i))
	}
}
