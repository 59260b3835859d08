package postgres

import (
	"context"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"tidemark"
)

var _ tidemark.SourceLocker = (*Sink)(nil)

// sourceLockClass is the first key of the per-source advisory locks ("tm").
const sourceLockClass int32 = 0x746d

// sourceFenceClass is the first key of the per-source fences ("tmf"), an
// advisory lock beside the source's lock. The session holding the source's
// lock is not the one that commits: when it ends (a PostgreSQL restart,
// pg_terminate_backend) the lock is free at once, while the process goes
// on committing until its next lock check, and another process could take
// the lock, read the checkpoint and write beside it (nemesis soak seed
// 418263935268: the checkpoint moved back from 0-1001-5006 to 0-1001-4888).
// So every transaction of a process that took a source's lock takes the
// fence shared and then checks that no other session holds the source's
// lock (fence); a process that has just taken the lock takes the fence
// exclusively once before it reads anything (waitFence), which waits for
// the transactions of the former holder under way. A commit that found
// the lock free (its own session gone, not taken again yet) may land: the
// next holder waits for it and then reads it. One that finds the lock
// another session's fails with tidemark.ErrSourceLockLost; a session of
// this process (one its lock check takes the lock again on) is not
// another's (sourceLock.ours).
const sourceFenceClass int32 = 0x746d66

// fenceWait bounds how long a process that took the lock waits for the
// former holder's transactions (a hung one lasts until PostgreSQL notices
// its connection is gone).
const fenceWait = 30 * time.Second

// TryLockSource implements tidemark.SourceLocker with a session-level
// advisory lock on a connection taken out of the pool: it is held until
// release, or until that connection ends (a killed process loses it at
// once).
func (s *Sink) TryLockSource(ctx context.Context, source string) (func(), bool, error) {
	h := fnv.New32a()
	h.Write([]byte(source))
	key := int32(h.Sum32())
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("lock source %s: %w", source, redact(err, s.secret))
	}
	var ok bool
	var started time.Time
	if err := c.QueryRow(ctx, "SELECT pg_try_advisory_lock($1, $2), (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid())",
		sourceLockClass, key).Scan(&ok, &started); err != nil {
		c.Release()
		return nil, false, fmt.Errorf("lock source %s: %w", source, redact(err, s.secret))
	}
	if !ok {
		c.Release()
		return nil, false, nil
	}
	if waited, err := s.waitFence(ctx, c.Conn(), key); err != nil || !waited {
		// Closing the session frees the lock again.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		_ = c.Conn().Close(cctx)
		cancel()
		c.Release()
		if err != nil {
			return nil, false, fmt.Errorf("lock source %s: %w", source, redact(err, s.secret))
		}
		s.log.Warn("took the source lock, but a transaction of the process that held it before is still under way: trying again", "source", source, "waited", fenceWait)
		return nil, false, nil
	}
	l := &sourceLock{conn: c.Hijack(), key: key}
	l.setIdent(l.conn.PgConn().PID(), started)
	s.lockMu.Lock()
	if s.locks == nil {
		s.locks = map[string]*sourceLock{}
	}
	s.locks[source] = l
	s.lockMu.Unlock()
	release := func() {
		s.lockMu.Lock()
		if s.locks[source] == l {
			delete(s.locks, source)
		}
		s.lockMu.Unlock()
		l.mu.Lock()
		defer l.mu.Unlock()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		_ = l.conn.Close(cctx) // ends the session, which releases the lock
	}
	return release, true, nil
}

// sourceLock is the session holding a source's lock.
type sourceLock struct {
	mu   sync.Mutex // the connection is used by one caller at a time
	conn *pgx.Conn
	key  int32
	// The session's backend process and its start: a pid alone may have
	// been reused by another session since. idMu guards them apart from
	// mu: a commit's fence reads them while a lock check may wait on the
	// connection.
	idMu    sync.Mutex
	pid     uint32
	started time.Time
	// ours are the sessions of this process that took the lock or asked
	// for it again (retakeLock), each recorded before it asked, the newest
	// last (at most maxOurSessions). The lock held by one of them is held
	// by no other process: a commit's fence that finds one holding it
	// after its own session ended takes it for this process's, not
	// another's (nemesis soak seed 1013731449905: the commit's check found
	// the session its lock check had just taken the lock again on).
	ours []lockSession
}

// lockSession is a backend session: its pid and its start.
type lockSession struct {
	pid     uint32
	started time.Time
}

// maxOurSessions bounds sourceLock.ours. A transaction holds the fence
// shared from before its check, and a lock check that took the lock again
// waits for it (waitFence) before it returns and the next one may begin:
// a session a transaction finds holding the lock is one of the last two.
const maxOurSessions = 8

