package tidemark_test

import (
	"errors"
	"testing"

	"tidemark"
)

func TestPositionRoundTrip(t *testing.T) {
	for _, p := range []tidemark.Position{
		{},
		{GTID: "0-1001-42"},
		{GTID: "0-1001-42,1-1002-7", File: "mysql-bin.000003", Offset: 1234},
		{File: "mysql-bin.000001", Offset: 4},
		{GTID: "3E11FA47-71CA-11E1-9E33-C80AA9429562:1-5"},
	} {
		t.Run(p.String(), func(t *testing.T) {
			got, err := tidemark.ParsePosition(p.String())
			if err != nil {
				t.Fatal(err)
			}
			if got != p {
				t.Fatalf("round trip %+v → %q → %+v", p, p.String(), got)
			}
		})
	}
}

func TestParsePositionErrors(t *testing.T) {
	for _, s := range []string{"gtid", "pos=abc", "file=a/b;pos=1", "file=x.000001", "color=red", "gtid=0-1", "gtid=a-b-c"} {
		t.Run(s, func(t *testing.T) {
			if _, err := tidemark.ParsePosition(s); err == nil {
				t.Fatalf("ParsePosition(%q) succeeded", s)
			}
		})
	}
}

var srcA = tidemark.SourceIdentity{Flavor: "mariadb", Server: "1", Domain: "0", Scheme: "filepos", Basename: "mysql-bin"}

func TestPositionCompare(t *testing.T) {
	tests := []struct {
		a, b    tidemark.Position
		want    int
		wantErr bool
	}{
		{tidemark.Position{File: "mysql-bin.000002", Offset: 4}, tidemark.Position{File: "mysql-bin.000010", Offset: 4}, -1, false},
		{tidemark.Position{File: "mysql-bin.000002", Offset: 900}, tidemark.Position{File: "mysql-bin.000002", Offset: 100}, 1, false},
		{tidemark.Position{File: "mysql-bin.000002", Offset: 100}, tidemark.Position{File: "mysql-bin.000002", Offset: 100}, 0, false},
		{tidemark.Position{GTID: "0-1-5"}, tidemark.Position{GTID: "0-1-10"}, -1, false},
		{tidemark.Position{GTID: "0-1-10"}, tidemark.Position{GTID: "0-2-9"}, 1, false},
		{tidemark.Position{GTID: "0-1-10,1-1-3"}, tidemark.Position{GTID: "0-1-10"}, 1, false},
		{tidemark.Position{GTID: "0-1-10,1-1-3"}, tidemark.Position{GTID: "0-1-11,1-1-2"}, 0, true},
		{tidemark.Position{GTID: "0-1-5"}, tidemark.Position{}, 1, false},
		{tidemark.Position{}, tidemark.Position{}, 0, false},
		// One known server and epoch: its binlog's order, whatever the
		// GTID sequence says (MariaDB without gtid_strict_mode; review
		// finding 11).
		{tidemark.Position{GTID: "0-1-3", File: "mysql-bin.000006", Offset: 900, Source: srcA}, tidemark.Position{GTID: "0-1-900", File: "mysql-bin.000006", Offset: 600, Source: srcA}, 1, false},
		{tidemark.Position{GTID: "0-1-3", File: "mysql-bin.000007", Offset: 4, Source: srcA}, tidemark.Position{GTID: "0-1-900", File: "mysql-bin.000006", Offset: 600, Source: srcA}, 1, false},
		// Without an identity on both sides, GTIDs still decide.
		{tidemark.Position{GTID: "0-1-3", File: "mysql-bin.000006", Offset: 900}, tidemark.Position{GTID: "0-1-900", File: "mysql-bin.000006", Offset: 600, Source: srcA}, -1, false},
	}
	for _, tc := range tests {
		t.Run(tc.a.String()+"_vs_"+tc.b.String(), func(t *testing.T) {
			got, err := tc.a.Compare(tc.b)
			if tc.wantErr {
				if !errors.Is(err, tidemark.ErrIncomparable) {
					t.Fatalf("err = %v, want ErrIncomparable", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Compare = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

func TestVersionCompare(t *testing.T) {
	vs := []tidemark.Version{{Seq: 1, Index: 0}, {Seq: 1, Index: 1}, {Seq: 1, Index: 2}, {Seq: 2, Index: 0}, {Seq: 10, Index: 1}}
	for i := range vs {
		for j := range vs {
			want := 0
			if i < j {
				want = -1
			} else if i > j {
				want = 1
			}
			if got := vs[i].Compare(vs[j]); got != want {
				t.Errorf("%s.Compare(%s) = %d, want %d", vs[i], vs[j], got, want)
			}
		}
	}
}

func TestKeyOfDistinguishesValues(t *testing.T) {
	tbl := &tidemark.Table{Columns: []tidemark.Column{{Name: "a"}, {Name: "b"}}, Key: []int{0, 1}}
	keys := map[tidemark.Key][]any{}
	for _, row := range [][]any{
		{int64(1), "2"}, {int64(12), ""}, {"1", "2"}, {int64(1), int64(2)}, {"a\x00", "b"}, {"a", "\x00b"}, {nil, "x"}, {[]byte("1"), "2"},
	} {
		k := tbl.KeyOf(row)
		if prev, dup := keys[k]; dup {
			t.Fatalf("rows %v and %v encode to the same key", prev, row)
		}
		keys[k] = row
	}
	if k1, k2 := tbl.KeyOf([]any{int64(1), "2"}), tbl.KeyOf([]any{int64(1), "2"}); k1 != k2 {
		t.Fatal("equal rows encode differently")
	}
}

func TestMySQLGTIDSetSubtract(t *testing.T) {
	a, _ := tidemark.ParseMySQLGTIDSet("3e11fa47-71ca-11e1-9e33-c80aa9429562:1-10:20-30,7c9a4b21-0d3e-11ef-8a51-0242ac120002:1-3")
	b, _ := tidemark.ParseMySQLGTIDSet("3e11fa47-71ca-11e1-9e33-c80aa9429562:3-5:10-25")
	if got, want := a.Subtract(b).String(), "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-2:6-9:26-30,7c9a4b21-0d3e-11ef-8a51-0242ac120002:1-3"; got != want {
		t.Fatalf("Subtract = %s, want %s", got, want)
	}
	if got := b.Subtract(a).String(); got != "3e11fa47-71ca-11e1-9e33-c80aa9429562:11-19" {
		t.Fatalf("b − a = %q, want …:11-19", got)
	}
	if got := a.Subtract(a).String(); got != "" {
		t.Fatalf("a − a = %q, want empty", got)
	}
}
