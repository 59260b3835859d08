package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestSignalDuringStartUpStopsCleanly checks that SIGINT/SIGTERM while a
// daemon is still starting (here: its PostgreSQL target accepts the
// connection and never answers, so the start waits on it) is a clean stop,
// exit 0 and "stopped cleanly", as it is once the daemon runs, also while
// the connection is being retried; and that a start-up that fails on its
// own (the target refuses the password) still fails, exit 1 and "start
// failed". CI at b991b86 saw `tidemark run` exit 1
// with "start failed … context canceled" on a SIGTERM 3 ms after it started.
func TestSignalDuringStartUpStopsCleanly(t *testing.T) {
	for _, cmd := range []string{"run", "apply"} {
		for _, tt := range []struct {
			name     string
			mode     pgMode
			cancel   bool // the signal arrives during the start
			wantCode int
			want     string
		}{
			{"signal while the target does not answer", pgSilent, true, exitOK, "stopped cleanly"},
			{"signal while the connection is retried", pgHangUp, true, exitOK, "stopped cleanly"},
			{"target refuses the password", pgRefuse, false, exitFailed, "start failed"},
		} {
			t.Run(cmd+"/"+tt.name, func(t *testing.T) {
				addr, accepted := fakePostgres(t, tt.mode)
				path := filepath.Join(t.TempDir(), "tidemark.yaml")
				conf := fmt.Sprintf(`source:
  name: shop
  addr: 127.0.0.1:1
  user: tidemark
  password: pw
  server_id: 4242
  time_zone: Asia/Kolkata
target:
  postgres:
    dsn: postgres://tidemark:secret-canary@%s/tidemark?sslmode=disable
  kafka:
    brokers: [127.0.0.1:1]
    topic_prefix: shop.v1
    exactly_once: true
apply: {}
metrics:
  listen: "off"
`, addr)
				if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if tt.cancel {
					go func() {
						select {
						case <-accepted:
							time.Sleep(100 * time.Millisecond)
						case <-time.After(20 * time.Second):
						}
						cancel()
					}()
				}
				var stdout, stderr bytes.Buffer
				code := make(chan int, 1)
				go func() { code <- execute(ctx, newCommand(cmd, &stdout, &stderr), []string{"--config", path}, &stderr) }()
				var got int
				select {
				case got = <-code:
				case <-time.After(60 * time.Second):
					cancel()
					t.Fatalf("tidemark %s did not return in 60 s:\n%s", cmd, stderr.String())
				}
				out := stderr.String()
				if got != tt.wantCode || !strings.Contains(out, tt.want) {
					t.Fatalf("tidemark %s: exit %d, want %d with %q:\n%s", cmd, got, tt.wantCode, tt.want, out)
				}
				if tt.wantCode == exitOK && strings.Contains(out, "level=ERROR") {
					t.Fatalf("tidemark %s logged an error on a clean stop:\n%s", cmd, out)
				}
				if strings.Contains(out, "secret-canary") {
					t.Fatalf("the target's password is in the log:\n%s", out)
				}
			})
		}
	}
}

// pgMode is what fakePostgres does with a connection.
type pgMode int

const (
	pgSilent pgMode = iota // held open, no byte sent
	pgHangUp               // closed at once (a transient error: retried)
	pgRefuse               // the startup message answered with 28P01 (not retried)
)

// fakePostgres listens on a local port and treats each connection it
// accepts as mode says; accepted is closed at the first one.
func fakePostgres(t *testing.T, mode pgMode) (string, <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			once.Do(func() { close(accepted) })
			switch mode {
			case pgHangUp:
				c.Close()
				continue
			case pgRefuse:
				refusePassword(c)
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String(), accepted
}

// refusePassword reads a PostgreSQL startup message from c and answers it
// with the ErrorResponse of a wrong password (SQLSTATE 28P01).
func refusePassword(c net.Conn) {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	var n [4]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return
	}
	if _, err := io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(n[:]))-4); err != nil {
		return
	}
	var body []byte
	for _, f := range []string{"SFATAL", "VFATAL", "C28P01", "Mpassword authentication failed for user \"tidemark\""} {
		body = append(append(body, f...), 0)
	}
	body = append(body, 0)
	msg := binary.BigEndian.AppendUint32([]byte{'E'}, uint32(len(body)+4))
	_, _ = c.Write(append(msg, body...))
}
