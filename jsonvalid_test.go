package tidemark

import (
	"encoding/json"
	"strings"
	"testing"
)

var jsonValidCases = []string{
	``, ` `, `null`, ` null `, `nul`, `nulll`, `true`, `false`, `True`, `0`, `-0`, `01`, `-`, `1.`, `1.5`, `.5`, `1e5`, `1E+5`, `1e-5`, `1e`, `1e+`,
	`-1.25e-10`, `1.2.3`, `"a"`, `"`, `"\"`, `"\\"`, `"\/"`, `"\x"`, `"\u00e9"`, `"\u00G9"`, `"\u00e"`, `"\ud800"`, "\"tab\there\"", "\"nl\n\"",
	"\"\x7f\"", "\"\xff\xfe\"", "\"é\"", `[]`, `[ ]`, `[1,]`, `[,1]`, `[1 2]`, `[1,2]`, `[[[]]]`, `[`, `]`, `{}`, `{ }`, `{"a":1}`, `{"a" : 1 , "b":[true,null]}`,
	`{"a":1,}`, `{a:1}`, `{"a"}`, `{"a":}`, `{"a":1 "b":2}`, `{"a":1}}`, `{"k": 1, "tags": ["a", "b"]}`, "\t\r\n{}\n", `1 2`, `"a" "b"`, "\x00", `{"a":"\u0000"}`,
	`[1e400]`, `-a`, `+1`, `0x10`, `[-]`, `{"":""}`, `[""]`, `"\ud83d\ude00"`,
	strings.Repeat("[", 10000) + strings.Repeat("]", 10000), strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
	strings.Repeat(`{"a":`, 10000) + "1" + strings.Repeat("}", 10000), strings.Repeat(`{"a":`, 10001) + "1" + strings.Repeat("}", 10001),
	strings.Repeat("[", 10000) + strings.Repeat("]", 9999),
}

// TestJSONValid: JSON.Valid agrees with encoding/json.Valid on documents at
// every edge of the grammar, the nesting limit among them.
func TestJSONValid(t *testing.T) {
	for _, c := range jsonValidCases {
		if got, want := JSON(c).Valid(), json.Valid([]byte(c)); got != want {
			t.Errorf("JSON(%.40q).Valid() = %v, encoding/json.Valid says %v", c, got, want)
		}
	}
}

// FuzzJSONValid compares JSON.Valid with encoding/json.Valid on any input
// (go test -fuzz FuzzJSONValid).
func FuzzJSONValid(f *testing.F) {
	for _, c := range jsonValidCases {
		f.Add(c)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := JSON(s).Valid(), json.Valid([]byte(s)); got != want {
			t.Fatalf("JSON(%q).Valid() = %v, encoding/json.Valid says %v", s, got, want)
		}
	})
}

func BenchmarkJSONValid(b *testing.B) {
	doc := JSON(`{"k": 123456, "tags": ["a", "b"], "nested": {"x": 1.5e3, "y": null, "z": "caf\u00e9 \"quoted\""}}`)
	b.Run("tidemark", func(b *testing.B) {
		b.SetBytes(int64(len(doc)))
		for b.Loop() {
			if !doc.Valid() {
				b.Fatal("invalid")
			}
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		b.SetBytes(int64(len(doc)))
		for b.Loop() {
			if !json.Valid([]byte(doc)) {
				b.Fatal("invalid")
			}
		}
	})
}
