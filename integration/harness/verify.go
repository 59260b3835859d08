// Package harness holds the integration tests' fixtures: the local-services
// environment and the demo's workload (both from internal/workload, under
// their old names), a replication fixture (Replica), network faults
// (toxiproxy), and an independent source-versus-target verifier (Compare).
//
// The verifier is deliberately independent of tidemark's own decoding and of
// the verify package (which shares the daemon's schema reader and zone
// config): it reads the source over SQL (DATETIME converted with MariaDB's
// own CONVERT_TZ and time-zone tables, TIMESTAMP read with the session at
// UTC) and the target over SQL, normalizes both per column type, and
// compares row by row. A bug in tidemark's UTC normalization therefore
// cannot hide in the check; this is why the tests keep it as their oracle
// while the demo and `tidemark verify` use the verify package.
package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	"github.com/jackc/pgx/v5"
)

// TableSpec says how to compare one table.
type TableSpec struct {
	Database, Table string
	// TargetSchema is the PostgreSQL schema (default Database).
	TargetSchema string
	// Key is the business key (default: the source primary key).
	Key []string
	// SourceZone is the IANA zone DATETIME columns are written in.
	SourceZone string
	// SoftDelete compares only target rows with _tm_deleted = false.
	SoftDelete bool
}

// Diff is the result of comparing one table.
type Diff struct {
	Table                     string
	SourceRows, TargetRows    int
	Missing, Extra, Changed   int
	DuplicateKeys             int
	SourceChecksum            string
	TargetChecksum            string
	Examples                  []string
	SourceSum, TargetSum      string // SUM of the first DECIMAL column, when any
	SumColumn                 string
	columns                   []column
	sourceRowsMap, targetRows map[string]string
}

// Equal reports whether source and target agree completely.
func (d *Diff) Equal() bool {
	return d.Missing == 0 && d.Extra == 0 && d.Changed == 0 && d.DuplicateKeys == 0 && d.SourceRows == d.TargetRows
}

// String summarizes the diff on one line.
func (d *Diff) String() string {
	return fmt.Sprintf("%s: source %d rows, target %d rows, missing %d, extra %d, changed %d, duplicate keys %d, checksum %s/%s",
		d.Table, d.SourceRows, d.TargetRows, d.Missing, d.Extra, d.Changed, d.DuplicateKeys, d.SourceChecksum, d.TargetChecksum)
}

type column struct {
	name, dataType, columnType string
}

