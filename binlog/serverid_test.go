package binlog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"tidemark"
	"tidemark/internal/testenv"
)

// intruder is another client's binlog dump with a tailer's server id, as
// a standby that took the source's lock over starts one: MariaDB ends the
// older dump with the same id (ER_SLAVE_SAME_ID, 4052), the newer one
// streams. rows receives the rows events it reads; ended its error when
// the source ended it.
type intruder struct {
	rows  chan struct{}
	ended chan error
	stop  context.CancelFunc
}

// intrude starts a binlog dump with server id id at from; with again it
// starts a new one each time the source ends it (until the test ends).
// Its rows are those of database db.
func intrude(t *testing.T, addr, user, pass, db string, id uint32, from tidemark.Position, again bool) *intruder {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	ctx, cancel := context.WithCancel(context.Background())
	in := &intruder{rows: make(chan struct{}, 1024), ended: make(chan error, 1024), stop: cancel}
	t.Cleanup(cancel)
	go func() {
		for ctx.Err() == nil {
			s := replication.NewBinlogSyncer(replication.BinlogSyncerConfig{ServerID: id, Flavor: FlavorMariaDB, Host: host, Port: uint16(p), Logger: slog.New(slog.DiscardHandler),
				User: user, Password: pass, DisableRetrySync: true})
			gs, _ := mysql.ParseMariadbGTIDSet(from.GTID)
			st, err := s.StartSyncGTID(gs)
			for err == nil {
				var ev *replication.BinlogEvent
				if ev, err = st.GetEvent(ctx); err == nil {
					if r, ok := ev.Event.(*replication.RowsEvent); ok && r.Table != nil && string(r.Table.Schema) == db {
						select {
						case in.rows <- struct{}{}:
						default:
						}
					}
				}
			}
			s.Close()
			if ctx.Err() == nil {
				in.ended <- err
			}
			if !again {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	return in
}

// TestTailerServerIDTaken: another client registers a binlog dump with the
// tailer's server id while the tailer streams (nemesis seeds 121, 25, 9: a
// standby took the source's lock over and started streaming with the same
// server_id; the process it took over from stopped on "ERROR 4052 … A
// slave with the same server_uuid/server_id is already connected", exit 1,
// instead of finding the lock lost). The source ends the older stream, the
// tailer's. The tailer takes its id back (reconnects, ending the other
// client's stream) only while its pipeline's writer check proves that it
// holds the source's lock, and for a bounded time; otherwise it stops
// with the check's error or one naming the id.
func TestTailerServerIDTaken(t *testing.T) {
	addr, user, pass, c := testServer(t)
	db := testenv.Name("bt_sid_")
	exec(t, c, "CREATE DATABASE "+db, "CREATE TABLE "+db+".t (id INT PRIMARY KEY)")
	t.Cleanup(func() { _, _ = c.Execute("DROP DATABASE " + db) })
	next := 0 // the last row inserted
	lost := fmt.Errorf("check lock of source test: %w: another session holds it now", tidemark.ErrSourceLockLost)
	for _, tc := range []struct {
		name string
		// check is the writer check (nil: none set); again: the other
		// client registers again each time it is ended.
		check    func(context.Context) error
		again    bool
		takenFor time.Duration
		// takesBack: the tailer streams on after the other client's dump
		// ended; else it stops with an error wrapping want, saying say.
		takesBack bool
		want      error
		say       string
	}{
		{name: "lock held: takes the id back", check: func(context.Context) error { return nil }, takesBack: true},
		{name: "lock lost: stops", check: func(context.Context) error { return lost }, want: tidemark.ErrSourceLockLost, say: "another session holds it now"},
		{name: "no lock: stops", want: tidemark.ErrServerIDInUse, say: "give every replica of the source its own server_id"},
		{name: "taken again and again: stops after the bound", check: func(context.Context) error { return nil }, again: true, takenFor: 2 * time.Second,
			want: tidemark.ErrServerIDInUse, say: "again and again for 2s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl, err := New(Config{Name: "test", Addr: addr, User: user, Password: pass, ServerID: testenv.ServerID(),
				Include: []string{db + ".*"}, Heartbeat: time.Second, ServerIDTakenFor: tc.takenFor})
			if err != nil {
				t.Fatal(err)
			}
			var checks atomic.Int32
			if tc.check != nil {
				tl.SetWriterCheck(func(ctx context.Context) error { checks.Add(1); return tc.check(ctx) })
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			from := currentGTID(t, c)
			out := make(chan tidemark.Chunk, 64)
			errc := make(chan error, 1)
			go func() { errc <- tl.Stream(ctx, from, out) }()
			// row inserts a row and waits for the tailer to emit it.
			row := func() {
				t.Helper()
				next++
				exec(t, c, fmt.Sprintf("INSERT INTO %s.t VALUES (%d)", db, next))
				for {
					select {
					case ch := <-out:
						for _, x := range ch.Changes {
							if x.Table.ID.Database == db && x.After[0] == int64(next) {
								return
							}
						}
					case err := <-errc:
						t.Fatalf("the stream ended before row %d: %v", next, err)
					case <-ctx.Done():
						t.Fatalf("row %d not streamed", next)
					}
				}
			}
			row() // the tailer streams
			in := intrude(t, addr, user, pass, db, tl.cfg.ServerID, from, tc.again)
			if tc.takesBack {
				// The tailer ends the other client's dump by taking its
				// id back, then streams on.
				select {
				case err := <-in.ended:
					if !strings.Contains(err.Error(), "same server_uuid/server_id") {
						t.Fatalf("the other client's dump ended with %v, want ERROR 4052", err)
					}
				case err := <-errc:
					t.Fatalf("the tailer stopped instead of taking its server_id back: %v", err)
				case <-ctx.Done():
					t.Fatal("the other client's dump was never ended")
				}
				row()
				if checks.Load() == 0 {
					t.Fatal("the tailer took its server_id back without the writer check")
				}
				cancel()
				if err := <-errc; err != nil {
					t.Fatalf("stream: %v", err)
				}
				return
			}
			var serr error
			select {
			case serr = <-errc:
			case <-ctx.Done():
				t.Fatal("the tailer did not stop")
			}
			if !errors.Is(serr, tc.want) || !strings.Contains(serr.Error(), tc.say) || !strings.Contains(serr.Error(), strconv.Itoa(int(tl.cfg.ServerID))) {
				t.Fatalf("stream ended with %v; want an error wrapping %q, naming server_id %d and saying %q", serr, tc.want, tl.cfg.ServerID, tc.say)
			}
			if tc.again {
				return
			}
			// It did not take the id back: the other client still streams.
			select {
			case err := <-in.ended:
				t.Fatalf("the other client's dump ended: %v", err)
			default:
			}
			for len(in.rows) > 0 {
				<-in.rows
			}
			next++
			exec(t, c, fmt.Sprintf("INSERT INTO %s.t VALUES (%d)", db, next))
			select {
			case <-in.rows:
			case err := <-in.ended:
				t.Fatalf("the other client's dump ended: %v", err)
			case <-ctx.Done():
				t.Fatal("the other client's dump does not stream")
			}
		})
	}
}
