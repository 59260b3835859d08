package postgres

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"tidemark"
)

// Verifier is the target side of `tidemark verify`: read-only SQL that
// computes, inside PostgreSQL, the same canonical row text and 64-bit row
// hash as the source side (binlog.Verifier), over the target table's
// source columns (tidemark's _tm_* columns are left out; in soft-delete mode
// rows with _tm_deleted are not counted, except by DuplicateKeys). See
// tidemark.VerifySide and docs/verify.md.
type Verifier struct {
	s *Sink

	mu   sync.Mutex
	soft map[string]bool // qualified name → has _tm_deleted
}

var _ tidemark.TargetVerifier = (*Verifier)(nil)

// The post-load assertion runs on the sink.
var _ tidemark.AssertTarget = (*Sink)(nil)

// NewVerifier returns the target verifier of a sink (it uses the sink's
// connection pool).
func NewVerifier(s *Sink) *Verifier {
	return &Verifier{s: s, soft: map[string]bool{}}
}

// vArgs collects bind arguments and returns their placeholders.
type vArgs []any

func (a *vArgs) add(v any) string {
	*a = append(*a, v)
	return "$" + strconv.Itoa(len(*a))
}

func vTable(spec *tidemark.VerifySpec) string {
	return tidemark.QuotePostgres(spec.TargetSchema) + "." + tidemark.QuotePostgres(spec.Table.ID.Name)
}

// vCanon returns the PostgreSQL expression of a column's canonical text
// (the same text binlog.Verifier computes in MariaDB). Floats are not in
// it: see vSelect.
func vCanon(c *tidemark.Column, a *vArgs, spec *tidemark.VerifySpec) string {
	q := tidemark.QuotePostgres(c.Name)
	switch c.Kind {
	case tidemark.KindInt, tidemark.KindUint, tidemark.KindYear, tidemark.KindDecimal, tidemark.KindJSON:
		return q + "::text"
	case tidemark.KindBit:
		b := "(lpad(" + q + "::text, 64, '0')::bit(64)::bigint)"
		return "(CASE WHEN " + b + " < 0 THEN (" + b + "::numeric + 18446744073709551616)::text ELSE " + b + "::text END)"
	case tidemark.KindText, tidemark.KindEnum, tidemark.KindSet:
		return q
	case tidemark.KindBytes:
		return "encode(" + q + ", 'hex')"
	case tidemark.KindDate:
		return "to_char(" + q + ", 'YYYY-MM-DD')"
	case tidemark.KindDateTime:
		// The wall clock in the source zone: MariaDB's own DATETIME text.
		return "to_char(" + q + " AT TIME ZONE " + a.add(spec.Zone(c.Name)) + "::text, 'YYYY-MM-DD HH24:MI:SS.US')"
	case tidemark.KindTimestamp:
		return "to_char(" + q + " AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')"
	case tidemark.KindTime:
		return "(extract(epoch FROM " + q + ") * 1000000)::bigint::text"
	case tidemark.KindFloat, tidemark.KindDouble:
		return q + "::float8::text"
	}
	return "NULL::text"
}

// vItem is one selected value: text, or a float scanned exactly (the text
// of a float depends on the session's extra_float_digits).
type vItem struct {
	sql   string
	float bool
}

func vSelect(c *tidemark.Column, a *vArgs, spec *tidemark.VerifySpec) vItem {
	if c.Kind == tidemark.KindFloat || c.Kind == tidemark.KindDouble {
		return vItem{sql: tidemark.QuotePostgres(c.Name) + "::float8", float: true}
	}
	return vItem{sql: vCanon(c, a, spec)}
}

// vRowHash returns the row hash as a signed bigint (the same 64 bits as the
// source's unsigned value).
func vRowHash(spec *tidemark.VerifySpec, a *vArgs) string {
	return "('x' || " + vRowHashHex(spec, a) + ")::bit(64)::bigint"
}

// vRowHashHex is the same 64 bits as 16 hex digits (Digests parses them).
func vRowHashHex(spec *tidemark.VerifySpec, a *vArgs) string {
	var parts []string
	for i := range spec.Table.Columns {
		c := &spec.Table.Columns[i]
		if tidemark.GoCompared(c.Kind) {
			continue
		}
		e := vCanon(c, a, spec)
		if tidemark.LengthPrefixed(c.Kind) {
			parts = append(parts, "COALESCE(octet_length("+e+")::text || ':' || "+e+", 'N')")
		} else {
			parts = append(parts, "COALESCE("+e+", 'N')")
		}
	}
	if len(parts) == 0 {
		parts = []string{"''"}
	}
	return "left(" + sha256Hex(strings.Join(parts, " || '|' || ")) + ", 16)"
}

