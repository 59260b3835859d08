package binlog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"tidemark"
)

// Verifier is the source side of `tidemark verify` and `tidemark status`:
// read-only SQL on the source that computes canonical row hashes, chunk
// checksums and daily totals inside MariaDB (see tidemark.VerifySide and
// docs/verify.md), and reads the binlog retention of a position.
//
// It keeps a connection per concurrent query (the verify engine reads two
// chunks at once); each session runs with time_zone '+00:00' (so TIMESTAMP
// values read as UTC) and utf8mb4.
type Verifier struct {
	cfg Config
	sql *sqlConns
}

var _ tidemark.SourceVerifier = (*Verifier)(nil)

// NewVerifier validates cfg and returns a Verifier. It connects on first
// use.
func NewVerifier(cfg Config) (*Verifier, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	v := &Verifier{cfg: cfg}
	v.sql = &sqlConns{cfg: &v.cfg, purpose: "verify session",
		setup: []string{"SET time_zone = '+00:00'", "SET NAMES utf8mb4", "SET SESSION group_concat_max_len = 1048576"}}
	return v, nil
}

// Close closes the idle connections (call it when no query runs).
func (v *Verifier) Close() error { return v.sql.close() }

// exec runs one statement on a connection of its own.
func (v *Verifier) exec(ctx context.Context, q string, args ...any) (*mysql.Result, error) {
	return v.sql.exec(ctx, q, args...)
}

// Tables lists the base tables the config includes.
func (v *Verifier) Tables(ctx context.Context) ([]tidemark.TableID, error) {
	r, err := v.exec(ctx, "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE = 'BASE TABLE' ORDER BY TABLE_SCHEMA, TABLE_NAME")
	if err != nil {
		return nil, fmt.Errorf("list tables of source %s: %w", v.cfg.Name, err)
	}
	var out []tidemark.TableID
	for i := 0; i < r.RowNumber(); i++ {
		db, _ := r.GetString(i, 0)
		name, _ := r.GetString(i, 1)
		if v.cfg.included(db, name) {
			out = append(out, tidemark.TableID{Database: db, Name: name})
		}
	}
	return out, nil
}

// Table reads the current schema of a source table (readSchema): columns in
// order, their kinds as the tailer maps them, and the configured business
// key or the primary key.
func (v *Verifier) Table(ctx context.Context, id tidemark.TableID) (*tidemark.Table, error) {
	var json map[string]bool
	if v.cfg.Flavor == FlavorMariaDB {
		var err error
		if json, err = readJSONColumns(ctx, v.exec, id); err != nil {
			return nil, fmt.Errorf("read check constraints of %s: %w", id, err)
		}
	}
	return readSchema(ctx, &v.cfg, v.exec, json, id)
}

func vTable(spec *tidemark.VerifySpec) string {
	return tidemark.QuoteMySQL(spec.Table.ID.Database) + "." + tidemark.QuoteMySQL(spec.Table.ID.Name)
}

// vZeroGuard returns e, or NULL when the date in column q is a zero date
// (any of year, month, day 0), as the tailer reads it with zero_dates: null.
func vZeroGuard(q, e string) string {
	return fmt.Sprintf("IF(YEAR(%s) = 0 OR MONTH(%s) = 0 OR DAYOFMONTH(%s) = 0, NULL, %s)", q, q, q, e)
}

