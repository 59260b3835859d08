package binlog

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// TestReadWatch: the set-up deadline is lifted once the stream starts (an
// idle but healthy connection is not cut), and a tailer waiting for an
// event longer than the timeout gets its read failed with a timeout.
func TestReadWatch(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	const timeout = 300 * time.Millisecond
	w := newReadWatch(timeout)
	c, err := w.dial(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	server := <-accepted
	defer server.Close()

	// Started: no deadline, and not waiting (back-pressure) never counts.
	w.started()
	w.waiting.Store(false)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.run(ctx); close(done) }()
	read := make(chan error, 1)
	go func() {
		buf := make([]byte, 1)
		_, err := c.Read(buf)
		read <- err
	}()
	select {
	case err := <-read:
		t.Fatalf("read ended after the stream started, with no deadline expected: %v", err)
	case <-time.After(3 * timeout):
	}
	if _, err := server.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	if err := <-read; err != nil {
		t.Fatalf("read after data: %v", err)
	}

	// Waiting with no event: the read fails with a timeout.
	w.waiting.Store(true)
	start := time.Now()
	go func() {
		buf := make([]byte, 1)
		_, err := c.Read(buf)
		read <- err
	}()
	select {
	case err := <-read:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read ended with %v, want a deadline error", err)
		}
		// The watch ticks every timeout/8: it fires within a tick of the
		// timeout.
		if took := time.Since(start); took < timeout*7/8 || took > 10*timeout {
			t.Fatalf("timed out after %s; timeout %s", took, timeout)
		}
	case <-time.After(20 * timeout):
		t.Fatal("a waiting read was never timed out")
	}
	if got := w.explain(errors.New("i/o timeout")); got.Error() == "i/o timeout" {
		t.Fatal("explain did not name the read timeout")
	}
	cancel()
	<-done
}