func vKeyOrder(c *tidemark.Column) string {
	switch c.Kind {
	case tidemark.KindText, tidemark.KindEnum, tidemark.KindSet:
		return tidemark.QuotePostgres(c.Name) + ` COLLATE "C"`
	}
	return tidemark.QuotePostgres(c.Name)
}

// vBound returns the SQL of a key bound given as canonical text.
func vBound(c *tidemark.Column, text string, a *vArgs, spec *tidemark.VerifySpec) (string, error) {
	p := a.add(text)
	switch c.Kind {
	case tidemark.KindInt, tidemark.KindYear:
		return p + "::text::bigint", nil
	case tidemark.KindUint, tidemark.KindDecimal:
		return p + "::text::numeric", nil
	case tidemark.KindDate:
		return p + "::text::date", nil
	case tidemark.KindDateTime:
		return "(" + p + "::text::timestamp AT TIME ZONE " + a.add(spec.Zone(c.Name)) + "::text)", nil
	case tidemark.KindTimestamp:
		return "(" + p + "::text::timestamp AT TIME ZONE 'UTC')", nil
	case tidemark.KindText, tidemark.KindEnum, tidemark.KindSet:
		return p + `::text COLLATE "C"`, nil
	case tidemark.KindBytes:
		return "decode(" + p + "::text, 'hex')", nil
	}
	return "", fmt.Errorf("column %s of kind %s cannot bound a key range", c.Name, c.Kind)
}

// hasSoftDelete reports whether the target table has _tm_deleted.
func (v *Verifier) hasSoftDelete(ctx context.Context, spec *tidemark.VerifySpec) (bool, error) {
	name := vTable(spec)
	v.mu.Lock()
	soft, ok := v.soft[name]
	v.mu.Unlock()
	if ok {
		return soft, nil
	}
	var exists bool
	if err := v.s.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", name).Scan(&exists); err != nil {
		return false, fmt.Errorf("look up target table %s.%s: %w", spec.TargetSchema, spec.Table.ID.Name, redact(err, v.s.secret))
	}
	if !exists {
		return false, fmt.Errorf("verify %s: target table %s.%s does not exist", spec.Table.ID, spec.TargetSchema, spec.Table.ID.Name)
	}
	err := v.s.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = $1::regclass AND attname = $2 AND NOT attisdropped)", name, colDeleted).Scan(&soft)
	if err != nil {
		return false, fmt.Errorf("read columns of target table %s.%s: %w", spec.TargetSchema, spec.Table.ID.Name, redact(err, v.s.secret))
	}
	v.mu.Lock()
	v.soft[name] = soft
	v.mu.Unlock()
	return soft, nil
}

// where builds the predicates of a key range, the event-time window and
// the soft-delete filter.
func (v *Verifier) where(ctx context.Context, spec *tidemark.VerifySpec, r tidemark.KeyRange, a *vArgs) (string, error) {
	if err := spec.Validate(); err != nil {
		return "", err
	}
	soft, err := v.hasSoftDelete(ctx, spec)
	if err != nil {
		return "", err
	}
	var preds []string
	if soft {
		preds = append(preds, "NOT "+tidemark.QuotePostgres(colDeleted))
	}
	if spec.EventTime != "" {
		q := tidemark.QuotePostgres(spec.EventTime)
		if !spec.Since.IsZero() {
			preds = append(preds, q+" >= "+a.add(spec.Since.UTC()))
		}
		if !spec.Until.IsZero() {
			preds = append(preds, q+" < "+a.add(spec.Until.UTC()))
		}
	}
	if (r.Lo != nil || r.Hi != nil) && !spec.Chunked() {
		return "", fmt.Errorf("verify %s: the business key cannot bound a key range", spec.Table.ID)
	}
	for _, side := range []struct {
		b       []string
		greater bool
	}{{r.Lo, true}, {r.Hi, false}} {
		if side.b == nil {
			continue
		}
		if len(side.b) != len(spec.Table.Key) {
			return "", fmt.Errorf("verify %s: key bound has %d values for %d key columns", spec.Table.ID, len(side.b), len(spec.Table.Key))
		}
		cols := make([]string, len(spec.Table.Key))
		bounds := make([]string, len(spec.Table.Key))
		for i, k := range spec.Table.Key {
			c := &spec.Table.Columns[k]
			cols[i] = vKeyOrder(c)
			if bounds[i], err = vBound(c, side.b[i], a, spec); err != nil {
				return "", fmt.Errorf("verify %s: %w", spec.Table.ID, err)
			}
		}
		preds = append(preds, tidemark.LexPredicate(cols, func(i int) string { return bounds[i] }, side.greater))
	}
	if len(preds) == 0 {
		return "", nil
	}
	return " WHERE " + strings.Join(preds, " AND "), nil
}

