package tidemark

import (
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