func (l *sourceLock) setIdent(pid uint32, started time.Time) {
	l.idMu.Lock()
	defer l.idMu.Unlock()
	l.pid, l.started = pid, started
	l.addOursLocked(lockSession{pid, started})
}

// addOurs records a session of this process before it asks for the lock.
func (l *sourceLock) addOurs(id lockSession) {
	l.idMu.Lock()
	defer l.idMu.Unlock()
	l.addOursLocked(id)
}

func (l *sourceLock) addOursLocked(id lockSession) {
	if n := len(l.ours); n > 0 && l.ours[n-1] == id {
		return
	}
	l.ours = append(l.ours, id)
	if n := len(l.ours); n > maxOurSessions {
		l.ours = append(l.ours[:0], l.ours[n-maxOurSessions:]...)
	}
}

// isOurs says whether the backend pid that started at started (nil: not
// known, as a holder missing from pg_stat_activity) is one of ours.
func (l *sourceLock) isOurs(pid uint32, started *time.Time) bool {
	l.idMu.Lock()
	defer l.idMu.Unlock()
	for _, o := range l.ours {
		if o.pid == pid && (started == nil || started.Equal(o.started)) {
			return true
		}
	}
	return false
}

func (l *sourceLock) ident() (uint32, time.Time) {
	l.idMu.Lock()
	defer l.idMu.Unlock()
	return l.pid, l.started
}

// waitFence takes the source's fence exclusively and frees it again on
// conn, the session that has just taken the source's lock: the former
// holder's transactions under way end first (sourceFenceClass). waited is
// false when they did not end within fenceWait.
func (s *Sink) waitFence(ctx context.Context, conn *pgx.Conn, key int32) (waited bool, err error) {
	wctx, cancel := context.WithTimeout(ctx, fenceWait)
	defer cancel()
	_, err = conn.Exec(wctx, "SELECT pg_advisory_lock($1, $2), pg_advisory_unlock($1, $2)", sourceFenceClass, key)
	if err != nil && ctx.Err() == nil && wctx.Err() != nil {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("wait for the former holder's transactions: %w", err)
	}
	return true, nil
}

// fencedExec runs fn on the pool, or, when this process took source's
// lock, in a transaction that passes the fence first: a table state or a
// target reset of a process whose lock another session holds now is not
// written (nemesis soak seed 1096574813796: the tailer that had lost the
// lock quarantined t0 for the standby that had taken over).
func (s *Sink) fencedExec(ctx context.Context, source string, fn func(q querier) error) error {
	s.lockMu.Lock()
	held := s.locks[source] != nil
	s.lockMu.Unlock()
	if !held {
		return fn(querier{s.pool})
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := s.fence(ctx, tx, source); err != nil {
			return err
		}
		return fn(querier{tx})
	})
}

// fence is the check of every transaction of a batch, DDL, table state
// or target reset of a source whose lock this process took (sourceFenceClass): it takes the fence
// shared for the transaction, then fails with tidemark.ErrSourceLockLost
// when another session holds the source's lock. Nothing when this process
// did not take the lock (an applier, tidemark catchup, a test).
func (s *Sink) fence(ctx context.Context, tx pgx.Tx, source string) error {
	s.lockMu.Lock()
	l := s.locks[source]
	s.lockMu.Unlock()
	if l == nil {
		return nil
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock_shared($1, $2)", sourceFenceClass, l.key); err != nil {
		return fmt.Errorf("take the fence of source %s: %w", source, err)
	}
	if s.hookFenced != nil {
		s.hookFenced()
	}
	rows, _ := tx.Query(ctx, `SELECT k.pid, a.backend_start FROM pg_locks k LEFT JOIN pg_stat_activity a ON a.pid = k.pid
	WHERE k.locktype = 'advisory' AND k.classid::bigint = $1 AND k.objid::bigint = $2 AND k.objsubid = 2 AND k.granted`,
		int64(uint32(sourceLockClass)), int64(uint32(l.key)))
	holders, err := pgx.CollectRows(rows, pgx.RowToStructByPos[lockHolder])
	if err != nil {
		return fmt.Errorf("check the lock of source %s: %w", source, err)
	}
	// Asked after the holders were read: a session of this process seen
	// holding the lock was recorded before it asked for it.
	other := false
	for _, h := range holders {
		other = other || !l.isOurs(h.PID, h.Started)
	}
	if other {
		return fmt.Errorf("commit for source %s: %w: another session holds it now (this process's lock session ended); nothing of this transaction is committed", source, tidemark.ErrSourceLockLost)
	}
	return nil
}

