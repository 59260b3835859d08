package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// zooTable is a table of every MariaDB column type tidemark replicates, with
// the fixed-length ones (BINARY, CHAR in multi-byte character sets, BIT,
// YEAR, ENUM/SET with ordinals past 255) in several widths.
func zooTable() string {
	var enum, set []string
	for i := 1; i <= 300; i++ {
		enum = append(enum, fmt.Sprintf("'e%03d'", i))
	}
	for i := 1; i <= 64; i++ {
		set = append(set, fmt.Sprintf("'s%02d'", i))
	}
	return `CREATE TABLE zoo (
		id INT NOT NULL PRIMARY KEY,
		ti TINYINT, tu TINYINT UNSIGNED, si SMALLINT, su SMALLINT UNSIGNED, mi MEDIUMINT, mu MEDIUMINT UNSIGNED,
		ii INT, iu INT UNSIGNED, bi BIGINT, bu BIGINT UNSIGNED,
		d DECIMAL(65,30), d2 DECIMAL(5,2), f FLOAT, dbl DOUBLE,
		bt1 BIT(1), bt10 BIT(10), bt64 BIT(64), y YEAR,
		dt DATE, tm TIME(6), tm0 TIME, dtm DATETIME(6), dtm0 DATETIME, ts TIMESTAMP(6) NULL,
		c1 CHAR(1), c8 CHAR(8) CHARACTER SET utf8mb4, c255 CHAR(255) CHARACTER SET utf8mb4, cl CHAR(8) CHARACTER SET latin1,
		c3 CHAR(10) CHARACTER SET utf8mb3,
		vc VARCHAR(300) CHARACTER SET utf8mb4, vl VARCHAR(20) CHARACTER SET latin1,
		tt TINYTEXT, tx TEXT, mt MEDIUMTEXT, lt LONGTEXT,
		bn1 BINARY(1), bn8 BINARY(8), bn255 BINARY(255), vb VARBINARY(20),
		tb TINYBLOB, bl BLOB, mb MEDIUMBLOB, lb LONGBLOB,
		e ENUM('a','b','c'), e300 ENUM(` + strings.Join(enum, ",") + `),
		st SET('x','y','z'), s64 SET(` + strings.Join(set, ",") + `),
		j JSON
	) DEFAULT CHARSET=utf8mb4`
}