// vCanon returns the source's expression of a column's canonical text
// (tidemark's canonical forms; see tidemark.GoCompared for float and JSON,
// which are returned as exact text for comparison in Go).
func vCanon(c *tidemark.Column, flavor string) string {
	q := tidemark.QuoteMySQL(c.Name)
	switch c.Kind {
	case tidemark.KindInt, tidemark.KindUint, tidemark.KindDecimal:
		return "CAST(" + q + " AS CHAR)"
	case tidemark.KindYear, tidemark.KindBit:
		return "CAST(" + q + "+0 AS CHAR)"
	case tidemark.KindText, tidemark.KindEnum, tidemark.KindSet, tidemark.KindJSON:
		return "CONVERT(" + q + " USING utf8mb4)"
	case tidemark.KindBytes:
		return "LOWER(HEX(" + q + "))"
	case tidemark.KindDate:
		return vZeroGuard(q, "DATE_FORMAT("+q+", '%Y-%m-%d')")
	case tidemark.KindDateTime, tidemark.KindTimestamp:
		// DATETIME: the wall clock as stored (the target converts back to
		// the source zone). TIMESTAMP: UTC (session time_zone '+00:00').
		return vZeroGuard(q, "DATE_FORMAT("+q+", '%Y-%m-%d %H:%i:%s.%f')")
	case tidemark.KindTime:
		// Microseconds, signed. Not TIME_TO_SEC(q) * 1000000: MySQL's
		// TIME_TO_SEC drops the fraction (MariaDB's keeps it), so
		// '-00:00:00.000001' read 0. HOUR…MICROSECOND are magnitudes.
		return fmt.Sprintf("CAST(CAST(IF(%[1]s < TIME'00:00:00', -1, 1) * ((HOUR(%[1]s) * 3600 + MINUTE(%[1]s) * 60 + SECOND(%[1]s)) * 1000000 + MICROSECOND(%[1]s)) AS SIGNED) AS CHAR)", q)
	case tidemark.KindFloat, tidemark.KindDouble:
		// Exact: FLOAT widens to DOUBLE without loss. MariaDB prints a
		// DOUBLE as the shortest text that reads back to the same value;
		// MySQL's CAST(… AS CHAR) keeps 16 digits (-1.797693134862316e308,
		// another double), its JSON text the shortest round trip.
		if flavor == FlavorMySQL {
			return "CAST(CAST(CAST(" + q + " AS DOUBLE) AS JSON) AS CHAR)"
		}
		return "CAST(CAST(" + q + " AS DOUBLE) AS CHAR)"
	}
	return "NULL"
}

// vRowHash returns the expression of a row's 64-bit hash: the first 16 hex
// digits of the SHA-256 of the canonical texts of every column not compared in
// Go, in tidemark.RowHashInput's encoding.
func vRowHash(t *tidemark.Table, flavor string) string {
	return "CAST(CONV(" + vRowHashHex(t, flavor) + ", 16, 10) AS UNSIGNED)"
}

// vRowHashHex is the same 64 bits as 16 hex digits: cheaper for the server
// to produce per row than a number (Digests parses them).
func vRowHashHex(t *tidemark.Table, flavor string) string {
	var parts []string
	for i := range t.Columns {
		c := &t.Columns[i]
		if tidemark.GoCompared(c.Kind) {
			continue
		}
		b := "CAST(" + vCanon(c, flavor) + " AS BINARY)"
		if tidemark.LengthPrefixed(c.Kind) {
			parts = append(parts, "IFNULL(CONCAT(LENGTH("+b+"), ':', "+b+"), 'N')")
		} else {
			parts = append(parts, "IFNULL("+b+", 'N')")
		}
	}
	if len(parts) == 0 {
		parts = []string{"''"}
	}
	return "LEFT(SHA2(CONCAT_WS('|', " + strings.Join(parts, ", ") + "), 256), 16)"
}

// vKeyOrder returns the expression a key column is ordered and compared by:
// the value itself, or its UTF-8 bytes for text-like kinds (so MariaDB and
// PostgreSQL order them alike).
func vKeyOrder(c *tidemark.Column) string {
	q := tidemark.QuoteMySQL(c.Name)
	switch c.Kind {
	case tidemark.KindText, tidemark.KindEnum, tidemark.KindSet:
		return "CAST(CONVERT(" + q + " USING utf8mb4) AS BINARY)"
	}
	return q
}

// vQuery accumulates SQL text and its bind arguments.
type vQuery struct {
	where []string
	args  []any
}

