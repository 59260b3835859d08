package binlog

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"tidemark"
	"tidemark/internal/testenv"
)

// mysql9Server connects to the real MySQL 9.7 of scripts/services.sh; the
// test fails (never skips) without it.
func mysql9Server(t *testing.T) (Config, *client.Conn) {
	t.Helper()
	s := testenv.MySQL9(t)
	return Config{Name: "my9test", Flavor: FlavorMySQL, Addr: s.Addr, User: s.User, Password: s.Password, ServerID: 7391}, s.Conn(t)
}

// TestMySQLCachingSHA2Auth: an account with caching_sha2_password (MySQL
// 8's and 9's default) whose password is not in the server's cache (after
// FLUSH PRIVILEGES) needs the full authentication: over TLS the password
// goes in clear inside the tunnel; over plain TCP go-mysql asks the server
// for its RSA public key and sends the password encrypted with it. Both the
// SQL connections and the replication stream must pass, in every TLS mode
// the server's auto-generated certificate allows, and a wrong password must
// stay an access-denied error without the password in it.
func TestMySQLCachingSHA2Auth(t *testing.T) {
	base, c := mysql9Server(t)
	user, pass := testenv.Name("tm_sha2_"), "sha2-Pw-"+testenv.Name("")
	exec(t, c, "CREATE USER '"+user+"'@'127.0.0.1' IDENTIFIED WITH caching_sha2_password BY '"+pass+"'",
		"GRANT SELECT, RELOAD, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '"+user+"'@'127.0.0.1'")
	t.Cleanup(func() { _, _ = c.Execute("DROP USER IF EXISTS '" + user + "'@'127.0.0.1'") })
	r, err := c.Execute("SELECT plugin FROM mysql.user WHERE user = ?", user)
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := r.GetString(0, 0); p != "caching_sha2_password" {
		t.Fatalf("plugin %q", p)
	}
	ctx := context.Background()
	for _, mode := range []string{tidemark.TLSDisable, tidemark.TLSRequire, tidemark.TLSVerifyCA} {
		t.Run(mode, func(t *testing.T) {
			cfg := base
			cfg.User, cfg.Password = user, pass
			cfg.TLS = tidemark.TLSConfig{Mode: mode}
			if mode == tidemark.TLSVerifyCA {
				cfg.TLS.CAFile = testenv.MySQL9CA(t)
			}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			// SQL: full authentication (the cache is empty).
			exec(t, c, "FLUSH PRIVILEGES")
			sc, err := connectSQL(ctx, &cfg)
			if err != nil {
				t.Fatalf("SQL connection with caching_sha2_password, tls %s, empty cache: %v", mode, err)
			}
			sr, err := sc.Execute("SELECT CURRENT_USER(), COALESCE((SELECT VARIABLE_VALUE FROM performance_schema.session_status WHERE VARIABLE_NAME = 'Ssl_cipher'), '')")
			sc.Close()
			if err != nil {
				t.Fatal(err)
			}
			cipher, _ := sr.GetString(0, 1)
			if (cipher != "") != (mode != tidemark.TLSDisable) {
				t.Fatalf("tls %s: Ssl_cipher %q", mode, cipher)
			}
			// Replication: full authentication again, then the first event.
			exec(t, c, "FLUSH PRIVILEGES")
			syc, err := syncerConfig(&cfg, 7392)
			if err != nil {
				t.Fatal(err)
			}
			syncer := replication.NewBinlogSyncer(syc)
			defer syncer.Close()
			gr, err := c.Execute("SELECT REPLACE(@@gtid_executed, '\\n', '')")
			if err != nil {
				t.Fatal(err)
			}
			executed, _ := gr.GetString(0, 0)
			gs, err := mysql.ParseMysqlGTIDSet(executed)
			if err != nil {
				t.Fatal(err)
			}
			st, err := syncer.StartSyncGTID(gs)
			if err != nil {
				t.Fatalf("replication connection with caching_sha2_password, tls %s, empty cache: %v", mode, err)
			}
			ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if _, err := st.GetEvent(ectx); err != nil {
				t.Fatalf("replication stream, tls %s: %v", mode, err)
			}
			// A wrong password: access denied, the password not in the text.
			bad := cfg
			bad.Password = "wrong-" + pass
			exec(t, c, "FLUSH PRIVILEGES")
			_, err = connectSQL(ctx, &bad)
			if err == nil || !strings.Contains(err.Error(), "Access denied") || strings.Contains(err.Error(), pass) {
				t.Fatalf("wrong password, tls %s: %v", mode, err)
			}
		})
	}
}

// TestMySQLCaptureSeesEverythingBeforeIt is TestCaptureSeesEverythingBeforeIt
// on the real MySQL 9.7, for both capture modes: 16 writers commit single-row
// transactions under a widened group commit (binlog_group_commit_sync_delay,
// sync_binlog=1: a group is in the binlog, and SHOW BINARY LOG STATUS past
// it, for milliseconds before its rows are visible); each round captures and
// reads the table at once, and every row whose binlog version is below the
// captured one must be in the read. The binlog versions of the rows come from
// streaming the binlog afterwards. Then a 3-second SELECT runs during a
// capture: FLUSH TABLES WITH READ LOCK waits for it and stalls every writer;
// log_status must not.
func TestMySQLCaptureSeesEverythingBeforeIt(t *testing.T) {
	base, c := mysql9Server(t)
	db := testenv.Name("cap9_")
	exec(t, c, "CREATE DATABASE "+db)
	t.Cleanup(func() { _, _ = c.Execute("DROP DATABASE " + db) })
	exec(t, c, "USE "+db, "CREATE TABLE g (id BIGINT PRIMARY KEY, w INT) ENGINE=InnoDB", "INSERT INTO g VALUES (0, 0)")
	r0, err := c.Execute("SELECT @@global.binlog_group_commit_sync_delay, @@global.sync_binlog")
	if err != nil {
		t.Fatal(err)
	}
	delay, _ := r0.GetInt(0, 0)
	sb, _ := r0.GetInt(0, 1)
	t.Cleanup(func() {
		_, _ = c.Execute(fmt.Sprintf("SET GLOBAL binlog_group_commit_sync_delay = %d, GLOBAL sync_binlog = %d", delay, sb))
	})
	exec(t, c, "SET GLOBAL binlog_group_commit_sync_delay = 3000, GLOBAL sync_binlog = 1")
	for i, mode := range []string{CaptureLogStatus, CaptureFlushTables} {
		t.Run(mode, func(t *testing.T) {
			cfg := base
			cfg.Capture, cfg.Include = mode, []string{db + ".*"}
			testMySQLCapture(t, cfg, c, db, mode, uint64(i+1)<<48)
		})
	}
}

