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
	l := &sourceLock{conn: c.Hijack(), key: key, started: started}
	l.pid = l.conn.PgConn().PID()
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
	// been reused by another session since.
	pid     uint32
	started time.Time
}

// retakeLock tries to take l's lock on conn. A lock still held by l's own
// earlier session (one this process can no longer reach, on a half-open
// connection the server has not noticed yet) is freed first by ending that
// session.
func (s *Sink) retakeLock(ctx context.Context, conn *pgx.Conn, l *sourceLock) (bool, error) {
	var ok bool
	var started time.Time
	lock := "SELECT pg_try_advisory_lock($1, $2), (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid())"
	if err := conn.QueryRow(ctx, lock, sourceLockClass, l.key).Scan(&ok, &started); err != nil {
		return false, err
	}
	if !ok {
		var ended bool
		err := conn.QueryRow(ctx, `SELECT coalesce(bool_or(pg_terminate_backend(a.pid, 5000)), false)
	FROM pg_locks k JOIN pg_stat_activity a ON a.pid = k.pid
	WHERE k.locktype = 'advisory' AND k.classid::bigint = $1 AND k.objid::bigint = $2 AND k.objsubid = 2 AND k.granted
	AND k.pid = $3 AND a.backend_start = $4`,
			int64(uint32(sourceLockClass)), int64(uint32(l.key)), int64(l.pid), l.started).Scan(&ended)
		if err != nil || !ended {
			return false, err
		}
		if err := conn.QueryRow(ctx, lock, sourceLockClass, l.key).Scan(&ok, &started); err != nil || !ok {
			return false, err
		}
	}
	l.started = started
	return true, nil
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
	ok, qerr := s.retakeLock(ctx, c.Conn(), l)
	if qerr != nil {
		c.Release()
		return false, fmt.Errorf("check lock of source %s: %s; take it again: %w", source, gone, redact(qerr, s.secret))
	}
	if !ok {
		c.Release()
		return false, fmt.Errorf("check lock of source %s: %w: %s, and another session holds it now", source, tidemark.ErrSourceLockLost, gone)
	}
	old := l.conn
	l.conn = c.Hijack()
	l.pid = l.conn.PgConn().PID()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_ = old.Close(cctx)
	return true, nil
}