// bound returns the SQL of a key bound value for column c, recording the
// argument parsed from its canonical text.
func (q *vQuery) bound(c *tidemark.Column, text string) (string, error) {
	switch c.Kind {
	case tidemark.KindInt, tidemark.KindYear:
		n, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return "", fmt.Errorf("key bound %q of column %s: %w", text, c.Name, err)
		}
		q.args = append(q.args, n)
		return "?", nil
	case tidemark.KindUint:
		n, err := strconv.ParseUint(text, 10, 64)
		if err != nil {
			return "", fmt.Errorf("key bound %q of column %s: %w", text, c.Name, err)
		}
		q.args = append(q.args, n)
		return "?", nil
	case tidemark.KindDecimal:
		q.args = append(q.args, text)
		p, s := c.Precision, c.Scale
		if p == 0 {
			p, s = 65, 30
		}
		return fmt.Sprintf("CAST(? AS DECIMAL(%d,%d))", p, s), nil
	case tidemark.KindDate:
		q.args = append(q.args, text)
		return "CAST(? AS DATE)", nil
	case tidemark.KindDateTime, tidemark.KindTimestamp:
		q.args = append(q.args, text)
		return "CAST(? AS DATETIME(6))", nil
	case tidemark.KindText, tidemark.KindEnum, tidemark.KindSet:
		q.args = append(q.args, text)
		return "CAST(? AS BINARY)", nil
	case tidemark.KindBytes:
		q.args = append(q.args, text)
		return "UNHEX(?)", nil
	}
	return "", fmt.Errorf("column %s of kind %s cannot bound a key range", c.Name, c.Kind)
}

// keyPred adds (key) > lo or (key) <= hi.
func (q *vQuery) keyPred(t *tidemark.Table, bound []string, greater bool) error {
	if bound == nil {
		return nil
	}
	if len(bound) != len(t.Key) {
		return fmt.Errorf("key bound has %d values for %d key columns", len(bound), len(t.Key))
	}
	cols := make([]string, len(t.Key))
	for i, k := range t.Key {
		cols[i] = vKeyOrder(&t.Columns[k])
	}
	var err error
	sql := tidemark.LexPredicate(cols, func(i int) string {
		s, e := q.bound(&t.Columns[t.Key[i]], bound[i])
		if e != nil && err == nil {
			err = e
		}
		return s
	}, greater)
	if err != nil {
		return err
	}
	q.where = append(q.where, sql)
	return nil
}

// window adds the event-time window of the spec.
func (q *vQuery) window(spec *tidemark.VerifySpec) error {
	if spec.EventTime == "" || (spec.Since.IsZero() && spec.Until.IsZero()) {
		return nil
	}
	i := spec.Table.ColumnIndex(spec.EventTime)
	c := &spec.Table.Columns[i]
	conv := func(t time.Time) (string, error) {
		t = t.UTC()
		if c.Kind == tidemark.KindDateTime {
			loc, err := time.LoadLocation(spec.Zone(c.Name))
			if err != nil {
				return "", fmt.Errorf("zone of %s.%s: %w", spec.Table.ID, c.Name, err)
			}
			t = tidemark.ZonePolicy{Location: loc}.ToLocal(t)
		}
		return t.Format("2006-01-02 15:04:05.000000"), nil
	}
	qc := tidemark.QuoteMySQL(c.Name)
	if !spec.Since.IsZero() {
		s, err := conv(spec.Since)
		if err != nil {
			return err
		}
		q.where = append(q.where, qc+" >= CAST(? AS DATETIME(6))")
		q.args = append(q.args, s)
	}
	if !spec.Until.IsZero() {
		s, err := conv(spec.Until)
		if err != nil {
			return err
		}
		q.where = append(q.where, qc+" < CAST(? AS DATETIME(6))")
		q.args = append(q.args, s)
	}
	return nil
}

func (q *vQuery) whereSQL() string {
	if len(q.where) == 0 {
		return ""
	}
	return " WHERE " + strings.Join(q.where, " AND ")
}

// vRangeQuery builds the predicates of a key range and the spec's window.
func vRangeQuery(spec *tidemark.VerifySpec, r tidemark.KeyRange) (*vQuery, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	q := &vQuery{}
	if err := q.window(spec); err != nil {
		return nil, err
	}
	if (r.Lo != nil || r.Hi != nil) && !spec.Chunked() {
		return nil, fmt.Errorf("verify %s: the business key cannot bound a key range", spec.Table.ID)
	}
	if err := q.keyPred(spec.Table, r.Lo, true); err != nil {
		return nil, fmt.Errorf("verify %s: %w", spec.Table.ID, err)
	}
	if err := q.keyPred(spec.Table, r.Hi, false); err != nil {
		return nil, fmt.Errorf("verify %s: %w", spec.Table.ID, err)
	}
	return q, nil
}

