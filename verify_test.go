package tidemark

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestLexPredicate(t *testing.T) {
	n := 0
	bound := func(i int) string { n++; return "b" + strconv.Itoa(i) }
	tests := []struct {
		cols    []string
		greater bool
		want    string
		binds   int
	}{
		{[]string{"a"}, true, "a >= b0 AND (a > b0)", 2},
		{[]string{"a"}, false, "a <= b0 AND (a <= b0)", 2},
		{[]string{"a", "b"}, true, "a >= b0 AND ((a > b0 OR (a = b0 AND b > b1)))", 4},
		{[]string{"a", "b", "c"}, false, "a <= b0 AND ((a < b0 OR (a = b0 AND (b < b1 OR (b = b1 AND c <= b2)))))", 6},
	}
	for _, tc := range tests {
		n = 0
		if got := LexPredicate(tc.cols, bound, tc.greater); got != tc.want || n != tc.binds {
			t.Errorf("%v greater=%v:\n got %s (%d binds)\nwant %s (%d)", tc.cols, tc.greater, got, n, tc.want, tc.binds)
		}
	}
}

// TestLexPredicateSemantics evaluates the expanded predicate against the
// row-value comparison it stands for, on every pair of small tuples.
func TestLexPredicateSemantics(t *testing.T) {
	cmp := func(a, b [2]int) int {
		for i := range a {
			if a[i] != b[i] {
				if a[i] < b[i] {
					return -1
				}
				return 1
			}
		}
		return 0
	}
	// eval interprets the generated SQL for columns c0, c1 and bounds b0, b1.
	eval := func(sql string, row, bnd [2]int) bool {
		r := strings.NewReplacer("c0", strconv.Itoa(row[0]), "c1", strconv.Itoa(row[1]), "b0", strconv.Itoa(bnd[0]), "b1", strconv.Itoa(bnd[1]))
		return evalBool(r.Replace(sql))
	}
	for _, greater := range []bool{true, false} {
		sql := LexPredicate([]string{"c0", "c1"}, func(i int) string { return "b" + strconv.Itoa(i) }, greater)
		for a0 := 0; a0 < 3; a0++ {
			for a1 := 0; a1 < 3; a1++ {
				for b0 := 0; b0 < 3; b0++ {
					for b1 := 0; b1 < 3; b1++ {
						row, bnd := [2]int{a0, a1}, [2]int{b0, b1}
						want := cmp(row, bnd) > 0
						if !greater {
							want = cmp(row, bnd) <= 0
						}
						if got := eval(sql, row, bnd); got != want {
							t.Fatalf("%s with row %v bound %v: %v, want %v", sql, row, bnd, got, want)
						}
					}
				}
			}
		}
	}
}

// evalBool evaluates the tiny SQL subset LexPredicate emits over integers:
// comparisons, AND, OR and parentheses.
func evalBool(s string) bool {
	toks := strings.Fields(strings.NewReplacer("(", " ( ", ")", " ) ").Replace(s))
	pos := 0
	var or func() bool
	atom := func() bool {
		if toks[pos] == "(" {
			pos++
			v := or()
			pos++ // ")"
			return v
		}
		a, _ := strconv.Atoi(toks[pos])
		op := toks[pos+1]
		b, _ := strconv.Atoi(toks[pos+2])
		pos += 3
		switch op {
		case ">":
			return a > b
		case ">=":
			return a >= b
		case "<":
			return a < b
		case "<=":
			return a <= b
		case "=":
			return a == b
		}
		panic("op " + op)
	}
	and := func() bool {
		v := atom()
		for pos < len(toks) && toks[pos] == "AND" {
			pos++
			w := atom()
			v = v && w
		}
		return v
	}
	or = func() bool {
		v := and()
		for pos < len(toks) && toks[pos] == "OR" {
			pos++
			w := and()
			v = v || w
		}
		return v
	}
	return or()
}

func TestVerifySpec(t *testing.T) {
	tbl := &Table{ID: TableID{Database: "shop", Name: "orders"}, Key: []int{0, 1}, Columns: []Column{
		{Name: "id", Kind: KindInt}, {Name: "name", Kind: KindText}, {Name: "f", Kind: KindFloat},
		{Name: "doc", Kind: KindJSON}, {Name: "at", Kind: KindDateTime}, {Name: "n", Kind: KindInt},
	}}
	spec := &VerifySpec{Table: tbl, TargetSchema: "shop", Zones: map[string]string{"at": "Asia/Kolkata"}}
	if err := spec.Validate(); err != nil {
		t.Fatal(err)
	}
	if !spec.Chunked() || spec.Zone("at") != "Asia/Kolkata" || spec.Zone("other") != "UTC" {
		t.Fatal("chunked/zone")
	}
	if got := spec.GoColumns(); len(got) != 2 || got[0] != 2 || got[1] != 3 {
		t.Fatalf("go columns %v", got)
	}
	tbl.Key = []int{2}
	if spec.Chunked() {
		t.Fatal("a float key cannot bound ranges")
	}
	tbl.Key = []int{0}
	for _, tc := range []struct {
		mutate func(s *VerifySpec)
		want   string
	}{
		{func(s *VerifySpec) { s.EventTime = "n" }, "want datetime or timestamp"},
		{func(s *VerifySpec) { s.EventTime = "nope" }, "not in table"},
		{func(s *VerifySpec) { s.TargetSchema = `x"; DROP` }, "invalid identifier"},
		{func(s *VerifySpec) { s.Table = &Table{ID: tbl.ID, Columns: tbl.Columns} }, "no business key"},
	} {
		s := *spec
		tc.mutate(&s)
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want %q, got %v", tc.want, err)
		}
	}
	spec.EventTime, spec.Since = "at", time.Now()
	if err := spec.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestDuplicateReportErr(t *testing.T) {
	if err := (DuplicateReport{}).Err("s.t"); err != nil {
		t.Fatal(err)
	}
	err := DuplicateReport{Groups: 3, Examples: []DuplicateKey{{Key: []string{"10", "1"}, Rows: 2}}}.Err("s.t")
	if !errors.Is(err, ErrDuplicateKeys) || !strings.Contains(err.Error(), "s.t: 3 keys") || !strings.Contains(err.Error(), "(10, 1)×2") {
		t.Fatalf("%v", err)
	}
	if s := (KeyRange{Lo: []string{"1", "a"}}).String(); s != "((1, a), +∞]" {
		t.Fatalf("range %s", s)
	}
}