func (v *Verifier) fail(what string, spec *tidemark.VerifySpec, err error) error {
	return fmt.Errorf("%s %s.%s on target: %w", what, spec.TargetSchema, spec.Table.ID.Name, redact(err, v.s.secret))
}

// Checksum implements tidemark.VerifySide.
func (v *Verifier) Checksum(ctx context.Context, spec *tidemark.VerifySpec, r tidemark.KeyRange) (tidemark.ChunkChecksum, error) {
	var a vArgs
	h := vRowHash(spec, &a)
	w, err := v.where(ctx, spec, r, &a)
	if err != nil {
		return tidemark.ChunkChecksum{}, err
	}
	var n, sum int64
	if err := v.s.pool.QueryRow(ctx, "SELECT count(*), COALESCE(bit_xor("+h+"), 0) FROM "+vTable(spec)+w, a...).Scan(&n, &sum); err != nil {
		return tidemark.ChunkChecksum{}, v.fail("checksum "+r.String()+" of", spec, err)
	}
	return tidemark.ChunkChecksum{Rows: n, Sum: uint64(sum)}, nil
}

// scanItems scans one row of vItems into texts (floats formatted exactly).
func scanItems(rows pgx.Rows, items []vItem, extra ...any) ([]*string, error) {
	texts := make([]*string, len(items))
	floats := make([]*float64, len(items))
	dest := make([]any, 0, len(items)+len(extra))
	dest = append(dest, extra...)
	for i, it := range items {
		if it.float {
			dest = append(dest, &floats[i])
		} else {
			dest = append(dest, &texts[i])
		}
	}
	if err := rows.Scan(dest...); err != nil {
		return nil, err
	}
	for i, it := range items {
		if it.float && floats[i] != nil {
			s := strconv.FormatFloat(*floats[i], 'g', -1, 64)
			texts[i] = &s
		}
	}
	return texts, nil
}

