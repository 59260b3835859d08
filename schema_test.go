package tidemark

import (
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

func TestParseTableID(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want TableID
		ok   bool
	}{
		{"shop.orders", TableID{Database: "shop", Name: "orders"}, true},
		{"my-db.order items$1", TableID{Database: "my-db", Name: "order items$1"}, true},
		{"orders", TableID{}, false},
		{"shop.", TableID{}, false},
		{".orders", TableID{}, false},
		{"a.b.c", TableID{}, false},
		{`shop.or"ders`, TableID{}, false},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseTableID(tc.in)
			if tc.ok != (err == nil) || got != tc.want {
				t.Fatalf("ParseTableID(%q) = %v, %v", tc.in, got, err)
			}
			if err != nil && (!strings.Contains(err.Error(), strconv.Quote(tc.in)) || !strings.Contains(err.Error(), "want database.table")) {
				t.Fatalf("error %q does not quote the input", err)
			}
			if err == nil && got.String() != tc.in {
				t.Fatalf("String() = %q, want %q", got.String(), tc.in)
			}
		})
	}
}

// identREBefore is the regular expression ValidIdentifier used to be (plus its
// "no trailing space" rule): the rune loop that replaced it must accept and
// refuse exactly what it did.
var identREBefore = regexp.MustCompile(`^[\p{L}\p{N}_$][\p{L}\p{N}_$ \-]{0,62}$`)

func validIdentifierBefore(s string) bool {
	return identREBefore.MatchString(s) && !strings.HasSuffix(s, " ")
}

func TestValidIdentifierMatchesTheRegexpItReplaced(t *testing.T) {
	check := func(s string) {
		t.Helper()
		if got, want := ValidIdentifier(s), validIdentifierBefore(s); got != want {
			t.Fatalf("ValidIdentifier(%q) = %v, the regexp said %v", s, got, want)
		}
	}
	for _, s := range []string{
		"", "a", "_", "$", "9", " ", "-", " a", "-a", "a ", "a-", "a b", "a-b",
		"order items$1", "my-db", "é", "日本", "٣", "a.b", "a\"b", "a`b", "a\x00b",
		"a\nb", "a\tb", "\ufffd", "a\ufffd", "\xff", "a\xff", "a\xc3", "\xc3\xa9",
		strings.Repeat("a", 62), strings.Repeat("a", 63), strings.Repeat("a", 64),
		strings.Repeat("é", 63), strings.Repeat("é", 64), strings.Repeat("日", 63),
		strings.Repeat("a", 62) + " ", strings.Repeat("a", 62) + "-", strings.Repeat("a", 63) + " ",
	} {
		check(s)
	}
	alphabet := []string{"a", "Z", "9", "_", "$", " ", "-", ".", "\"", "`", "'", "\x00",
		"\n", "é", "日", "٣", "Ⅻ", "\u00a0", "\ufffd", "\xff", "\xc3", "\u200b", "🙂", "ß"}
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 200000; i++ {
		n := r.IntN(8)
		if r.IntN(4) == 0 {
			n = 60 + r.IntN(6) // around the 63-character limit
		}
		var b strings.Builder
		for j := 0; j < n; j++ {
			if r.IntN(3) == 0 {
				b.WriteString(alphabet[r.IntN(len(alphabet))])
			} else {
				b.WriteString(alphabet[r.IntN(3)]) // mostly valid, so the long ones reach the limit
			}
		}
		check(b.String())
	}
}