func quoteMy(s string) string { return "`" + strings.ReplaceAll(s, "`", "``") + "`" }
func quotePG(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// Compare reads the whole table on both sides and compares it row by row
// (meant for test and demo sizes, up to a few hundred thousand rows).
func Compare(ctx context.Context, my *client.Conn, pg *pgx.Conn, spec TableSpec) (*Diff, error) {
	if spec.TargetSchema == "" {
		spec.TargetSchema = spec.Database
	}
	if spec.SourceZone == "" {
		spec.SourceZone = "UTC"
	}
	name := spec.Database + "." + spec.Table
	r, err := my.Execute(`SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, COLUMN_KEY FROM information_schema.COLUMNS
		WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND EXTRA NOT LIKE '%GENERATED%' ORDER BY ORDINAL_POSITION`, spec.Database, spec.Table)
	if err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", name, err)
	}
	var cols []column
	var pk []string
	for i := 0; i < r.RowNumber(); i++ {
		n, _ := r.GetString(i, 0)
		dt, _ := r.GetString(i, 1)
		ct, _ := r.GetString(i, 2)
		ck, _ := r.GetString(i, 3)
		cols = append(cols, column{n, strings.ToLower(dt), strings.ToLower(ct)})
		if ck == "PRI" {
			pk = append(pk, n)
		}
	}
	if len(cols) == 0 {
		return nil, fmt.Errorf("read columns of %s: table not found", name)
	}
	key := spec.Key
	if len(key) == 0 {
		key = pk
	}
	keyIdx := make([]int, len(key))
	for i, k := range key {
		keyIdx[i] = -1
		for j, c := range cols {
			if c.name == k {
				keyIdx[i] = j
			}
		}
		if keyIdx[i] < 0 {
			return nil, fmt.Errorf("compare %s: key column %s not found", name, k)
		}
	}

	// Source: everything as text, DATETIME converted by the server.
	if _, err := my.Execute("SET time_zone = '+00:00'"); err != nil {
		return nil, fmt.Errorf("set session time zone: %w", err)
	}
	var sel []string
	for _, c := range cols {
		q := quoteMy(c.name)
		switch c.dataType {
		case "datetime":
			sel = append(sel, fmt.Sprintf("DATE_FORMAT(CONVERT_TZ(%s, '%s', 'UTC'), '%%Y-%%m-%%d %%H:%%i:%%s.%%f')", q, strings.ReplaceAll(spec.SourceZone, "'", "")))
		case "timestamp":
			sel = append(sel, fmt.Sprintf("DATE_FORMAT(%s, '%%Y-%%m-%%d %%H:%%i:%%s.%%f')", q))
		case "binary", "varbinary", "blob", "tinyblob", "mediumblob", "longblob":
			sel = append(sel, "LOWER(HEX("+q+"))")
		case "bit":
			sel = append(sel, "CAST("+q+" AS UNSIGNED)")
		case "year":
			// YEAR 0 prints as "0000"; the target holds the number
			sel = append(sel, "CAST("+q+" + 0 AS CHAR)")
		default:
			sel = append(sel, "CAST("+q+" AS CHAR)")
		}
	}
	res, err := my.Execute("SELECT " + strings.Join(sel, ", ") + " FROM " + quoteMy(spec.Database) + "." + quoteMy(spec.Table))
	if err != nil {
		return nil, fmt.Errorf("read source rows of %s: %w", name, err)
	}
	d := &Diff{Table: name, columns: cols, sourceRowsMap: map[string]string{}, targetRows: map[string]string{}}
	sumCol := -1
	for j, c := range cols {
		if c.dataType == "decimal" {
			sumCol = j
			d.SumColumn = c.name
			break
		}
	}
	srcSum, tgtSum := new(big.Rat), new(big.Rat)
	for i := 0; i < res.RowNumber(); i++ {
		vals := make([]*string, len(cols))
		for j := range cols {
			v, err := res.GetValue(i, j)
			if err != nil {
				return nil, err
			}
			if v != nil {
				s, _ := res.GetString(i, j)
				vals[j] = &s
			}
		}
		k, row, err := normalizeRow(cols, keyIdx, vals, false)
		if err != nil {
			return nil, fmt.Errorf("normalize source row of %s: %w", name, err)
		}
		d.sourceRowsMap[k] = row
		if sumCol >= 0 && vals[sumCol] != nil {
			if x, ok := new(big.Rat).SetString(*vals[sumCol]); ok {
				srcSum.Add(srcSum, x)
			}
		}
	}
	d.SourceRows = len(d.sourceRowsMap)

	// Target.
	var tsel []string
	for _, c := range cols {
		q := quotePG(c.name)
		switch c.dataType {
		case "binary", "varbinary", "blob", "tinyblob", "mediumblob", "longblob":
			tsel = append(tsel, "encode("+q+", 'hex')")
		case "datetime", "timestamp":
			tsel = append(tsel, "to_char("+q+" AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')")
		default:
			tsel = append(tsel, q+"::text")
		}
	}
	where := ""
	if spec.SoftDelete {
		where = " WHERE NOT _tm_deleted"
	}
	target := quotePG(spec.TargetSchema) + "." + quotePG(spec.Table)
	rows, err := pg.Query(ctx, "SELECT "+strings.Join(tsel, ", ")+" FROM "+target+where)
	if err != nil {
		return nil, fmt.Errorf("read target rows of %s: %w", target, err)
	}
	seen := map[string]int{}
	for rows.Next() {
		vals := make([]*string, len(cols))
		ptrs := make([]any, len(cols))
		for j := range vals {
			ptrs[j] = &vals[j]
		}
		if err := rows.Scan(ptrs...); err != nil {
			rows.Close()
			return nil, fmt.Errorf("scan target row of %s: %w", target, err)
		}
		k, row, err := normalizeRow(cols, keyIdx, vals, true)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("normalize target row of %s: %w", target, err)
		}
		seen[k]++
		d.targetRows[k] = row
		d.TargetRows++
		if sumCol >= 0 && vals[sumCol] != nil {
			if x, ok := new(big.Rat).SetString(*vals[sumCol]); ok {
				tgtSum.Add(tgtSum, x)
			}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read target rows of %s: %w", target, err)
	}
	for k, n := range seen {
		if n > 1 {
			d.DuplicateKeys++
			d.example("duplicate key " + k)
		}
	}
	for k, sr := range d.sourceRowsMap {
		tr, ok := d.targetRows[k]
		switch {
		case !ok:
			d.Missing++
			d.example("missing " + k)
		case tr != sr:
			d.Changed++
			d.example(fmt.Sprintf("changed %s:\n   source %s\n   target %s", k, sr, tr))
		}
	}
	for k := range d.targetRows {
		if _, ok := d.sourceRowsMap[k]; !ok {
			d.Extra++
			d.example("extra " + k)
		}
	}
	d.SourceChecksum = checksum(d.sourceRowsMap)
	d.TargetChecksum = checksum(d.targetRows)
	if sumCol >= 0 {
		d.SourceSum, d.TargetSum = srcSum.FloatString(2), tgtSum.FloatString(2)
	}
	return d, nil
}

