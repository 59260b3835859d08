package binlog

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/encoding"
	"golang.org/x/text/encoding/charmap"
	"golang.org/x/text/encoding/korean"
	"golang.org/x/text/encoding/simplifiedchinese"
	"golang.org/x/text/encoding/traditionalchinese"
	"golang.org/x/text/encoding/unicode"
	"golang.org/x/text/encoding/unicode/utf32"

	"tidemark"
)

// Character sets of the binlog's row images (review finding 7). A text
// column's bytes, and an ENUM or SET column's member names in the table
// map, are in the column's character set; the SQL reads of the snapshot
// get them converted to utf8mb4 by the server. So that both paths give the
// same text, the binlog path decodes each character set the server would
// convert, or refuses the table (quarantine, naming table, column and
// character set) when tidemark has no decoder it has checked against the
// server's own conversion (integration TestCharsetZooStreamAndSnapshot).

// textDecoder turns a value's bytes in a column's character set into
// UTF-8, or fails (bytes the character set does not define: the server's
// conversion would give '?', a replacement would give other text).
type textDecoder func(s string) (string, error)

// utf8Charsets need no decoding: the bytes are UTF-8 (checked).
var utf8Charsets = map[string]bool{"utf8mb4": true, "utf8mb3": true, "utf8": true, "ascii": true}

// charsetDecoders are the other character sets tidemark decodes. Left out
// on purpose, so refused: the Japanese ones (sjis, cp932, ujis, eucjpms:
// x/text's tables are the WHATWG ones, whose mappings of several
// characters — the wave dash, the yen sign and backslash — differ from
// MySQL's), gb18030, and the rare single-byte ones (armscii8, dec8,
// geostd8, hp8, keybcs2, macce, swe7, tis620, cp852 …).
var charsetDecoders = map[string]textDecoder{
	"latin1":  decodeLatin1,
	"latin2":  single(charmap.ISO8859_2),
	"latin5":  single(charmap.ISO8859_9),
	"latin7":  single(charmap.ISO8859_13),
	"greek":   single(charmap.ISO8859_7),
	"hebrew":  single(charmap.ISO8859_8),
	"cp1250":  single(charmap.Windows1250),
	"cp1251":  single(charmap.Windows1251),
	"cp1256":  single(charmap.Windows1256),
	"cp1257":  single(charmap.Windows1257),
	"cp866":   single(charmap.CodePage866),
	"koi8r":   single(charmap.KOI8R),
	"koi8u":   single(charmap.KOI8U),
	"gbk":     multi(simplifiedchinese.GBK, true),
	"gb2312":  multi(simplifiedchinese.GBK, true),
	"big5":    multi(traditionalchinese.Big5, true),
	"euckr":   multi(korean.EUCKR, true),
	"ucs2":    multi(unicode.UTF16(unicode.BigEndian, unicode.IgnoreBOM), false),
	"utf16":   multi(unicode.UTF16(unicode.BigEndian, unicode.IgnoreBOM), false),
	"utf16le": multi(unicode.UTF16(unicode.LittleEndian, unicode.IgnoreBOM), false),
	"utf32":   multi(utf32.UTF32(utf32.BigEndian, utf32.IgnoreBOM), false),
}

// errUndefinedBytes is text with bytes its character set does not define.
var errUndefinedBytes = fmt.Errorf("bytes the character set does not define")

func decodeLatin1(s string) (string, error) { return decodeCP1252(s), nil }

func single(cm *charmap.Charmap) textDecoder { return multi(cm, true) }

// multi decodes with enc; asciiSafe says that ASCII bytes are themselves
// (not so in UTF-16 and UTF-32). A U+FFFD in the result is the decoder's
// replacement of undefined bytes: an error.
func multi(enc encoding.Encoding, asciiSafe bool) textDecoder {
	return func(s string) (string, error) {
		if asciiSafe && isASCII(s) {
			return s, nil
		}
		out, err := enc.NewDecoder().String(s)
		if err != nil {
			return "", fmt.Errorf("%w: %w", errUndefinedBytes, err)
		}
		if strings.ContainsRune(out, utf8.RuneError) {
			return "", errUndefinedBytes
		}
		return out, nil
	}
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// loadCharsets reads the server's collation ids and their character sets
// (information_schema.COLLATIONS) once per tailer: a failure stops the
// stream (it is retried), it does not quarantine a table.
func (t *Tailer) loadCharsets(ctx context.Context) error {
	if t.charsets == nil {
		m := map[uint64]string{}
		err := tidemark.Retry(ctx, "read collations", queryRetry, isTransient, t.rl, func(ctx context.Context) error {
			t.stats.SchemaReads.Add(1)
			r, err := t.query(ctx, "SELECT ID, CHARACTER_SET_NAME FROM information_schema.COLLATIONS WHERE ID IS NOT NULL")
			if err != nil {
				return err
			}
			for i := 0; i < r.RowNumber(); i++ {
				id, _ := r.GetUint(i, 0)
				cs, _ := r.GetString(i, 1)
				m[id] = strings.ToLower(cs)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("read collations of source %s: %w", t.cfg.Name, err)
		}
		t.charsets = m
	}
	return nil
}

// decoderFor returns the decoder of a column's collation: nil for UTF-8
// (validated as it is), an error naming the character set when tidemark
// does not decode it.
func (t *Tailer) decoderFor(id tidemark.TableID, column string, coll uint64) (textDecoder, error) {
	if latin1Collations[coll] {
		return decodeLatin1, nil // the common case, without a catalog read
	}
	if coll == 0 {
		return nil, nil
	}
	cs := t.charsets[coll] // loadCharsets ran before
	if cs == "" || utf8Charsets[cs] {
		return nil, nil // unknown to the server: validated as UTF-8
	}
	if d, ok := charsetDecoders[cs]; ok {
		return d, nil
	}
	return nil, fmt.Errorf("decode table map of %s: column %s: character set %s (collation %d) is not decoded by tidemark, and reading it as UTF-8 would give other text than the source holds: convert the column (ALTER TABLE … CONVERT TO CHARACTER SET utf8mb4), or exclude it (source.exclude_columns)", id, column, cs, coll)
}
