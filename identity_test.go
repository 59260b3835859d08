package tidemark_test

import (
	"errors"
	"strings"
	"testing"

	"tidemark"
)

var (
	idA = tidemark.SourceIdentity{Flavor: "mariadb", Server: "1001", Domain: "0", Scheme: "gtid", Basename: "mysql-bin"}
	idB = tidemark.SourceIdentity{Flavor: "mariadb", Server: "1002", Domain: "0", Scheme: "gtid", Basename: "mysql-bin"}
)

func TestPositionWithIdentityRoundTrip(t *testing.T) {
	for _, p := range []tidemark.Position{
		{GTID: "0-1001-42", File: "mysql-bin.000003", Offset: 99, Epoch: 3, Source: idA},
		{File: "binlog.000001", Offset: 4, Source: tidemark.SourceIdentity{Flavor: "mysql", Server: "3e11fa47-71ca-11e1-9e33-c80aa9429562", Scheme: "filepos", Basename: "binlog"}},
		{GTID: "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5:7,4e11fa47-71ca-11e1-9e33-c80aa9429562:1", Epoch: 1},
	} {
		got, err := tidemark.ParsePosition(p.String())
		if err != nil {
			t.Fatal(err)
		}
		if got != p {
			t.Fatalf("round trip %+v → %q → %+v", p, p.String(), got)
		}
	}
	for _, s := range []string{"epoch=x", "epoch=200", "src=mariadb/1", "src=mariadb//0/gtid/mysql-bin", "gtid=not-a-gtid:1"} {
		if _, err := tidemark.ParsePosition(s); err == nil {
			t.Errorf("ParsePosition(%q) succeeded", s)
		}
	}
}

// TestCompareAcrossFailover is finding 2 of issue 13: after a MariaDB
// failover the new primary's binlog file numbers start low while its GTIDs
// continue. Comparing by file said the new position is older (and the
// Kafka sink dropped every batch as already published).
func TestCompareAcrossFailover(t *testing.T) {
	before := tidemark.Position{GTID: "0-1001-500", File: "mysql-bin.000009", Offset: 8000}
	after := tidemark.Position{GTID: "0-1002-501", File: "mysql-bin.000002", Offset: 400}
	if c, err := after.Compare(before); err != nil || c != 1 {
		t.Fatalf("new primary's position vs the old one's = %d, %v; want 1 (GTID 501 after 500)", c, err)
	}
	// Same positions with identities: the epoch orders them.
	before.Source, before.Epoch = idA, 0
	after.Source, after.Epoch = idB, 1
	if c, err := after.Compare(before); err != nil || c != 1 {
		t.Fatalf("epoch 1 vs epoch 0 = %d, %v; want 1", c, err)
	}
	// Epoch wins even where the GTIDs say otherwise (a lagging replica
	// whose sequence numbers were reused).
	lag := tidemark.Position{GTID: "0-1002-400", File: "mysql-bin.000002", Offset: 1, Epoch: 1, Source: idB}
	if c, err := lag.Compare(before); err != nil || c != 1 {
		t.Fatalf("later epoch, lower GTID = %d, %v; want 1", c, err)
	}
	// Same epoch, different servers: no guess.
	other := after
	other.Epoch = 0
	if _, err := other.Compare(before); !errors.Is(err, tidemark.ErrIncomparable) {
		t.Fatalf("two identities in one epoch: err = %v, want ErrIncomparable", err)
	}
	// File positions of differently named binlogs never compare.
	a := tidemark.Position{File: "mysql-bin.000009", Offset: 4}
	b := tidemark.Position{File: "binlog.000010", Offset: 4}
	if _, err := a.Compare(b); !errors.Is(err, tidemark.ErrIncomparable) {
		t.Fatalf("files of two basenames: err = %v, want ErrIncomparable", err)
	}
}