// zooRows are the rows: minima, maxima, zeros, empties, NULLs, pad bytes,
// trailing spaces, multi-byte text and the highest enum/set members.
func zooRows() []string {
	rows := []string{
		// minima
		`(1, -128, 0, -32768, 0, -8388608, 0, -2147483648, 0, -9223372036854775808, 0,
		  '-99999999999999999999999999999999999.999999999999999999999999999999', -999.99, -3.40282e38, -1.7976931348623157e308,
		  b'0', b'0', b'0', 1901, '1000-01-01', '-838:59:59.000000', '-838:59:59', '1000-01-01 00:00:00', '1000-01-01 00:00:00', '1970-01-01 00:00:01',
		  '', '', '', '', '', '', '', '', '', '', '',
		  X'00', X'0000000000000000', X'00', X'', X'', X'', X'', X'',
		  'a', 'e001', '', '', '[]')`,
		// maxima
		`(2, 127, 255, 32767, 65535, 8388607, 16777215, 2147483647, 4294967295, 9223372036854775807, 18446744073709551615,
		  '99999999999999999999999999999999999.999999999999999999999999999999', 999.99, 3.40282e38, 1.7976931348623157e308,
		  b'1', b'1111111111', b'1111111111111111111111111111111111111111111111111111111111111111', 2155, '9999-12-31', '838:59:59.000000', '838:59:59',
		  '9999-12-31 23:59:59.999999', '9999-12-31 23:59:59', '2038-01-19 03:14:07.999999',
		  'z', '🐳🐳🐳🐳🐳🐳🐳🐳', REPEAT('🐳', 255), 'ÿÿÿÿÿÿÿÿ', 'ééééééééé€', REPEAT('€', 300), REPEAT('ÿ', 20),
		  REPEAT('x', 255), REPEAT('y', 1000), REPEAT('z', 70000), REPEAT('w', 100000),
		  X'FF', X'FFFFFFFFFFFFFFFF', REPEAT(X'FF', 255), REPEAT(X'FF', 20), REPEAT(X'FF', 255), REPEAT(X'AB', 1000), REPEAT(X'CD', 70000), REPEAT(X'EF', 100000),
		  'c', 'e300', 'x,y,z', '` + allSet() + `', '{"k": [1, 2.5, "s", null, true, {"n": {}}]}')`,
		// all NULL but the key
		`(3` + strings.Repeat(", NULL", 48) + `)`,
		// zero bytes at both ends, trailing spaces, ordinals past 255
		`(4, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, '0.000000000000000000000000000001', 0.01, 1.17549e-38, 2.2250738585072014e-308,
		  b'1', b'1000000000', b'1000000000000000000000000000000000000000000000000000000000000000', 2000, '2000-02-29', '00:00:00.000001', '00:00:00',
		  '2000-02-29 12:00:00.000001', '2000-02-29 12:00:00', '2000-02-29 12:00:00.000001',
		  ' ', 'a  ', CONCAT('🐳', SPACE(200)), 'é  ', ' x ', 'trail   ', 'é  ',
		  ' ', 'a\tb\n', 'a|b', CONCAT('x', SPACE(10)),
		  X'00', X'0102000000000000', CONCAT(X'01', REPEAT(X'00', 254)), X'0100', X'00', X'0000', X'000100', X'0001000000',
		  'b', 'e256', 'y', 's64', 'null')`,
		`(5, 1, 128, 1, 32768, 1, 8388608, 1, 2147483648, 1, 9223372036854775808, '-0.5', -0.01, 1.5, -0.0,
		  b'0', b'0000000001', b'0000000000000000000000000000000000000000000000000000000000000001', 1970, '1970-01-01', '-00:00:00.000001', '12:34:56',
		  '1970-01-01 00:00:00.5', '1970-01-01 00:00:00', '2026-11-01 05:30:00',
		  'é', 'é', 'é', 'Ç', '€', '', '',
		  '', '', '', '',
		  X'20', X'0000000000000001', X'20', X'20', X'20', X'', X'', X'',
		  'a', 'e255', 'x,z', 's01,s32,s33,s63,s64', '"text"')`,
	}
	// BINARY(8): every count of trailing zero bytes, and zeros inside.
	for i := 0; i <= 8; i++ {
		lead := strings.Repeat("AB", 8-i)
		rows = append(rows, fmt.Sprintf("(%d"+strings.Repeat(", NULL", 36)+", X'%s', NULL, NULL"+strings.Repeat(", NULL", 9)+")", 10+i, lead))
	}
	return rows
}

func allSet() string {
	var s []string
	for i := 1; i <= 64; i++ {
		s = append(s, fmt.Sprintf("s%02d", i))
	}
	return strings.Join(s, ",")
}

// TestTypeZooStreamAndSnapshot replicates the type zoo once by streaming the
// binlog and once by the snapshot read, into two target schemas, and
// compares each with the source row by row through the independent
// verifier (harness.Compare reads BINARY as hex, BIT as a number, TEXT as
// text): the two paths must both agree with the source. It runs on MariaDB
// and on the real MySQL 9.7.
func TestTypeZooStreamAndSnapshot(t *testing.T) {
	eachSource(t, testTypeZoo)
}