func vKeyCanon(t *tidemark.Table, flavor string) []string {
	out := make([]string, len(t.Key))
	for i, k := range t.Key {
		out[i] = vCanon(&t.Columns[k], flavor)
	}
	return out
}

// vNullable returns the text of a result value, nil for NULL.
func vNullable(r *mysql.Result, row, col int) (*string, error) {
	v, err := r.GetValue(row, col)
	if err != nil {
		return nil, err
	}
	if v == nil {
		return nil, nil
	}
	s, err := r.GetString(row, col)
	if err != nil {
		return nil, err
	}
	return &s, nil
}

// vOrderBy orders rows by the business key as both databases do.
func vOrderBy(t *tidemark.Table) string {
	order := make([]string, len(t.Key))
	for i, k := range t.Key {
		order[i] = vKeyOrder(&t.Columns[k])
	}
	return " ORDER BY " + strings.Join(order, ", ")
}

// NextBound implements tidemark.SourceVerifier with keyset pagination:
// the key rows-1 rows after lo, in business-key order.
func (v *Verifier) NextBound(ctx context.Context, spec *tidemark.VerifySpec, lo []string, rows int) ([]string, bool, error) {
	if rows < 1 {
		return nil, false, fmt.Errorf("verify %s: chunk size must be ≥ 1", spec.Table.ID)
	}
	q, err := vRangeQuery(spec, tidemark.KeyRange{Lo: lo})
	if err != nil {
		return nil, false, err
	}
	sql := "SELECT " + strings.Join(vKeyCanon(spec.Table, v.cfg.Flavor), ", ") + " FROM " + vTable(spec) + q.whereSQL() +
		vOrderBy(spec.Table) + " LIMIT 1 OFFSET ?"
	r, err := v.exec(ctx, sql, append(q.args, int64(rows-1))...)
	if err != nil {
		return nil, false, fmt.Errorf("read chunk bound of %s after %v: %w", spec.Table.ID, lo, err)
	}
	if r.RowNumber() == 0 {
		return nil, false, nil
	}
	hi := make([]string, len(spec.Table.Key))
	for i := range hi {
		hi[i], _ = r.GetString(0, i)
	}
	return hi, true, nil
}

// Checksum implements tidemark.VerifySide.
func (v *Verifier) Checksum(ctx context.Context, spec *tidemark.VerifySpec, kr tidemark.KeyRange) (tidemark.ChunkChecksum, error) {
	q, err := vRangeQuery(spec, kr)
	if err != nil {
		return tidemark.ChunkChecksum{}, err
	}
	sql := "SELECT COUNT(*), CAST(COALESCE(BIT_XOR(" + vRowHash(spec.Table, v.cfg.Flavor) + "), 0) AS CHAR) FROM " + vTable(spec) + q.whereSQL()
	r, err := v.exec(ctx, sql, q.args...)
	if err != nil {
		return tidemark.ChunkChecksum{}, fmt.Errorf("checksum %s %s on source: %w", spec.Table.ID, kr, err)
	}
	n, _ := r.GetInt(0, 0)
	s, _ := r.GetString(0, 1)
	sum, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return tidemark.ChunkChecksum{}, fmt.Errorf("checksum %s %s on source: bad sum %q", spec.Table.ID, kr, s)
	}
	return tidemark.ChunkChecksum{Rows: n, Sum: sum}, nil
}