func (d *Diff) example(s string) {
	if len(d.Examples) < 5 {
		d.Examples = append(d.Examples, s)
	}
}

// checksum is an order-independent digest of the normalized rows (FNV-1a
// per row, summed), printed as hex.
func checksum(rows map[string]string) string {
	var sum uint64
	for k, r := range rows {
		h := uint64(14695981039346656037)
		for _, b := range []byte(k + "\x00" + r) {
			h ^= uint64(b)
			h *= 1099511628211
		}
		sum += h
	}
	return fmt.Sprintf("%016x", sum)
}

// normalizeRow turns one row of text values into a canonical key and row.
func normalizeRow(cols []column, keyIdx []int, vals []*string, target bool) (string, string, error) {
	parts := make([]string, len(cols))
	for j, c := range cols {
		s, err := normalizeValue(c, vals[j], target)
		if err != nil {
			return "", "", fmt.Errorf("column %s: %w", c.name, err)
		}
		parts[j] = s
	}
	kp := make([]string, len(keyIdx))
	for i, j := range keyIdx {
		kp[i] = parts[j]
	}
	return strings.Join(kp, "|"), strings.Join(parts, "|"), nil
}

func normalizeValue(c column, v *string, target bool) (string, error) {
	if v == nil {
		return "NULL", nil
	}
	s := *v
	switch c.dataType {
	case "datetime", "timestamp":
		t, err := time.Parse("2006-01-02 15:04:05.000000", s)
		if err != nil {
			return "", err
		}
		return t.UTC().Format(time.RFC3339Nano), nil
	case "decimal":
		x, ok := new(big.Rat).SetString(s)
		if !ok {
			return "", fmt.Errorf("bad decimal %q", s)
		}
		return x.RatString(), nil
	case "float":
		f, err := strconv.ParseFloat(s, 32)
		if err != nil {
			return "", err
		}
		return strconv.FormatFloat(float64(float32(f)), 'g', 6, 32), nil
	case "double":
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return "", err
		}
		if math.IsInf(f, 0) || math.IsNaN(f) {
			return s, nil
		}
		return strconv.FormatFloat(f, 'g', 15, 64), nil
	case "bit":
		if target && strings.Trim(s, "01") == "" && len(s) > 0 {
			n, err := strconv.ParseUint(s, 2, 64)
			if err != nil {
				return "", err
			}
			return strconv.FormatUint(n, 10), nil
		}
		return s, nil
	case "year":
		// MariaDB prints the zero year as 0000, PostgreSQL's integer as 0.
		n, err := strconv.Atoi(s)
		if err != nil {
			return "", fmt.Errorf("bad year %q", s)
		}
		return strconv.Itoa(n), nil
	case "time":
		d, err := parseDuration(s)
		if err != nil {
			return "", err
		}
		return d.String(), nil
	case "json", "longtext":
		if strings.Contains(c.columnType, "longtext") || c.dataType == "json" {
			var x any
			if err := json.Unmarshal([]byte(s), &x); err == nil {
				b, _ := json.Marshal(x)
				return string(b), nil
			}
		}
		return s, nil
	}
	return s, nil
}

// parseDuration parses MariaDB TIME text and PostgreSQL interval text
// ("[-]H:MM:SS[.f]", PostgreSQL may print "-838:59:59" or "1 day 02:00:00").
func parseDuration(s string) (time.Duration, error) {
	var days int64
	if i := strings.Index(s, " day"); i >= 0 {
		n, err := strconv.ParseInt(strings.TrimSpace(s[:i]), 10, 64)
		if err != nil {
			return 0, err
		}
		days = n
		s = strings.TrimSpace(s[strings.Index(s[i+1:], " ")+i+2:])
	}
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	p := strings.Split(s, ":")
	if len(p) != 3 {
		return 0, fmt.Errorf("bad time %q", s)
	}
	h, _ := strconv.ParseInt(p[0], 10, 64)
	m, _ := strconv.ParseInt(p[1], 10, 64)
	sec, err := strconv.ParseFloat(p[2], 64)
	if err != nil {
		return 0, err
	}
	d := time.Duration(h)*time.Hour + time.Duration(m)*time.Minute + time.Duration(math.Round(sec*1e6))*time.Microsecond
	if neg {
		d = -d
	}
	return d + time.Duration(days)*24*time.Hour, nil
}

// RowsOf returns the normalized rows of the side ("source" or "target"),
// sorted by key, for printing examples.
func (d *Diff) RowsOf(side string, limit int) []string {
	m := d.sourceRowsMap
	if side == "target" {
		m = d.targetRows
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if len(keys) > limit {
		keys = keys[:limit]
	}
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = m[k]
	}
	return out
}