func testTypeZoo(t *testing.T, f *fixture) {
	db := testenv.Name("it_zoo_")
	f.dropLater(t, db, db+"_stream", db+"_snap")
	for _, s := range []string{"_stream", "_snap"} {
		s := s
		t.Cleanup(func() { _, _ = f.pg.Exec(f.ctx, "DROP SCHEMA IF EXISTS "+db+s+" CASCADE") })
	}
	if err := harness.Exec(f.my, "CREATE DATABASE "+db, "USE "+db, zooTable()); err != nil {
		t.Fatal(err)
	}
	// The rows are written while the streaming daemon runs (it snapshots
	// the empty table first): they reach it through the binlog only.
	stmts := []string{"USE " + db, "SET time_zone = '+00:00'", "SET sql_mode = 'STRICT_ALL_TABLES'"}
	for _, r := range zooRows() {
		stmts = append(stmts, "INSERT INTO zoo VALUES "+r)
	}
	// An update and a delete through the binlog too.
	stmts = append(stmts, "UPDATE zoo SET bn8 = X'0000AB0000000000', c8 = 'ü  ' WHERE id = 3", "DELETE FROM zoo WHERE id = 18")
	spec := harness.TableSpec{Database: db, Table: "zoo"}
	for _, run := range []struct {
		suffix string
		stream bool
	}{{"_stream", true}, {"_snap", false}} {
		t.Run(run.suffix[1:], func(t *testing.T) {
			cfg := f.relConfig(t, db+run.suffix, db, relOpts{TargetSchema: db + run.suffix})
			d := f.startDaemon(t, cfg)
			f.caughtUpIn(t, db+run.suffix, d, 2*time.Minute)
			if run.stream {
				if err := harness.Exec(f.my, stmts...); err != nil {
					t.Fatal(err)
				}
				f.caughtUpIn(t, db+run.suffix, d, 2*time.Minute)
			}
			if code := d.stop(t); code != 0 {
				t.Fatalf("exit %d\n%s", code, d.stderr.String())
			}
			log := d.stderr.String()
			want := "rows=0"
			if !run.stream {
				want = fmt.Sprintf("rows=%d", len(zooRows())-1)
			}
			if l := grepLines(log, "table caught up"); !strings.Contains(l, "mode=full") || !strings.Contains(l, want+" ") {
				t.Fatalf("the first snapshot did not read %s:\n%s", want, l)
			}
			spec.TargetSchema = db + run.suffix
			diff, err := harness.Compare(f.ctx, f.my, f.pg, spec)
			if err != nil {
				t.Fatal(err)
			}
			if !diff.Equal() {
				t.Fatalf("%s path: %s\n%s", run.suffix[1:], diff, strings.Join(diff.Examples, "\n"))
			}
			if diff.SourceRows != len(zooRows())-1 {
				t.Fatalf("compared %d rows, want %d", diff.SourceRows, len(zooRows())-1)
			}
			// `tidemark verify` (the verify package, computing each side's
			// canonical text in its own database) agrees on every type.
			code, vout := runBinary(t, 2*time.Minute, []string{"TM_IT_MYSQL_PASSWORD=" + f.env.MySQLPassword, "TM_IT_PG_DSN=" + f.env.PGDSN}, "verify", "--config", cfg)
			if code != 0 || !strings.Contains(vout, "verdict: EQUAL") || !strings.Contains(vout, fmt.Sprintf(" %d ", len(zooRows())-1)) {
				t.Fatalf("%s path: tidemark verify exit %d, want 0 with %d rows:\n%s", run.suffix[1:], code, len(zooRows())-1, vout)
			}
		})
	}
}

// charZooTable has a text column in each character set tidemark decodes
// from the binlog (binlog/charsets.go), and ENUM/SET columns whose member
// names are not ASCII in latin1 and cp1251 (review finding 7: they were
// the table map's raw bytes, and every legacy character set was read as
// UTF-8).
const charZooTable = `CREATE TABLE charzoo (
	id INT NOT NULL PRIMARY KEY,
	e ENUM('Köln','Zürich','Ærø') CHARACTER SET latin1,
	s SET('ä','ö','ü') CHARACTER SET latin1,
	er ENUM('Москва','Київ') CHARACTER SET cp1251,
	vl1 VARCHAR(20) CHARACTER SET latin1,
	l2 VARCHAR(20) CHARACTER SET latin2, l5 VARCHAR(20) CHARACTER SET latin5, l7 VARCHAR(20) CHARACTER SET latin7,
	gr VARCHAR(20) CHARACTER SET greek, he VARCHAR(20) CHARACTER SET hebrew,
	w50 VARCHAR(20) CHARACTER SET cp1250, w51 VARCHAR(20) CHARACTER SET cp1251,
	w56 VARCHAR(20) CHARACTER SET cp1256, w57 VARCHAR(20) CHARACTER SET cp1257,
	d866 VARCHAR(20) CHARACTER SET cp866, k8r VARCHAR(20) CHARACTER SET koi8r, k8u VARCHAR(20) CHARACTER SET koi8u,
	gbk VARCHAR(20) CHARACTER SET gbk, gb VARCHAR(20) CHARACTER SET gb2312, b5 VARCHAR(20) CHARACTER SET big5,
	kr VARCHAR(20) CHARACTER SET euckr,
	u2 VARCHAR(20) CHARACTER SET ucs2, c2 CHAR(4) CHARACTER SET ucs2, u16 VARCHAR(20) CHARACTER SET utf16,
	u16le VARCHAR(20) CHARACTER SET utf16le, u32 VARCHAR(20) CHARACTER SET utf32,
	t2 TEXT CHARACTER SET latin2
) DEFAULT CHARSET=utf8mb4`