// Digests implements tidemark.VerifySide.
func (v *Verifier) Digests(ctx context.Context, spec *tidemark.VerifySpec, kr tidemark.KeyRange) ([]tidemark.RowDigest, error) {
	q, err := vRangeQuery(spec, kr)
	if err != nil {
		return nil, err
	}
	sel := vKeyCanon(spec.Table, v.cfg.Flavor)
	sel = append(sel, vRowHashHex(spec.Table, v.cfg.Flavor))
	goCols := spec.GoColumns()
	for _, i := range goCols {
		sel = append(sel, vCanon(&spec.Table.Columns[i], v.cfg.Flavor))
	}
	r, err := v.exec(ctx, "SELECT "+strings.Join(sel, ", ")+" FROM "+vTable(spec)+q.whereSQL()+vOrderBy(spec.Table), q.args...)
	if err != nil {
		return nil, fmt.Errorf("read row digests of %s %s on source: %w", spec.Table.ID, kr, err)
	}
	nk := len(spec.Table.Key)
	out := make([]tidemark.RowDigest, r.RowNumber())
	for i := range out {
		d := tidemark.RowDigest{Key: make([]string, nk), Go: make([]*string, len(goCols))}
		for j := 0; j < nk; j++ {
			d.Key[j], _ = r.GetString(i, j)
		}
		hs, _ := r.GetString(i, nk)
		if d.Hash, err = strconv.ParseUint(hs, 16, 64); err != nil {
			return nil, fmt.Errorf("read row digests of %s on source: bad hash %q", spec.Table.ID, hs)
		}
		for j := range goCols {
			if d.Go[j], err = vNullable(r, i, nk+1+j); err != nil {
				return nil, fmt.Errorf("read row digests of %s on source: %w", spec.Table.ID, err)
			}
		}
		out[i] = d
	}
	return out, nil
}

// Rows implements tidemark.VerifySide (one query per key).
func (v *Verifier) Rows(ctx context.Context, spec *tidemark.VerifySpec, keys [][]string) (map[string][]*string, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	sel := make([]string, len(spec.Table.Columns))
	for i := range spec.Table.Columns {
		sel[i] = vCanon(&spec.Table.Columns[i], v.cfg.Flavor)
	}
	out := map[string][]*string{}
	for _, key := range keys {
		if len(key) != len(spec.Table.Key) {
			return nil, fmt.Errorf("read rows of %s: key has %d values for %d key columns", spec.Table.ID, len(key), len(spec.Table.Key))
		}
		q := &vQuery{}
		for i, k := range spec.Table.Key {
			c := &spec.Table.Columns[k]
			var b string
			var err error
			if tidemark.RangeKey(c.Kind) {
				b, err = q.bound(c, key[i])
				q.where = append(q.where, vKeyOrder(c)+" = "+b)
			} else {
				// Keys that cannot bound a range (float, time, bit...)
				// are matched by their canonical text.
				q.args = append(q.args, key[i])
				q.where = append(q.where, vCanon(c, v.cfg.Flavor)+" = ?")
			}
			if err != nil {
				return nil, fmt.Errorf("read rows of %s: %w", spec.Table.ID, err)
			}
		}
		r, err := v.exec(ctx, "SELECT "+strings.Join(sel, ", ")+" FROM "+vTable(spec)+q.whereSQL()+" LIMIT 1", q.args...)
		if err != nil {
			return nil, fmt.Errorf("read row %v of %s on source: %w", key, spec.Table.ID, err)
		}
		if r.RowNumber() == 0 {
			continue
		}
		vals := make([]*string, len(sel))
		for j := range sel {
			if vals[j], err = vNullable(r, 0, j); err != nil {
				return nil, fmt.Errorf("read row %v of %s on source: %w", key, spec.Table.ID, err)
			}
		}
		out[strings.Join(key, "\x00")] = vals
	}
	return out, nil
}

