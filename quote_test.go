package tidemark_test

import (
	"testing"

	"tidemark"
)

// TestQuote: each dialect's quote wraps the name and doubles its own quote
// character only.
func TestQuote(t *testing.T) {
	for _, tc := range []struct{ name, my, pg string }{
		{"orders", "`orders`", `"orders"`},
		{"a`b", "`a``b`", "\"a`b\""},
		{`a"b`, "`a\"b`", `"a""b"`},
		{"``", "``````", "\"``\""},
		{"order lines-2", "`order lines-2`", `"order lines-2"`},
	} {
		if got := tidemark.QuoteMySQL(tc.name); got != tc.my {
			t.Errorf("QuoteMySQL(%q) = %s, want %s", tc.name, got, tc.my)
		}
		if got := tidemark.QuotePostgres(tc.name); got != tc.pg {
			t.Errorf("QuotePostgres(%q) = %s, want %s", tc.name, got, tc.pg)
		}
	}
}
