package binlog

import (
	"errors"
	"net"
	"testing"
	"time"
)

// TestDeadlineConn: a read that waits longer than the timeout fails with a
// timeout (within timeout×9/8 and some scheduling slack), and a connection
// whose answers keep coming does not, however long the whole result takes.
func TestDeadlineConn(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const timeout = 400 * time.Millisecond
	dial := func() (*deadlineConn, net.Conn) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(); s.Close() })
		return &deadlineConn{Conn: c, timeout: timeout}, s
	}

	// Answers every 50 ms for 3 timeouts: no read fails.
	c, s := dial()
	go func() {
		for i := 0; i < 24; i++ {
			time.Sleep(50 * time.Millisecond)
			if _, err := s.Write([]byte{byte(i)}); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 1)
	start := time.Now()
	for i := 0; i < 24; i++ {
		if _, err := c.Read(buf); err != nil {
			t.Fatalf("read %d after %v of steady answers: %v", i, time.Since(start), err)
		}
	}

	// Then silence: the read fails after the timeout, not before.
	start = time.Now()
	read := make(chan error, 1)
	go func() { _, err := c.Read(buf); read <- err }()
	select {
	case err = <-read:
	case <-time.After(5 * timeout):
		t.Fatalf("read of a silent connection still waits after %v (timeout %v)", time.Since(start), timeout)
	}
	took := time.Since(start)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read of a silent connection: %v, want a timeout", err)
	}
	if took < timeout-timeout/8 || took > timeout+timeout/8+300*time.Millisecond {
		t.Fatalf("silent read failed after %v, want about %v (at most ×9/8)", took, timeout)
	}
}