func TestComparePositionsMySQLGTID(t *testing.T) {
	const u1, u2 = "3e11fa47-71ca-11e1-9e33-c80aa9429562", "4e11fa47-71ca-11e1-9e33-c80aa9429562"
	tests := []struct {
		a, b string
		want int
		err  bool
	}{
		{u1 + ":1-5", u1 + ":1-7", -1, false},
		{u1 + ":1-7," + u2 + ":1-2", u1 + ":1-7", 1, false},
		{u1 + ":1-7", strings.ToUpper(u1) + ":1-3:4-7", 0, false},
		{u1 + ":1-7", u1 + ":1-5," + u2 + ":1", 0, true},
		{u1 + ":1-3:5", u1 + ":1-4", 0, true},
	}
	for _, tc := range tests {
		c, err := tidemark.Position{GTID: tc.a}.Compare(tidemark.Position{GTID: tc.b})
		if tc.err {
			if !errors.Is(err, tidemark.ErrIncomparable) {
				t.Errorf("%s vs %s: err = %v, want ErrIncomparable", tc.a, tc.b, err)
			}
			continue
		}
		if err != nil || c != tc.want {
			t.Errorf("%s vs %s = %d, %v; want %d", tc.a, tc.b, c, err, tc.want)
		}
	}
}

func TestMySQLGTIDSet(t *testing.T) {
	const u1 = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
	s, err := tidemark.ParseMySQLGTIDSet(u1 + ":7-9:1-3:4:5-6,\n" + u1 + ":10:20-21," + u1 + ":blue:1-2")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.String(), u1+":1-10:20-21,"+u1+":blue:1-2"; got != want {
		t.Fatalf("String = %q, want %q", got, want)
	}
	if !s.Contains(u1, 10) || s.Contains(u1, 11) || !s.Contains(u1+":blue", 2) {
		t.Fatal("Contains is wrong")
	}
	for _, bad := range []string{"x:1", u1, u1 + ":0", u1 + ":5-3", u1 + ":1-", u1 + "::1"} {
		if _, err := tidemark.ParseMySQLGTIDSet(bad); err == nil {
			t.Errorf("ParseMySQLGTIDSet(%q) succeeded", bad)
		}
	}
}

func TestEpochSeq(t *testing.T) {
	v0, _ := tidemark.EpochSeq(0, 12345)
	if v0 != 12345 {
		t.Fatalf("epoch 0 changes the sequence: %d", v0)
	}
	// The largest version of epoch 1 is older than the smallest of epoch 2.
	hi, err := tidemark.EpochSeq(1, tidemark.MaxSeqInEpoch)
	if err != nil {
		t.Fatal(err)
	}
	lo, _ := tidemark.EpochSeq(2, 1)
	if (tidemark.Version{Seq: hi, Index: 9}).Compare(tidemark.Version{Seq: lo}) != -1 {
		t.Fatal("epoch 2 does not win over epoch 1")
	}
	if (tidemark.Version{Seq: lo}).Epoch() != 2 {
		t.Fatal("Epoch() is wrong")
	}
	top, err := tidemark.EpochSeq(tidemark.MaxEpoch, tidemark.MaxSeqInEpoch)
	if err != nil || top > 1<<63-1 {
		t.Fatalf("largest version %d (%v) does not fit a signed 64-bit column", top, err)
	}
	if _, err := tidemark.EpochSeq(tidemark.MaxEpoch+1, 1); err == nil {
		t.Fatal("epoch overflow accepted")
	}
	if _, err := tidemark.EpochSeq(1, tidemark.MaxSeqInEpoch+1); err == nil {
		t.Fatal("sequence overflow accepted")
	}
}

func TestIdentityChanges(t *testing.T) {
	got := strings.Join(idA.Changes(idB), "; ")
	if got != "server 1001 → 1002" {
		t.Fatalf("Changes = %q", got)
	}
	if idA.Changes(idA) != nil || (tidemark.SourceIdentity{}).Changes(idB) != nil {
		t.Fatal("no change reported as a change")
	}
}