// lockHolder is a session holding a source's lock (fence); Started is nil
// when pg_stat_activity no longer showed it.
type lockHolder struct {
	PID     uint32
	Started *time.Time
}

// retakeLock tries to take l's lock on conn and returns the new session's
// start. The session is one of l's own (ours) before it asks for the lock.
// A lock still held by l's own earlier session (one this process can no
// longer reach, on a half-open connection the server has not noticed yet)
// is freed first by ending that session.
func (s *Sink) retakeLock(ctx context.Context, conn *pgx.Conn, l *sourceLock) (bool, time.Time, error) {
	var ok bool
	var started time.Time
	if err := conn.QueryRow(ctx, "SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()").Scan(&started); err != nil {
		return false, started, err
	}
	l.addOurs(lockSession{conn.PgConn().PID(), started})
	lock := "SELECT pg_try_advisory_lock($1, $2)"
	if err := conn.QueryRow(ctx, lock, sourceLockClass, l.key).Scan(&ok); err != nil {
		return false, started, err
	}
	if !ok {
		pid, was := l.ident()
		var ended bool
		err := conn.QueryRow(ctx, `SELECT coalesce(bool_or(pg_terminate_backend(a.pid, 5000)), false)
	FROM pg_locks k JOIN pg_stat_activity a ON a.pid = k.pid
	WHERE k.locktype = 'advisory' AND k.classid::bigint = $1 AND k.objid::bigint = $2 AND k.objsubid = 2 AND k.granted
	AND k.pid = $3 AND a.backend_start = $4`,
			int64(uint32(sourceLockClass)), int64(uint32(l.key)), int64(pid), was).Scan(&ended)
		if err != nil || !ended {
			return false, started, err
		}
		if err := conn.QueryRow(ctx, lock, sourceLockClass, l.key).Scan(&ok); err != nil || !ok {
			return false, started, err
		}
	}
	return true, started, nil
}

var _ tidemark.SourceLockChecker = (*Sink)(nil)

// CheckSourceLock implements tidemark.SourceLockChecker: the session that
// took the lock still answers and still holds it (pg_locks). When that
// session has ended (a PostgreSQL restart, pg_terminate_backend,
// idle_session_timeout) the lock is taken again on a new session if it is
// free (retaken); held by another session, it is lost
// (tidemark.ErrSourceLockLost). A server that does not answer is neither.
func (s *Sink) CheckSourceLock(ctx context.Context, source string) (bool, error) {
	s.lockMu.Lock()
	l := s.locks[source]
	s.lockMu.Unlock()
	if l == nil {
		return false, fmt.Errorf("check lock of source %s: %w: not held by this process", source, tidemark.ErrSourceLockLost)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var held bool
	// An advisory lock on two int4 keys is classid = key1, objid = key2
	// (their bits as oids), objsubid = 2.
	err := l.conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()
	AND classid::bigint = $1 AND objid::bigint = $2 AND objsubid = 2 AND granted)`,
		int64(uint32(sourceLockClass)), int64(uint32(l.key))).Scan(&held)
	if err == nil && held {
		return false, nil
	}
	gone := "the lock's session no longer holds it"
	if err != nil {
		gone = "the lock's session is gone: " + redact(err, s.secret).Error()
	}
	// Take it again on a new session; the old one is closed (if it still
	// lives, closing it frees nothing this process still needs).
	c, aerr := s.pool.Acquire(ctx)
	if aerr != nil {
		return false, fmt.Errorf("check lock of source %s: %s; take it again: %w", source, gone, redact(aerr, s.secret))
	}
	ok, started, qerr := s.retakeLock(ctx, c.Conn(), l)
	if qerr != nil {
		c.Release()
		return false, fmt.Errorf("check lock of source %s: %s; take it again: %w", source, gone, redact(qerr, s.secret))
	}
	if !ok {
		c.Release()
		return false, fmt.Errorf("check lock of source %s: %w: %s, and another session holds it now", source, tidemark.ErrSourceLockLost, gone)
	}
	// Another process may have held it meanwhile: its transactions under
	// way end before the caller proves from the checkpoint that nobody
	// else wrote.
	if waited, werr := s.waitFence(ctx, c.Conn(), l.key); werr != nil || !waited {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		_ = c.Conn().Close(cctx) // frees the lock taken again
		cancel()
		c.Release()
		if werr == nil {
			werr = fmt.Errorf("a transaction of another session is still under way after %s", fenceWait)
		}
		return false, fmt.Errorf("check lock of source %s: %s; took it again, but: %w", source, gone, redact(werr, s.secret))
	}
	old := l.conn
	l.conn = c.Hijack()
	l.setIdent(l.conn.PgConn().PID(), started)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_ = old.Close(cctx)
	return true, nil
}
