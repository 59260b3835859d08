package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"tidemark"
	"tidemark/internal/testenv"
)

// sameTarget opens a second sink (another process) on e's target and
// control state.
func sameTarget(t *testing.T, e *env) *Sink {
	t.Helper()
	cfg := e.sink.cfg
	s, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// lockedEnv is a sink that holds the lock of source "s" and has
// committed checkpoint gtid(1) with one row of table name.
func lockedEnv(t *testing.T, name string) (*env, *tidemark.Table) {
	t.Helper()
	e := newEnv(t)
	tbl := simpleTable(name)
	release, ok, err := e.sink.TryLockSource(context.Background(), "s")
	if err != nil || !ok {
		t.Fatalf("lock: %t %v", ok, err)
	}
	t.Cleanup(release)
	e.apply(&tidemark.Batch{Source: "s", Checkpoint: gtid(1), Changes: []tidemark.Change{ins(tbl, v(1, 1), int64(1), "a", nil)}})
	return e, tbl
}

// endLockSession ends the session that holds s's lock of source (as a
// PostgreSQL restart or pg_terminate_backend does).
func endLockSession(t *testing.T, e *env, s *Sink, source string) {
	t.Helper()
	ctx := context.Background()
	s.lockMu.Lock()
	pid := s.locks[source].pid
	s.lockMu.Unlock()
	var ok bool
	if err := e.conn.QueryRow(ctx, "SELECT pg_terminate_backend($1, 5000)", int64(pid)).Scan(&ok); err != nil || !ok {
		t.Fatalf("terminate the lock's session %d: %t %v", pid, ok, err)
	}
}

// TestCommitAfterAnotherTookTheLock is nemesis soak seed 418263935268 at
// the sink: the standby's lock session ended (a PostgreSQL restart), the
// tailer took the free lock and read the checkpoint, and the standby,
// whose lock check had not run again yet, still committed a batch: two
// writers, and the tailer's first commit moved the checkpoint back
// (0-1001-5006 to 0-1001-4888, the I4 monitor). A commit of a process
// whose lock another session holds now must fail with
// tidemark.ErrSourceLockLost and leave the checkpoint as the new holder
// read it; while nobody holds the lock (the session ended, not taken
// again yet) commits go on, as they did.
func TestCommitAfterAnotherTookTheLock(t *testing.T) {
	ctx := context.Background()
	e, tbl := lockedEnv(t, "fence")

	endLockSession(t, e, e.sink, "s")
	// Nobody holds the lock: this process goes on (its lock check takes
	// the lock again and proves it).
	e.apply(&tidemark.Batch{Source: "s", Checkpoint: gtid(2), Changes: []tidemark.Change{ins(tbl, v(2, 1), int64(2), "b", nil)}})

	// The server frees the ended session's lock a moment later.
	other := sameTarget(t, e)
	var release2 func()
	var ok bool
	var err error
	if !testenv.WaitFor(30*time.Second, func() bool {
		release2, ok, err = other.TryLockSource(ctx, "s")
		return err != nil || ok
	}) || err != nil {
		t.Fatalf("the other process could not take the free lock: %v", err)
	}
	defer release2()
	read, _, err := other.Checkpoint(ctx, "s")
	if err != nil || read != gtid(2) {
		t.Fatalf("the other process read checkpoint %v, %v; want %v", read, err, gtid(2))
	}

	_, err = e.sink.Apply(ctx, &tidemark.Batch{Source: "s", Checkpoint: gtid(3), Changes: []tidemark.Change{ins(tbl, v(3, 1), int64(3), "c", nil)}})
	if !errors.Is(err, tidemark.ErrSourceLockLost) {
		t.Errorf("commit after another process took the lock: %v; want ErrSourceLockLost", err)
	}
	if pos, _ := e.checkpoint("s"); pos != gtid(2) {
		t.Errorf("checkpoint %v after the other process took the lock at %v", pos, gtid(2))
	}
	if got := e.rows("SELECT id FROM " + e.table("fence") + " ORDER BY id"); len(got) != 2 {
		t.Errorf("rows %v; want 1 and 2", got)
	}
	err = e.sink.ApplyDDL(ctx, "s", nil, gtid(4))
	if !errors.Is(err, tidemark.ErrSourceLockLost) {
		t.Errorf("DDL commit after another process took the lock: %v; want ErrSourceLockLost", err)
	}
	if pos, _ := e.checkpoint("s"); pos != gtid(2) {
		t.Errorf("checkpoint %v after a DDL commit of the process that lost the lock", pos)
	}
	// Nor table states (nemesis soak seed 1096574813796: the tailer that
	// had lost the lock quarantined t0 for the standby, whose DROP and
	// CREATE of t0 its batch of the older layout no longer fit), nor a
	// reset of a target table.
	err = e.sink.SetTableState(ctx, "s", tidemark.TableState{Table: tbl.ID, Mode: tidemark.TableQuarantined, Reason: "older layout"})
	if !errors.Is(err, tidemark.ErrSourceLockLost) {
		t.Errorf("table state recorded after another process took the lock: %v; want ErrSourceLockLost", err)
	}
	if states, err := other.TableStates(ctx, "s"); err != nil || len(states) != 0 {
		t.Errorf("states %+v, %v; want none", states, err)
	}
	if _, err := e.sink.SwapTableState(ctx, "s", tidemark.TableStreaming, tidemark.TableState{Table: tbl.ID, Mode: tidemark.TableQuarantined}); !errors.Is(err, tidemark.ErrSourceLockLost) {
		t.Errorf("table state swapped after another process took the lock: %v; want ErrSourceLockLost", err)
	}
	if err := e.sink.ResetTable(ctx, "s", tbl.ID); !errors.Is(err, tidemark.ErrSourceLockLost) {
		t.Errorf("target table reset after another process took the lock: %v; want ErrSourceLockLost", err)
	}
	if has, err := other.HasTable(ctx, tbl.ID); err != nil || !has {
		t.Errorf("the target table after a reset by the process that lost the lock: exists %t, %v", has, err)
	}
}

// TestLockWaitsForTheFormerHoldersCommit: a batch of the process whose
// lock session ended that is already in its transaction when another
// process takes the lock commits before the new holder reads the
// checkpoint (so the new holder starts after it, not before).
func TestLockWaitsForTheFormerHoldersCommit(t *testing.T) {
	ctx := context.Background()
	e, tbl := lockedEnv(t, "fencewait")

	inTx, proceed := make(chan struct{}), make(chan struct{})
	e.sink.hookBeforeCommit = func(ctx context.Context, tx pgx.Tx) error {
		close(inTx)
		<-proceed
		return nil
	}
	applied := make(chan error, 1)
	go func() {
		_, err := e.sink.Apply(ctx, &tidemark.Batch{Source: "s", Checkpoint: gtid(2), Changes: []tidemark.Change{ins(tbl, v(2, 1), int64(2), "b", nil)}})
		applied <- err
	}()
	<-inTx
	endLockSession(t, e, e.sink, "s")
	other := sameTarget(t, e)
	type taken struct {
		release func()
		read    tidemark.Position
	}
	locked := make(chan taken, 1)
	go func() {
		for {
			r, ok, err := other.TryLockSource(ctx, "s")
			if err != nil {
				t.Errorf("the other process's lock: %v", err)
				locked <- taken{}
				return
			}
			if ok {
				// As a pipeline does: the checkpoint right after the lock.
				read, _, err := other.Checkpoint(ctx, "s")
				if err != nil {
					t.Errorf("the other process's checkpoint: %v", err)
				}
				locked <- taken{r, read}
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	// Until the other process has the lock, or waits in PostgreSQL for
	// the commit in flight; then that commit goes on.
	var got *taken
	if !testenv.WaitFor(30*time.Second, func() bool {
		select {
		case tk := <-locked:
			got = &tk
			return true
		default:
		}
		var waiting bool
		_ = e.conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted)").Scan(&waiting)
		return waiting
	}) {
		t.Fatal("the other process neither took the lock nor waited for it")
	}
	close(proceed)
	if err := <-applied; err != nil {
		t.Fatalf("the commit in flight: %v", err)
	}
	if got == nil {
		tk := <-locked
		got = &tk
	}
	if got.release == nil {
		return
	}
	defer got.release()
	if got.read != gtid(2) {
		t.Errorf("the new holder read checkpoint %v; want %v (the commit in flight when it took the lock)", got.read, gtid(2))
	}
}

// TestCommitWhileTheLockIsRetaken is nemesis soak seed 1013731449905: after
// a PostgreSQL restart ended the lock's session, a commit had taken the
// fence when the lock check of the same process took the lock again on a
// new session; the commit's check found that new session holding the lock,
// took it for another process's and failed ("lost the source lock: another
// session holds it now"), and the tailer stopped. The process's own new
// session is its own: the commit lands, and the check proves it (the
// checkpoint is this process's).
func TestCommitWhileTheLockIsRetaken(t *testing.T) {
	ctx := context.Background()
	e, tbl := lockedEnv(t, "fenceretake")

	fenced, proceed := make(chan struct{}), make(chan struct{})
	e.sink.hookFenced = func() {
		close(fenced)
		<-proceed
	}
	endLockSession(t, e, e.sink, "s")
	applied := make(chan error, 1)
	go func() {
		_, err := e.sink.Apply(ctx, &tidemark.Batch{Source: "s", Checkpoint: gtid(2), Changes: []tidemark.Change{ins(tbl, v(2, 1), int64(2), "b", nil)}})
		applied <- err
	}()
	<-fenced
	e.sink.hookFenced = nil
	type checked struct {
		retaken bool
		err     error
	}
	check := make(chan checked, 1)
	go func() {
		retaken, err := e.sink.CheckSourceLock(ctx, "s")
		check <- checked{retaken, err}
	}()
	// The check has taken the lock again on a new session when it waits
	// for the fence, which the commit holds shared.
	if !testenv.WaitFor(30*time.Second, func() bool {
		var waiting bool
		_ = e.conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND classid::bigint = $1 AND NOT granted)",
			int64(uint32(sourceFenceClass))).Scan(&waiting)
		return waiting
	}) {
		t.Fatal("the lock check did not take the lock again and wait for the fence")
	}
	close(proceed)
	if err := <-applied; err != nil {
		t.Errorf("the commit while this process took its lock again: %v", err)
	}
	if c := <-check; c.err != nil || !c.retaken {
		t.Errorf("the lock check: retaken %t, %v; want taken again", c.retaken, c.err)
	}
	if pos, _ := e.checkpoint("s"); pos != gtid(2) {
		t.Errorf("checkpoint %v; want %v", pos, gtid(2))
	}
}
