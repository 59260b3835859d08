package harness

import (
	"bufio"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2/toxics"
)

// echoServer answers each line with tag + the line.
func echoServer(t *testing.T, tag string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(tag + line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// ask sends line through p and returns the answer, waiting at most wait.
func ask(t *testing.T, c net.Conn, line string, wait time.Duration) (string, error) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(wait))
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		return "", err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSuffix(got, "\n"), err
}

func dial(t *testing.T, p *FaultProxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// wedge holds the current toxiproxy's toxic lock for the rest of the test:
// the state toxiproxy#558 leaves a proxy in (the lock is never released).
func wedge(t *testing.T, p *FaultProxy) {
	p.mu.Lock()
	cur := p.cur
	p.mu.Unlock()
	cur.Toxics.Lock()
	t.Cleanup(cur.Toxics.Unlock)
	// A connection straight to it: its accept loop then waits for the
	// lock too, so it never finishes stopping (nor closes its links).
	c, err := net.Dial("tcp", cur.Listen)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
}

func toxicNames(p *FaultProxy) []string {
	p.mu.Lock()
	cur := p.cur
	p.mu.Unlock()
	var names []string
	for _, x := range cur.Toxics.GetToxicArray() {
		names = append(names, x.(*toxics.ToxicWrapper).Name)
	}
	return names
}

// returnsWithin fails the test when change does not return in time.
func returnsWithin(t *testing.T, d time.Duration, what string, change func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- change() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(d):
		t.Fatalf("%s on a wedged toxiproxy still waiting after %s", what, d)
	}
}

// A toxic change on a wedged toxiproxy returns, the change holds, the
// connections through the wedged one are closed and new ones work.
func TestFaultProxyReplacesWedgedToxiproxy(t *testing.T) {
	old := toxicChangeTimeout
	toxicChangeTimeout = 500 * time.Millisecond
	t.Cleanup(func() { toxicChangeTimeout = old })
	p, err := NewFaultProxy("wedge", echoServer(t, "a:"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if err := p.Add(Toxic{Name: "slow", Type: "latency", Attributes: map[string]any{"latency": 5000}}); err != nil {
		t.Fatal(err)
	}
	c1 := dial(t, p)
	if _, err := ask(t, c1, "one", 300*time.Millisecond); err == nil {
		t.Fatal("an answer came through a 5 s latency toxic within 300 ms")
	}

	wedge(t, p)
	returnsWithin(t, 10*time.Second, "remove toxic slow", func() error { return p.Remove("slow") })
	if p.Replaced() != 1 {
		t.Fatalf("replaced %d times, want 1", p.Replaced())
	}
	if names := toxicNames(p); len(names) != 0 {
		t.Fatalf("toxics after removing slow: %v", names)
	}
	_ = c1.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c1.Read(make([]byte, 64)); err == nil || errors.Is(err, syscall.ETIMEDOUT) || isTimeout(err) {
		t.Fatalf("a connection through the wedged toxiproxy is still open: read %v", err)
	}
	if got, err := ask(t, dial(t, p), "two", 3*time.Second); err != nil || got != "a:two" {
		t.Fatalf("through the new toxiproxy: %q, %v", got, err)
	}

	wedge(t, p)
	returnsWithin(t, 10*time.Second, "add toxic cut", func() error {
		return p.Add(Toxic{Name: "cut", Type: "timeout", Attributes: map[string]any{"timeout": 0}})
	})
	if names := toxicNames(p); p.Replaced() != 2 || len(names) != 1 || names[0] != "cut" {
		t.Fatalf("after adding cut to a wedged toxiproxy: replaced %d, toxics %v", p.Replaced(), names)
	}
	if got, err := ask(t, dial(t, p), "three", 500*time.Millisecond); err == nil {
		t.Fatalf("an answer %q came through the timeout toxic", got)
	}
	if err := p.Remove("cut"); err != nil {
		t.Fatal(err)
	}
	if got, err := ask(t, dial(t, p), "four", 3*time.Second); err != nil || got != "a:four" {
		t.Fatalf("after removing cut: %q, %v", got, err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// A reset_peer toxic's RST reaches the client through the forwarder;
// ResetAll closes open connections and keeps accepting; Retarget sends new
// connections to the new upstream.
func TestFaultProxyResetsAndRetargets(t *testing.T) {
	p, err := NewFaultProxy("reset", echoServer(t, "a:"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if err := p.Add(Toxic{Name: "rst", Type: "reset_peer", Attributes: map[string]any{"timeout": 0}}); err != nil {
		t.Fatal(err)
	}
	if got, err := ask(t, dial(t, p), "x", 3*time.Second); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("through reset_peer: %q, %v; want a connection reset", got, err)
	}
	if err := p.Add(Toxic{Name: "rst", Type: "latency"}); err == nil {
		t.Fatal("a second toxic named rst was accepted")
	}
	if err := p.Remove("rst"); err != nil {
		t.Fatal(err)
	}
	if err := p.Remove("rst"); err == nil {
		t.Fatal("removing a toxic twice succeeded")
	}

	b := echoServer(t, "b:")
	for _, step := range []struct {
		name, want string
		do         func() error
	}{
		{"ResetAll", "a:", p.ResetAll},
		{"Retarget", "b:", func() error { return p.Retarget(b) }},
	} {
		c := dial(t, p)
		if got, err := ask(t, c, "y", 3*time.Second); err != nil || !strings.HasSuffix(got, ":y") {
			t.Fatalf("before %s: %q, %v", step.name, got, err)
		}
		if err := step.do(); err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Read(make([]byte, 8)); err == nil || isTimeout(err) {
			t.Fatalf("after %s the connection is still open: %v", step.name, err)
		}
		if got, err := ask(t, dial(t, p), "z", 3*time.Second); err != nil || got != step.want+"z" {
			t.Fatalf("after %s: %q, %v; want %q", step.name, got, err, step.want+"z")
		}
	}
}