func testMySQLCapture(t *testing.T, cfg Config, c *client.Conn, db, mode string, idBase uint64) {
	gr, err := c.Execute("SELECT REPLACE(@@gtid_executed, '\\n', '')")
	if err != nil {
		t.Fatal(err)
	}
	start, _ := gr.GetString(0, 0)
	const writers = 16
	var mu sync.Mutex
	var ids []uint64
	var stallMu sync.Mutex
	var slowest time.Duration // the longest INSERT while measuring
	measuring := false
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			wc, err := client.Connect(cfg.Addr, cfg.User, cfg.Password, db)
			if err != nil {
				errs <- err
				return
			}
			defer wc.Close()
			for i := 1; ctx.Err() == nil; i++ {
				id := idBase | uint64(w+1)<<32 | uint64(i)
				t0 := time.Now()
				if _, err := wc.Execute("INSERT INTO g VALUES (?, ?)", id, w); err != nil {
					errs <- err
					return
				}
				d := time.Since(t0)
				stallMu.Lock()
				if measuring && d > slowest {
					slowest = d
				}
				stallMu.Unlock()
				mu.Lock()
				ids = append(ids, id)
				mu.Unlock()
			}
		}(w)
	}
	r, err := NewReader(cfg)
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
	stop := time.Now().Add(5 * time.Second)
	for i := 0; i < 120 && time.Now().Before(stop); i++ {
		t0 := time.Now()
		snap, err := r.Capture(ctx)
		captureTime += time.Since(t0)
		if err != nil {
			t.Fatal(err)
		}
		res, err := r.Read(ctx, tidemark.ReadRequest{Table: id, Limit: 1 << 20, Snapshot: snap})
		if err != nil {
			t.Fatal(err)
		}
		seen := map[uint64]bool{}
		for _, ch := range res.Changes {
			if v := uint64(ch.After[0].(int64)); v&^(1<<48-1) == idBase {
				seen[v] = true
			}
		}
		rounds = append(rounds, round{snap.Version.Seq, seen})
	}
	// The writers' stall: a 3-second SELECT holds the table open while a
	// capture runs.
	long, err := client.Connect(cfg.Addr, cfg.User, cfg.Password, db)
	if err != nil {
		t.Fatal(err)
	}
	defer long.Close()
	longDone := make(chan error, 1)
	go func() {
		_, err := long.Execute("SELECT SLEEP(3), id FROM g LIMIT 1")
		longDone <- err
	}()
	time.Sleep(300 * time.Millisecond)
	stallMu.Lock()
	measuring = true
	stallMu.Unlock()
	t0 := time.Now()
	if _, err := r.Capture(ctx); err != nil {
		t.Fatal(err)
	}
	longCapture := time.Since(t0)
	time.Sleep(200 * time.Millisecond)
	stallMu.Lock()
	measuring = false
	stall := slowest
	stallMu.Unlock()
	if err := <-longDone; err != nil {
		t.Fatal(err)
	}
	cancel()
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}

	// The binlog version of every row, from the binlog itself.
	tl, err := New(Config{Name: "cap9", Flavor: FlavorMySQL, Addr: cfg.Addr, User: cfg.User, Password: cfg.Password, ServerID: 7393,
		Include: []string{db + ".*"}, Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	changes, _ := collect(t, tl, tidemark.Position{GTID: start}, len(ids))
	seqOf := map[uint64]uint64{}
	for _, ch := range changes {
		seqOf[uint64(ch.After[0].(int64))] = ch.Version.Seq
	}
	if len(seqOf) != len(ids) {
		t.Fatalf("streamed %d rows, %d written", len(seqOf), len(ids))
	}
	lostRounds, lost := 0, 0
	for _, rd := range rounds {
		n := 0
		for _, id := range ids {
			if seqOf[id] < rd.seq && !rd.seen[id] {
				n++
			}
		}
		if n > 0 {
			lostRounds++
			lost += n
		}
	}
	t.Logf("%s: %d rounds, %d rows by %d writers; capture %s on average; with a 3 s SELECT running: capture %s, slowest INSERT %s",
		mode, len(rounds), len(ids), writers, captureTime/time.Duration(len(rounds)), longCapture.Round(time.Millisecond), stall.Round(time.Millisecond))
	if lost > 0 {
		t.Fatalf("%s: %d of %d captures promised a position whose rows the read that followed did not see (%d rows would be lost)", mode, lostRounds, len(rounds), lost)
	}
	if mode == CaptureLogStatus && (longCapture > time.Second || stall > time.Second) {
		t.Fatalf("log_status capture with a 3 s SELECT running took %s and stalled a writer %s: it must not wait for running statements", longCapture, stall)
	}
}