var charZooRows = []string{
	`(1, 'Zürich', 'ä,ü', 'Київ', 'Ça€', 'ŠšŽžłń', 'ĞğİıŞş', 'ĀāČčŠš', 'Καλημέρα', 'שלום', 'ŠšŽžłń€', 'Привет ёЁ€',
	  'مرحبا', 'ĀāČčĶķ', 'Привет', 'Привет', 'Привіт ґ', '中文测试', '中文', '中文測試', '한국어',
	  'Aé中', 'é', 'A🐳中', 'A🐳', 'A🐳中', 'ĹĄšť')`,
	`(2, 'Köln', 'ö', 'Москва', 'abc', 'abc', 'abc', 'abc', 'abc', 'abc', 'abc', 'abc', 'abc', 'abc', 'abc', 'abc', 'abc',
	  'abc', 'abc', 'abc', 'abc', 'abc', 'ab', 'abc', 'abc', 'abc', 'abc')`,
	`(3` + strings.Repeat(", NULL", 26) + `)`,
}

// TestCharsetZooStreamAndSnapshot: every decoded character set, and
// non-ASCII ENUM/SET members, give the same text through the binlog as
// through the snapshot's SQL read (which the server converts to utf8mb4),
// checked against the source by the independent comparison; a column in a
// character set tidemark does not decode (sjis) quarantines its table on
// the binlog path, naming the table, the column and the character set.
func TestCharsetZooStreamAndSnapshot(t *testing.T) {
	eachSource(t, testCharsetZoo)
}

func testCharsetZoo(t *testing.T, f *fixture) {
	db := testenv.Name("it_czoo_")
	f.dropLater(t, db, db+"_stream", db+"_snap")
	f.forgetStates(t, db+"_stream", db+"_snap")
	for _, s := range []string{"_stream", "_snap"} {
		s := s
		t.Cleanup(func() { _, _ = f.pg.Exec(f.ctx, "DROP SCHEMA IF EXISTS "+db+s+" CASCADE") })
	}
	if err := harness.Exec(f.my, "CREATE DATABASE "+db, "USE "+db, charZooTable,
		"CREATE TABLE sj (id INT PRIMARY KEY, v VARCHAR(10) CHARACTER SET sjis)"); err != nil {
		t.Fatal(err)
	}
	stmts := []string{"USE " + db, "SET NAMES utf8mb4"}
	for _, r := range charZooRows {
		stmts = append(stmts, "INSERT INTO charzoo VALUES "+r)
	}
	stmts = append(stmts, "UPDATE charzoo SET w51 = 'Ёлка', e = 'Ærø', s = 'ä,ö,ü' WHERE id = 2", "INSERT INTO sj VALUES (1, 'ｶﾅ漢字')")
	spec := harness.TableSpec{Database: db, Table: "charzoo"}
	for _, run := range []struct {
		suffix string
		stream bool
	}{{"_stream", true}, {"_snap", false}} {
		t.Run(run.suffix[1:], func(t *testing.T) {
			cfg := f.relConfig(t, db+run.suffix, db, relOpts{TargetSchema: db + run.suffix})
			d := f.startDaemon(t, cfg)
			defer cleanupDaemon(&d)
			f.caughtUpIn(t, db+run.suffix, d, 2*time.Minute)
			if run.stream {
				if err := harness.Exec(f.my, stmts...); err != nil {
					t.Fatal(err)
				}
				f.caughtUpIn(t, db+run.suffix, d, 2*time.Minute)
				mode, reason := f.tableState(t, db+run.suffix, db, "sj")
				if mode != "quarantined" || !strings.Contains(reason, "sjis") || !strings.Contains(reason, "column v") {
					t.Errorf("sj: state %q reason %q, want quarantined naming column v and sjis", mode, reason)
				}
			}
			f.stopOK(t, d)
			if mode, reason := f.tableState(t, db+run.suffix, db, "charzoo"); mode == "quarantined" {
				t.Fatalf("%s path: charzoo quarantined: %s", run.suffix[1:], reason)
			}
			spec.TargetSchema = db + run.suffix
			diff, err := harness.Compare(f.ctx, f.my, f.pg, spec)
			if err != nil {
				t.Fatal(err)
			}
			if !diff.Equal() || diff.SourceRows != len(charZooRows) {
				t.Fatalf("%s path: %s\n%s\n%s", run.suffix[1:], diff, strings.Join(diff.Examples, "\n"), grepLines(d.stderr.String(), "level=ERROR"))
			}
		})
	}
}
