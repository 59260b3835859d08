package binlog

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/internal/testenv"
)

// TestTailerIdentityRules runs the identity rules (identity.go) against the
// real MariaDB: positions stored with another identity are followed in the
// next epoch or refused with one error naming what changed.
func TestTailerIdentityRules(t *testing.T) {
	addr, user, pass, c := testServer(t)
	db := testenv.Name("bi_")
	exec(t, c, "CREATE DATABASE "+db, "CREATE TABLE "+db+".t (id INT PRIMARY KEY, v INT)")
	t.Cleanup(func() { _, _ = c.Execute("DROP DATABASE " + db) })
	from := currentGTID(t, c)
	exec(t, c, "INSERT INTO "+db+".t VALUES (1, 1)", "INSERT INTO "+db+".t VALUES (2, 2)", "UPDATE "+db+".t SET v = 3 WHERE id = 1")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tl := newTailer(t, addr, user, pass, db, "UTC")
	st, err := tl.readServer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	me := st.id
	if me.Flavor != "mariadb" || me.Scheme != "gtid" || me.Basename != "mysql-bin" || me.Server == "" || me.Domain != "0" {
		t.Fatalf("identity read = %+v", me)
	}
	other := me
	other.Server = "999999"

	t.Run("same server: same epoch", func(t *testing.T) {
		stored := from
		stored.Source, stored.Epoch = me, 4
		res, err := newTailer(t, addr, user, pass, db, "UTC").Resolve(ctx, stored)
		if err != nil || res.Start.Epoch != 4 || len(res.Changed) != 0 {
			t.Fatalf("Resolve = %+v, %v; want epoch 4, nothing changed", res, err)
		}
	})
	t.Run("failover to a server with our GTID: next epoch, by GTID", func(t *testing.T) {
		stored := from
		stored.File, stored.Offset = "mysql-bin.000777", 4 // the old server's file
		stored.Source, stored.Epoch = other, 2
		tl := newTailer(t, addr, user, pass, db, "UTC")
		changes, commits := collect(t, tl, stored, 3)
		if len(changes) != 3 {
			t.Fatalf("%d changes, want 3", len(changes))
		}
		for _, ch := range changes {
			if ch.Version.Epoch() != 3 {
				t.Fatalf("change %s has epoch %d, want 3", ch.Version, ch.Version.Epoch())
			}
		}
		last := commits[len(commits)-1]
		if last.Epoch != 3 || last.Source != me || last.File == "mysql-bin.000777" {
			t.Fatalf("commit position %s: want epoch 3, source %s, this server's file", last, me)
		}
		// A Reader sharing the lineage captures in the same epoch.
		r, err := NewReaderFor(tl)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		snap, err := r.Capture(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if snap.Position.Epoch != 3 || snap.Version.Epoch() != 3 || snap.Position.Source != me {
			t.Fatalf("capture %s version %s: want epoch 3", snap.Position, snap.Version)
		}
	})
	t.Run("version scheme switched: next epoch, same position", func(t *testing.T) {
		stored := from
		stored.Source = me
		stored.Source.Scheme = "filepos"
		res, err := newTailer(t, addr, user, pass, db, "UTC").Resolve(ctx, stored)
		if err != nil || res.Start.Epoch != 1 || res.Start.GTID != from.GTID || !strings.Contains(strings.Join(res.Changed, ","), "version scheme filepos → gtid") {
			t.Fatalf("Resolve = %+v, %v; want epoch 1 at %s", res, err, from.GTID)
		}
	})
	refused := []struct {
		name   string
		stored tidemark.Position
		want   []string
	}{
		{"another server, file position only", tidemark.Position{File: "mysql-bin.000001", Offset: 4, Source: other},
			[]string{"server 999999 → " + me.Server, "file/offset mean nothing", "tidemark catchup"}},
		{"another flavor", tidemark.Position{GTID: from.GTID, Source: tidemark.SourceIdentity{Flavor: "mysql", Server: "3e11fa47-71ca-11e1-9e33-c80aa9429562", Scheme: "gtid", Basename: "binlog"}},
			[]string{"flavor mysql → mariadb", "source.flavor"}},
		{"lagging replica: lacks our GTID", tidemark.Position{GTID: "0-1-99999999999", Source: other, Epoch: 1},
			[]string{"lacks transactions tidemark already applied", "tidemark catchup", "tidemark verify"}},
	}
	for _, tc := range refused {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			err := newTailer(t, addr, user, pass, db, "UTC").Stream(ctx, tc.stored, make(chan tidemark.Chunk, 1))
			if !errors.Is(err, tidemark.ErrSourceChanged) {
				t.Fatalf("err = %v, want ErrSourceChanged", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	t.Run("accept: catch-up in the next epoch", func(t *testing.T) {
		stored := tidemark.Position{GTID: "0-1-99999999999", Source: other, Epoch: 1}
		tl := newTailer(t, addr, user, pass, db, "UTC")
		id, epoch, err := tl.Accept(ctx, stored)
		if err != nil || epoch != 2 || id != me {
			t.Fatalf("Accept = %s, %d, %v; want %s, 2", id, epoch, err, me)
		}
	})
}

// TestSeveralDomainsRefusedAtStart is finding 4 of issue 13: with version:
// gtid, a second GTID domain used to stop the stream only when its first
// event arrived (and again on every restart). It is refused at start,
// naming the setting.
func TestSeveralDomainsRefusedAtStart(t *testing.T) {
	tl := &Tailer{cfg: Config{Name: "s", Flavor: FlavorMariaDB, Version: VersionGTID}}
	err := tl.checkDomains(serverState{gtidPos: "0-1-5,1-2-7"})
	if !errors.Is(err, tidemark.ErrSourceConfig) || !strings.Contains(err.Error(), "version: filepos") || !strings.Contains(err.Error(), "2 GTID domains") {
		t.Fatalf("err = %v", err)
	}
	if err := tl.checkDomains(serverState{gtidPos: "1-2-7"}); err != nil {
		t.Fatal(err)
	}
	tl.cfg.Version = VersionFilePos
	if err := tl.checkDomains(serverState{gtidPos: "0-1-5,1-2-7"}); err != nil {
		t.Fatalf("filepos with two domains refused: %v", err)
	}
}

// TestEpochFloorLift: a resumed epoch below the source's epoch floor is
// raised to the floor on the floor's server, past it on another (or an
// unknown) one; at or above the floor nothing changes (review finding 10).
func TestEpochFloorLift(t *testing.T) {
	a := tidemark.SourceIdentity{Flavor: "mariadb", Server: "1", Domain: "0", Scheme: "gtid", Basename: "b"}
	b := a
	b.Server = "2"
	for _, c := range []struct {
		name  string
		floor epochFloor
		e     uint32
		id    tidemark.SourceIdentity
		want  uint32
	}{
		{"no floor", epochFloor{}, 0, a, 0},
		{"above", epochFloor{known: true, epoch: 1, id: a}, 2, b, 2},
		{"at, same server", epochFloor{known: true, epoch: 1, id: a}, 1, a, 1},
		{"at, another server", epochFloor{known: true, epoch: 1, id: a}, 1, b, 2},
		{"below, same server", epochFloor{known: true, epoch: 3, id: a}, 0, a, 3},
		{"below, another server", epochFloor{known: true, epoch: 3, id: a}, 0, b, 4},
		{"below, floor of unknown server", epochFloor{known: true, epoch: 3}, 0, a, 4},
		{"at, floor of unknown server", epochFloor{known: true, epoch: 3}, 3, a, 3},
	} {
		if got, _ := c.floor.lift(c.e, c.id); got != c.want {
			t.Errorf("%s: lift(%d) = %d, want %d", c.name, c.e, got, c.want)
		}
	}
}