// Digests implements tidemark.VerifySide.
func (v *Verifier) Digests(ctx context.Context, spec *tidemark.VerifySpec, r tidemark.KeyRange) ([]tidemark.RowDigest, error) {
	var a vArgs
	var items []vItem
	for _, k := range spec.Table.Key {
		items = append(items, vItem{sql: vCanon(&spec.Table.Columns[k], &a, spec)})
	}
	goCols := spec.GoColumns()
	for _, i := range goCols {
		items = append(items, vSelect(&spec.Table.Columns[i], &a, spec))
	}
	h := vRowHashHex(spec, &a)
	w, err := v.where(ctx, spec, r, &a)
	if err != nil {
		return nil, err
	}
	sel := []string{h}
	for _, it := range items {
		sel = append(sel, it.sql)
	}
	order := make([]string, len(spec.Table.Key))
	for i, k := range spec.Table.Key {
		order[i] = vKeyOrder(&spec.Table.Columns[k])
	}
	rows, err := v.s.pool.Query(ctx, "SELECT "+strings.Join(sel, ", ")+" FROM "+vTable(spec)+w+" ORDER BY "+strings.Join(order, ", "), a...)
	if err != nil {
		return nil, v.fail("read row digests "+r.String()+" of", spec, err)
	}
	defer rows.Close()
	nk := len(spec.Table.Key)
	var out []tidemark.RowDigest
	for rows.Next() {
		var hex string
		texts, err := scanItems(rows, items, &hex)
		if err != nil {
			return nil, v.fail("read row digests of", spec, err)
		}
		hash, err := strconv.ParseUint(hex, 16, 64)
		if err != nil {
			return nil, fmt.Errorf("read row digests of %s: bad hash %q", spec.Table.ID, hex)
		}
		d := tidemark.RowDigest{Key: make([]string, nk), Hash: hash, Go: texts[nk:]}
		for i := 0; i < nk; i++ {
			if texts[i] != nil {
				d.Key[i] = *texts[i]
			}
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, v.fail("read row digests of", spec, err)
	}
	return out, nil
}

// Rows implements tidemark.VerifySide (one query per key).
func (v *Verifier) Rows(ctx context.Context, spec *tidemark.VerifySpec, keys [][]string) (map[string][]*string, error) {
	out := map[string][]*string{}
	for _, key := range keys {
		if len(key) != len(spec.Table.Key) {
			return nil, fmt.Errorf("read rows of %s: key has %d values for %d key columns", spec.Table.ID, len(key), len(spec.Table.Key))
		}
		var a vArgs
		items := make([]vItem, len(spec.Table.Columns))
		sel := make([]string, len(items))
		for i := range spec.Table.Columns {
			items[i] = vSelect(&spec.Table.Columns[i], &a, spec)
			sel[i] = items[i].sql
		}
		w, err := v.where(ctx, spec, tidemark.KeyRange{}, &a)
		if err != nil {
			return nil, err
		}
		var preds []string
		for i, k := range spec.Table.Key {
			c := &spec.Table.Columns[k]
			if tidemark.RangeKey(c.Kind) {
				b, err := vBound(c, key[i], &a, spec)
				if err != nil {
					return nil, fmt.Errorf("read rows of %s: %w", spec.Table.ID, err)
				}
				preds = append(preds, vKeyOrder(c)+" = "+b)
			} else {
				preds = append(preds, vCanon(c, &a, spec)+" = "+a.add(key[i]))
			}
		}
		if w == "" {
			w = " WHERE " + strings.Join(preds, " AND ")
		} else {
			w += " AND " + strings.Join(preds, " AND ")
		}
		rows, err := v.s.pool.Query(ctx, "SELECT "+strings.Join(sel, ", ")+" FROM "+vTable(spec)+w+" LIMIT 1", a...)
		if err != nil {
			return nil, v.fail("read row of", spec, err)
		}
		if rows.Next() {
			texts, err := scanItems(rows, items)
			if err != nil {
				rows.Close()
				return nil, v.fail("read row of", spec, err)
			}
			out[strings.Join(key, "\x00")] = texts
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, v.fail("read row of", spec, err)
		}
	}
	return out, nil
}

// DailyTotals implements tidemark.VerifySide.
func (v *Verifier) DailyTotals(ctx context.Context, spec *tidemark.VerifySpec, sums []string) ([]tidemark.DayTotals, error) {
	if spec.EventTime == "" {
		return nil, fmt.Errorf("daily totals of %s: no event-time column configured", spec.Table.ID)
	}
	var a vArgs
	w, err := v.where(ctx, spec, tidemark.KeyRange{}, &a)
	if err != nil {
		return nil, err
	}
	sel := []string{"COALESCE(to_char(" + tidemark.QuotePostgres(spec.EventTime) + " AT TIME ZONE 'UTC', 'YYYY-MM-DD'), 'none')", "count(*)"}
	for _, s := range sums {
		if spec.Table.ColumnIndex(s) < 0 {
			return nil, fmt.Errorf("daily totals of %s: column %q not in table", spec.Table.ID, s)
		}
		sel = append(sel, "sum("+tidemark.QuotePostgres(s)+")::text")
	}
	rows, err := v.s.pool.Query(ctx, "SELECT "+strings.Join(sel, ", ")+" FROM "+vTable(spec)+w+" GROUP BY 1 ORDER BY 1", a...)
	if err != nil {
		return nil, v.fail("daily totals of", spec, err)
	}
	defer rows.Close()
	var out []tidemark.DayTotals
	for rows.Next() {
		var d tidemark.DayTotals
		ptrs := make([]*string, len(sums))
		dest := []any{&d.Day, &d.Count}
		for i := range ptrs {
			dest = append(dest, &ptrs[i])
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, v.fail("daily totals of", spec, err)
		}
		d.Sums = make([]string, len(sums))
		for i, p := range ptrs {
			if p != nil {
				d.Sums[i] = *p
			}
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, v.fail("daily totals of", spec, err)
	}
	return out, nil
}

// DuplicateKeys implements tidemark.TargetVerifier: GROUP BY the business
// key HAVING count(*) > 1 over every row (soft-deleted ones included), or,
// with since set, over the keys of the rows loaded since then. It really
// queries: target tables have the key as primary key, so it finds nothing
// unless the table was changed behind tidemark's back — which is the point.
func (v *Verifier) DuplicateKeys(ctx context.Context, spec *tidemark.VerifySpec, since time.Time, limit int) (tidemark.DuplicateReport, error) {
	var rep tidemark.DuplicateReport
	if err := spec.Validate(); err != nil {
		return rep, err
	}
	if limit <= 0 {
		limit = 10
	}
	var a vArgs
	keys := make([]string, len(spec.Table.Key))
	canon := make([]string, len(spec.Table.Key))
	for i, k := range spec.Table.Key {
		keys[i] = tidemark.QuotePostgres(spec.Table.Columns[k].Name)
		canon[i] = vCanon(&spec.Table.Columns[k], &a, spec)
	}
	kl := strings.Join(keys, ", ")
	where := ""
	if !since.IsZero() {
		where = " WHERE (" + kl + ") IN (SELECT " + kl + " FROM " + vTable(spec) + " WHERE " + tidemark.QuotePostgres(colLoadedAt) + " >= " + a.add(since.UTC()) + ")"
	}
	sql := "SELECT " + strings.Join(canon, ", ") + ", n, count(*) OVER () FROM (SELECT " + kl + ", count(*) AS n FROM " + vTable(spec) + where +
		" GROUP BY " + kl + " HAVING count(*) > 1) d ORDER BY n DESC LIMIT " + a.add(limit)
	rows, err := v.s.pool.Query(ctx, sql, a...)
	if err != nil {
		return rep, v.fail("find duplicate keys in", spec, err)
	}
	defer rows.Close()
	for rows.Next() {
		texts := make([]*string, len(keys))
		var n, groups int64
		dest := make([]any, 0, len(keys)+2)
		for i := range texts {
			dest = append(dest, &texts[i])
		}
		dest = append(dest, &n, &groups)
		if err := rows.Scan(dest...); err != nil {
			return rep, v.fail("find duplicate keys in", spec, err)
		}
		dk := tidemark.DuplicateKey{Key: make([]string, len(keys)), Rows: n}
		for i, t := range texts {
			if t != nil {
				dk.Key[i] = *t
			} else {
				dk.Key[i] = "NULL"
			}
		}
		rep.Examples = append(rep.Examples, dk)
		rep.Groups = groups
	}
	if err := rows.Err(); err != nil {
		return rep, v.fail("find duplicate keys in", spec, err)
	}
	return rep, nil
}

// targetSchema returns the target schema of a source table.
func (s *Sink) targetSchema(id tidemark.TableID) string {
	if s.cfg.TargetSchema != "" {
		return s.cfg.TargetSchema
	}
	return id.Database
}

// AppliedTables returns the source tables the sink has applied changes to
// since it was opened (one schema per table), sorted by name: the tables a
// scheduled post-load assertion checks.
func (s *Sink) AppliedTables() []*tidemark.Table {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[tidemark.TableID]*tidemark.Table{}
	for k, d := range s.defs {
		if s.ensured[k] {
			seen[k.id] = d.table
		}
	}
	out := make([]*tidemark.Table, 0, len(seen))
	for _, t := range seen {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID.String() < out[j].ID.String() })
	return out
}

// AssertNoDuplicateKeys is the post-load assertion: it returns an error
// wrapping tidemark.ErrDuplicateKeys, naming the target table and the first
// keys, when the target holds a business key more than once — among every
// row (since zero) or among the keys of the rows loaded at or after since
// (PostgreSQL's clock, _tm_loaded_at). It scans the table.
//
// A lost connection, a server restart and the like are retried with the
// sink's retry policy (soak seed 567077772393: a first-run snapshot
// stopped on "unexpected EOF" while PostgreSQL restarted). An attempt is
// not bounded by apply_timeout: the scan of a large table may rightly
// take longer.
func (s *Sink) AssertNoDuplicateKeys(ctx context.Context, t *tidemark.Table, since time.Time) error {
	spec := &tidemark.VerifySpec{Table: t, TargetSchema: s.targetSchema(t.ID)}
	var rep tidemark.DuplicateReport
	err := tidemark.Retry(ctx, "assert no duplicate keys in "+spec.TargetSchema+"."+t.ID.Name, s.cfg.Retry, retryable, s.rlog, func(ctx context.Context) error {
		var err error
		rep, err = NewVerifier(s).DuplicateKeys(ctx, spec, since, 5)
		return err
	})
	if err != nil {
		return err
	}
	return rep.Err(spec.TargetSchema + "." + t.ID.Name)
}

// TableStatuses reads what the target knows about the tables of source:
// every table in schemas (all non-system schemas when empty) that has
// tidemark's metadata columns, with its catch-up watermark (from the
// watermarks table in the control schema) and the lag of its newest row.
// Finding the newest row scans the table (there is no index on
// _tm_loaded_at).
func (s *Sink) TableStatuses(ctx context.Context, source string, schemas []string) ([]tidemark.TableStatus, error) {
	controlSchema := s.cfg.Checkpoints.Schema() // valid: checkpoint.New checked it
	rows, err := s.pool.Query(ctx, `SELECT n.nspname, c.relname, c.reltuples::bigint
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND n.nspname NOT LIKE 'pg\_%' AND n.nspname <> 'information_schema' AND n.nspname <> $1
  AND (coalesce(cardinality($2::text[]), 0) = 0 OR n.nspname = ANY($2::text[]))
  AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = $3 AND NOT a.attisdropped)
  AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = $4 AND NOT a.attisdropped)
ORDER BY 1, 2`, controlSchema, schemas, colSeq, colLoadedAt)
	if err != nil {
		return nil, fmt.Errorf("list target tables: %w", redact(err, s.secret))
	}
	var out []tidemark.TableStatus
	for rows.Next() {
		var st tidemark.TableStatus
		if err := rows.Scan(&st.Schema, &st.Name, &st.Rows); err != nil {
			rows.Close()
			return nil, fmt.Errorf("list target tables: %w", redact(err, s.secret))
		}
		out = append(out, st)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list target tables: %w", redact(err, s.secret))
	}
	// Watermarks, mapped to target tables like the sink maps them.
	wm := map[[2]string]time.Time{}
	var haveWM bool
	if err := s.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", tidemark.QuotePostgres(controlSchema)+".watermarks").Scan(&haveWM); err != nil {
		return nil, fmt.Errorf("look up watermarks: %w", redact(err, s.secret))
	}
	if haveWM {
		wrows, err := s.pool.Query(ctx, "SELECT database, table_name, value FROM "+tidemark.QuotePostgres(controlSchema)+".watermarks WHERE source = $1", source)
		if err != nil {
			return nil, fmt.Errorf("read watermarks of %s: %w", source, redact(err, s.secret))
		}
		for wrows.Next() {
			var db, name string
			var val time.Time
			if err := wrows.Scan(&db, &name, &val); err != nil {
				wrows.Close()
				return nil, fmt.Errorf("read watermarks of %s: %w", source, redact(err, s.secret))
			}
			wm[[2]string{s.targetSchema(tidemark.TableID{Database: db, Name: name}), name}] = val.UTC()
		}
		wrows.Close()
		if err := wrows.Err(); err != nil {
			return nil, fmt.Errorf("read watermarks of %s: %w", source, redact(err, s.secret))
		}
	}
	for i := range out {
		st := &out[i]
		st.Watermark = wm[[2]string{st.Schema, st.Name}]
		if err := tidemark.CheckIdentifier("table", st.Name); err != nil {
			continue
		}
		var commit, loaded *time.Time
		err := s.pool.QueryRow(ctx, "SELECT "+tidemark.QuotePostgres(colCommitTime)+", "+tidemark.QuotePostgres(colLoadedAt)+" FROM "+tidemark.QuotePostgres(st.Schema)+"."+tidemark.QuotePostgres(st.Name)+
			" WHERE "+tidemark.QuotePostgres(colCommitTime)+" IS NOT NULL ORDER BY "+tidemark.QuotePostgres(colLoadedAt)+" DESC LIMIT 1").Scan(&commit, &loaded)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("read lag of %s.%s: %w", st.Schema, st.Name, redact(err, s.secret))
		}
		if commit != nil && loaded != nil {
			st.LastCommit, st.LastLoaded = commit.UTC(), loaded.UTC()
			st.Lag = st.LastLoaded.Sub(st.LastCommit)
		}
	}
	return out, nil
}

// Now returns PostgreSQL's clock (UTC), to measure clock skew.
func (s *Sink) Now(ctx context.Context) (time.Time, error) {
	var t time.Time
	if err := s.pool.QueryRow(ctx, "SELECT now()").Scan(&t); err != nil {
		return time.Time{}, fmt.Errorf("read target clock: %w", redact(err, s.secret))
	}
	return t.UTC(), nil
}

// sha256Hex is the lower-case hex SHA-256 of a text expression's UTF-8
// bytes: what the source's SHA2(…, 256) computes over the same text (MD5 is
// gone from MySQL 9.6).
func sha256Hex(text string) string {
	return "encode(sha256(convert_to(" + text + ", 'UTF8')), 'hex')"
}
