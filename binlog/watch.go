package binlog

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// readWatch is the replication connection's read timeout. go-mysql's own
// ReadTimeout sets a socket deadline before every packet; this sets one
// deadline for the connection's set-up (handshake, registration, start of
// the dump) and then watches the stream from one goroutine: when the tailer
// has waited for its next event longer than the timeout — heartbeats arrive
// every Heartbeat on an idle source — it expires the socket's read deadline,
// and go-mysql's read fails with the same i/o timeout as before. Time the
// tailer spends not asking (back-pressure from the sink) never counts.
type readWatch struct {
	timeout time.Duration
	waiting atomic.Bool   // the tailer is blocked in GetEvent
	events  atomic.Uint64 // GetEvent returns

	mu      sync.Mutex
	conn    net.Conn // the replication connection (the first one dialed)
	expired bool
}

func newReadWatch(timeout time.Duration) *readWatch {
	w := &readWatch{timeout: timeout}
	w.waiting.Store(true) // set-up counts as waiting
	return w
}

// dial is go-mysql's Dialer: it keeps the replication connection and gives
// it a deadline for its set-up. Later connections (go-mysql's KILL of the
// old one at close) get the same deadline and are not watched.
func (w *readWatch) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	if w.timeout > 0 {
		_ = c.SetDeadline(time.Now().Add(w.timeout))
	}
	w.mu.Lock()
	if w.conn == nil {
		w.conn = c
	}
	w.mu.Unlock()
	return c, nil
}

// started lifts the set-up deadline: from now on run watches the stream.
func (w *readWatch) started() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conn != nil && !w.expired {
		_ = w.conn.SetDeadline(time.Time{})
	}
}

// run expires the connection's read deadline when the tailer has waited
// for an event longer than the timeout. It returns when ctx is done.
func (w *readWatch) run(ctx context.Context) {
	if w.timeout <= 0 {
		return
	}
	tick := max(w.timeout/8, 10*time.Millisecond)
	t := time.NewTicker(tick)
	defer t.Stop()
	// idle counts from the first tick that sees the tailer waiting with
	// no new event, so the timeout fires between timeout and timeout+tick
	// after the wait began — never early.
	const notIdle = -1
	last, idle := w.events.Load(), time.Duration(notIdle)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n := w.events.Load()
		if n != last || !w.waiting.Load() {
			last, idle = n, notIdle
			continue
		}
		if idle == notIdle {
			idle = 0
			continue
		}
		if idle += tick; idle < w.timeout {
			continue
		}
		w.mu.Lock()
		if w.conn != nil {
			w.expired = true
			_ = w.conn.SetReadDeadline(time.Now())
		}
		w.mu.Unlock()
		return
	}
}

// explain names the read timeout in an error it caused.
func (w *readWatch) explain(err error) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.expired {
		return err
	}
	return fmt.Errorf("no binlog event or heartbeat for %s (read_timeout; a half-open connection?): %w", w.timeout, err)
}