// DailyTotals implements tidemark.VerifySide. A DATETIME event time is
// grouped on the server by its wall clock in 15-minute buckets, and each
// bucket is assigned to its UTC day here, with the column's zone (every
// zone offset since 1900 is a multiple of 15 minutes, so a bucket never
// straddles a UTC midnight). Unlike CONVERT_TZ this needs no time-zone
// tables and works outside 1970–2038. A bucket in a DST fold goes to the
// later instant (the tailer's default). Rows with no event time count under
// the day "none".
func (v *Verifier) DailyTotals(ctx context.Context, spec *tidemark.VerifySpec, sums []string) ([]tidemark.DayTotals, error) {
	if spec.EventTime == "" {
		return nil, fmt.Errorf("daily totals of %s: no event-time column configured", spec.Table.ID)
	}
	q, err := vRangeQuery(spec, tidemark.KeyRange{})
	if err != nil {
		return nil, err
	}
	c := &spec.Table.Columns[spec.Table.ColumnIndex(spec.EventTime)]
	qc := tidemark.QuoteMySQL(c.Name)
	// TIMESTAMP reads as UTC (session time_zone); DATETIME is local.
	sel := []string{vZeroGuard(qc, "DATE_FORMAT("+qc+", '%Y-%m-%d %H')"), "FLOOR(MINUTE(" + qc + ") / 15)", "COUNT(*)"}
	for _, s := range sums {
		if spec.Table.ColumnIndex(s) < 0 {
			return nil, fmt.Errorf("daily totals of %s: column %q not in table", spec.Table.ID, s)
		}
		sel = append(sel, "CAST(SUM("+tidemark.QuoteMySQL(s)+") AS CHAR)")
	}
	zone := tidemark.ZonePolicy{Location: time.UTC, Fold: tidemark.ResolveLater, Gap: tidemark.ResolveLater}
	if c.Kind == tidemark.KindDateTime {
		if zone.Location, err = time.LoadLocation(spec.Zone(c.Name)); err != nil {
			return nil, fmt.Errorf("daily totals of %s: zone of %s: %w", spec.Table.ID, c.Name, err)
		}
	}
	sql := "SELECT " + strings.Join(sel, ", ") + " FROM " + vTable(spec) + q.whereSQL() + " GROUP BY 1, 2"
	r, err := v.exec(ctx, sql, q.args...)
	if err != nil {
		return nil, fmt.Errorf("daily totals of %s on source: %w", spec.Table.ID, err)
	}
	type acc struct {
		count int64
		sums  []*big.Rat
		scale []int
	}
	days := map[string]*acc{}
	for i := 0; i < r.RowNumber(); i++ {
		day := "none"
		if hour, _ := vNullable(r, i, 0); hour != nil {
			quarter, _ := r.GetInt(i, 1)
			wall, err := time.Parse("2006-01-02 15", *hour)
			if err != nil {
				return nil, fmt.Errorf("daily totals of %s on source: bad hour %q", spec.Table.ID, *hour)
			}
			u, err := zone.ToUTC(wall.Add(time.Duration(quarter) * 15 * time.Minute))
			if err != nil {
				return nil, fmt.Errorf("daily totals of %s on source: %w", spec.Table.ID, err)
			}
			day = u.Format("2006-01-02")
		}
		a := days[day]
		if a == nil {
			a = &acc{sums: make([]*big.Rat, len(sums)), scale: make([]int, len(sums))}
			days[day] = a
		}
		n, _ := r.GetInt(i, 2)
		a.count += n
		for j := range sums {
			sv, _ := vNullable(r, i, 3+j)
			if sv == nil {
				continue
			}
			x, ok := new(big.Rat).SetString(*sv)
			if !ok {
				return nil, fmt.Errorf("daily totals of %s on source: bad sum %q", spec.Table.ID, *sv)
			}
			if a.sums[j] == nil {
				a.sums[j] = new(big.Rat)
			}
			a.sums[j].Add(a.sums[j], x)
			if _, frac, ok := strings.Cut(*sv, "."); ok && len(frac) > a.scale[j] {
				a.scale[j] = len(frac)
			}
		}
	}
	out := make([]tidemark.DayTotals, 0, len(days))
	for d, a := range days {
		dt := tidemark.DayTotals{Day: d, Count: a.count, Sums: make([]string, len(sums))}
		for j, s := range a.sums {
			if s != nil {
				dt.Sums[j] = s.FloatString(a.scale[j])
			}
		}
		out = append(out, dt)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Day < out[j].Day })
	return out, nil
}

// Now returns the source server's clock (UTC), to measure clock skew.
func (v *Verifier) Now(ctx context.Context) (time.Time, error) {
	r, err := v.exec(ctx, "SELECT CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)")
	if err != nil {
		return time.Time{}, fmt.Errorf("read clock of source %s: %w", v.cfg.Name, err)
	}
	us, _ := r.GetInt(0, 0)
	return time.UnixMicro(us).UTC(), nil
}

// vBinlogFile is one row of SHOW BINARY LOGS.
type vBinlogFile struct {
	name string
	size uint64
}

