package verify

import (
	"testing"

	"tidemark"
)

func TestCanonicalJSON(t *testing.T) {
	for _, tc := range []struct{ a, b string }{
		{`{"b": 2.50, "a": [1, "x"]}`, `{"a":[1,"x"],"b":2.5}`},
		{`{"z":{"y":1e2}}`, `{"z": {"y": 100}}`},
		{`"é"`, `"\u00e9"`},
		{`[]`, `[ ]`},
	} {
		if x, y := canonicalJSON(tc.a), canonicalJSON(tc.b); x != y {
			t.Errorf("%s → %s, %s → %s", tc.a, x, tc.b, y)
		}
	}
	for _, tc := range []struct{ a, b string }{
		{`{"b": 2.50}`, `{"b": 2.51}`},
		{`[1, 2]`, `[2, 1]`},
		{`{"a": null}`, `{}`},
		{`"1"`, `1`},
	} {
		if canonicalJSON(tc.a) == canonicalJSON(tc.b) {
			t.Errorf("%s and %s compare equal", tc.a, tc.b)
		}
	}
}

func TestGoCanonFloats(t *testing.T) {
	s := func(v string) *string { return &v }
	if goCanon(tidemark.KindFloat, s("3.1415927410125732")) != goCanon(tidemark.KindFloat, s("3.1415927")) {
		t.Error("float32 value printed as double and as float differ")
	}
	if goCanon(tidemark.KindFloat, s("3.1415925")) == goCanon(tidemark.KindFloat, s("3.1415927")) {
		t.Error("different float32 values compare equal")
	}
	if goCanon(tidemark.KindDouble, s("1e300")) != goCanon(tidemark.KindDouble, s("1e+300")) {
		t.Error("1e300 formats differ")
	}
	if goCanon(tidemark.KindDouble, nil) == goCanon(tidemark.KindDouble, s("0")) {
		t.Error("NULL equals 0")
	}
}

// TestJSONComparer: the fast comparison agrees with the exact canonical
// form, on spellings of one document and on documents that differ.
func TestJSONComparer(t *testing.T) {
	var c jsonComparer
	for _, tc := range []struct{ a, b string }{
		{`{"b": 2.50, "a": [1, "x"]}`, `{"a":[1,"x"],"b":2.5}`},
		{`{"z":{"y":1e2, "x": 0.001}}`, `{"z": {"x": 1E-3, "y": 100}}`},
		{`{"k": 123, "tags": ["a", "b"]}`, `{"k":123,"tags":["a","b"]}`},
		{`"é"`, `"\u00e9"`},
		{`{"é": 1, "e": -0}`, `{"\u00e9": 1.0, "e": 0}`},
		{`[]`, `[ ]`},
		{`{}`, ` { } `},
		{`[-0.0, 0e5]`, `[0, 0]`},
		{`{"a": 1, "a": 2}`, `{"a": 2}`},
		{`12345678901234567890123`, `1.2345678901234567890123e22`},
	} {
		if !c.equal(tc.a, tc.b) || !c.equal(tc.b, tc.a) {
			t.Errorf("%s and %s compare different", tc.a, tc.b)
		}
	}
	for _, tc := range []struct{ a, b string }{
		{`{"b": 2.50}`, `{"b": 2.51}`},
		{`[1, 2]`, `[2, 1]`},
		{`{"a": null}`, `{}`},
		{`"1"`, `1`},
		{`{"a": {"b": 1}}`, `{"a": {"b": 1, "c": 1}}`},
		{`{"a": 1, "b": 2}`, `{"a": 2, "b": 1}`},
		{`[1.00000000000000001]`, `[1]`},
		{`{"a": "x\"y"}`, `{"a": "x\"z"}`},
		{`-1`, `1`},
		{`1e9`, `1e10`},
		{`{"a":`, `{"a": 1}`},
	} {
		if c.equal(tc.a, tc.b) || c.equal(tc.b, tc.a) {
			t.Errorf("%s and %s compare equal", tc.a, tc.b)
		}
	}
}

// FuzzJSONComparer: the fast path never calls two documents equal that the
// exact canonical form tells apart, and agrees with it otherwise.
func FuzzJSONComparer(f *testing.F) {
	f.Add(`{"b": 2.50, "a": [1, "x"]}`, `{"a":[1,"x"],"b":2.5}`)
	f.Add(`{"k": 1e2}`, `{"k": 100}`)
	f.Add(`[0.10, -3]`, `[1e-1, -3.0]`)
	f.Fuzz(func(t *testing.T, a, b string) {
		var c jsonComparer
		if got, want := c.equal(a, b), canonicalJSON(a) == canonicalJSON(b); got != want {
			t.Fatalf("equal(%q, %q) = %v, exact form says %v", a, b, got, want)
		}
	})
}