// Retention reports how long the source keeps the binlog file holding pos
// (see tidemark.Retention for the formula). It reads the expiry setting and
// SHOW BINARY LOGS, and the creation time of the file after pos.File from
// the header of that file's first events, with a short binlog dump under
// replica server id ServerID XOR 0x80000000 (never the daemon's own id,
// which the server would disconnect).
func (v *Verifier) Retention(ctx context.Context, pos tidemark.Position, now time.Time) (tidemark.Retention, error) {
	var ret tidemark.Retention
	if pos.File == "" {
		return ret, fmt.Errorf("binlog retention of %s: position %q has no binlog file", v.cfg.Name, pos)
	}
	ret.File = pos.File
	r, err := v.exec(ctx, "SELECT @@binlog_expire_logs_seconds")
	if err == nil {
		secs, _ := r.GetInt(0, 0)
		ret.Expire = time.Duration(secs) * time.Second
	} else {
		var me *mysql.MyError
		if !errors.As(err, &me) {
			return ret, fmt.Errorf("binlog retention of %s: read binlog_expire_logs_seconds: %w", v.cfg.Name, err)
		}
		r, err = v.exec(ctx, "SELECT CAST(@@expire_logs_days * 86400 AS SIGNED)")
		if err != nil {
			return ret, fmt.Errorf("binlog retention of %s: read expire_logs_days: %w", v.cfg.Name, err)
		}
		secs, _ := r.GetInt(0, 0)
		ret.Expire = time.Duration(secs) * time.Second
	}
	ret.Unbounded = ret.Expire == 0
	r, err = v.exec(ctx, "SHOW BINARY LOGS")
	if err != nil {
		return ret, fmt.Errorf("binlog retention of %s: list binary logs: %w", v.cfg.Name, err)
	}
	var files []vBinlogFile
	for i := 0; i < r.RowNumber(); i++ {
		n, _ := r.GetString(i, 0)
		sz, _ := r.GetUint(i, 1)
		files = append(files, vBinlogFile{n, sz})
	}
	sort.SliceStable(files, func(i, j int) bool {
		a, _ := tidemark.BinlogFileIndex(files[i].name)
		b, _ := tidemark.BinlogFileIndex(files[j].name)
		return a < b
	})
	ret.Files = len(files)
	if len(files) > 0 {
		ret.Oldest = files[0].name
	}
	at := -1
	for i, f := range files {
		if f.name == pos.File {
			at = i
		}
	}
	switch {
	case at < 0:
		ret.Purged = true
		return ret, nil
	case at == len(files)-1:
		ret.Open = true
		ret.Headroom = ret.Expire
		return ret, nil
	}
	created, err := v.fileCreated(ctx, files[at+1].name)
	if err != nil {
		return ret, err
	}
	ret.ClosedAt = created
	if !ret.Unbounded {
		ret.PurgeAfter = created.Add(ret.Expire)
		ret.Headroom = ret.PurgeAfter.Sub(now)
	}
	return ret, nil
}

// fileCreated returns the timestamp of the first events of a binlog file
// (its format description event): when the file was created.
func (v *Verifier) fileCreated(ctx context.Context, file string) (time.Time, error) {
	sc, err := syncerConfig(&v.cfg, v.cfg.ServerID^0x80000000)
	if err != nil {
		return time.Time{}, err
	}
	sc.Logger = slog.New(slog.DiscardHandler)
	syncer := replication.NewBinlogSyncer(sc)
	defer syncer.Close()
	streamer, err := syncer.StartSync(mysql.Position{Name: file, Pos: 4})
	if err != nil {
		return time.Time{}, fmt.Errorf("read creation time of binlog %s: %w", file, replConnErr(&v.cfg, redact(err, v.cfg.Password)))
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for i := 0; i < 8; i++ {
		ev, err := streamer.GetEvent(ctx)
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return time.Time{}, fmt.Errorf("read creation time of binlog %s: %w", file, replConnErr(&v.cfg, redact(err, v.cfg.Password)))
		}
		if ev.Header.Timestamp != 0 {
			return time.Unix(int64(ev.Header.Timestamp), 0).UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("read creation time of binlog %s: no timestamped event at its start", file)
}
