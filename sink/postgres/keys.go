package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"tidemark"
)

var (
	_ tidemark.KeyTarget      = (*Sink)(nil)
	_ tidemark.WatermarkStore = (*Sink)(nil)
)

// Watermark implements tidemark.WatermarkStore.
func (s *Sink) Watermark(ctx context.Context, source string, table tidemark.TableID) (time.Time, bool, error) {
	var (
		w  time.Time
		ok bool
	)
	err := s.retry(ctx, "read watermark of "+table.String(), func(ctx context.Context) error {
		var err error
		w, ok, err = s.cfg.Checkpoints.LoadWatermark(ctx, querier{s.pool}, source, table)
		return redact(err, s.secret)
	})
	return w, ok, redact(err, s.secret)
}

// keyExprs returns the canonical-text expression and the order/compare
// expressions of a table's business key. Both match the source side's
// (binlog.Reader): each part length-prefixed ("3:a|b", "N" for NULL) and
// joined by '|', text ordered by its bytes (COLLATE "C"; the source orders
// the UTF-8 bytes too, not by a PAD SPACE collation).
func keyExprs(d *tableDef) (canon string, order []string, err error) {
	var parts []string
	for _, k := range d.table.Key {
		c := &d.table.Columns[k]
		q := tidemark.QuotePostgres(c.Name)
		switch c.Kind {
		case tidemark.KindInt, tidemark.KindUint, tidemark.KindText:
			e := q + "::text"
			parts = append(parts, "coalesce(octet_length("+e+")::text || ':' || "+e+", 'N')")
			order = append(order, vKeyOrder(c))
		default:
			return "", nil, fmt.Errorf("key diff of %s: key column %s is %s; key diff supports integer and text keys", d.display, c.Name, c.Kind)
		}
	}
	return strings.Join(parts, " || '|' || "), order, nil
}

// keyBound builds "(k1, k2) > ($n, $n+1)" for a cursor; values are bound
// as text and cast to the column type so that uint64 and string cursors
// compare like the column.
func keyBound(d *tableDef, order []string, vals []any, args *[]any, op string) (string, error) {
	if len(vals) != len(d.table.Key) {
		return "", fmt.Errorf("key diff of %s: cursor has %d values for %d key columns", d.display, len(vals), len(d.table.Key))
	}
	ph := make([]string, len(vals))
	for i, v := range vals {
		*args = append(*args, keyText(v))
		c := d.table.Columns[d.table.Key[i]]
		cast := "::" + d.types[d.table.Key[i]]
		if c.Kind == tidemark.KindText {
			cast = `::text COLLATE "C"`
		}
		ph[i] = "$" + strconv.Itoa(len(*args)) + cast
	}
	return "(" + strings.Join(order, ", ") + ") " + op + " (" + strings.Join(ph, ", ") + ")", nil
}

func keyText(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case []byte:
		return string(x)
	case nil:
		return ""
	}
	return fmt.Sprint(v)
}

func (s *Sink) rangeWhere(d *tableDef, order []string, after, upTo []any, args *[]any) (string, error) {
	var where []string
	if after != nil {
		c, err := keyBound(d, order, after, args, ">")
		if err != nil {
			return "", err
		}
		where = append(where, c)
	}
	if upTo != nil {
		c, err := keyBound(d, order, upTo, args, "<=")
		if err != nil {
			return "", err
		}
		where = append(where, c)
	}
	if d.soft {
		where = append(where, "NOT "+tidemark.QuotePostgres(colDeleted))
	}
	if len(where) == 0 {
		return "", nil
	}
	return " WHERE " + strings.Join(where, " AND "), nil
}

// KeyRangeSum implements tidemark.KeyTarget. A missing target table has no
// keys.
func (s *Sink) KeyRangeSum(ctx context.Context, table *tidemark.Table, after, upTo []any) (tidemark.KeySum, error) {
	d, _, err := s.def(table)
	if err != nil {
		return tidemark.KeySum{}, err
	}
	canon, order, err := keyExprs(d)
	if err != nil {
		return tidemark.KeySum{}, err
	}
	var args []any
	where, err := s.rangeWhere(d, order, after, upTo, &args)
	if err != nil {
		return tidemark.KeySum{}, err
	}
	q := "SELECT count(*), coalesce(sum(('x' || substr(" + sha256Hex(canon) + ", 1, 15))::bit(60)::bigint), 0)::text FROM " + d.qname + where
	var sum tidemark.KeySum
	err = s.retry(ctx, "sum keys of "+d.display, func(ctx context.Context) error {
		return s.pool.QueryRow(ctx, q, args...).Scan(&sum.Count, &sum.Sum)
	})
	if err != nil && isUndefinedTable(err) {
		return tidemark.KeySum{Sum: "0"}, nil
	}
	if err != nil {
		return tidemark.KeySum{}, fmt.Errorf("sum keys of %s: %w", d.display, redact(err, s.secret))
	}
	return sum, nil
}

// KeysInRange implements tidemark.KeyTarget.
func (s *Sink) KeysInRange(ctx context.Context, table *tidemark.Table, after, upTo []any) ([][]any, error) {
	d, _, err := s.def(table)
	if err != nil {
		return nil, err
	}
	_, order, err := keyExprs(d)
	if err != nil {
		return nil, err
	}
	var args []any
	where, err := s.rangeWhere(d, order, after, upTo, &args)
	if err != nil {
		return nil, err
	}
	var sel []string
	for _, k := range d.table.Key {
		sel = append(sel, tidemark.QuotePostgres(d.table.Columns[k].Name)+"::text")
	}
	q := "SELECT " + strings.Join(sel, ", ") + " FROM " + d.qname + where + " ORDER BY " + strings.Join(order, ", ")
	var out [][]any
	err = s.retry(ctx, "list keys of "+d.display, func(ctx context.Context) error {
		out = out[:0]
		rows, err := s.pool.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			vals := make([]string, len(sel))
			ptrs := make([]any, len(sel))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				return err
			}
			key := make([]any, len(sel))
			for i, v := range vals {
				key[i] = v
			}
			out = append(out, key)
		}
		return rows.Err()
	})
	if err != nil && isUndefinedTable(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list keys of %s: %w", d.display, redact(err, s.secret))
	}
	return out, nil
}

func isUndefinedTable(err error) bool {
	var pe interface{ SQLState() string }
	return errors.As(err, &pe) && (pe.SQLState() == "42P01" || pe.SQLState() == "3F000")
}

var _ tidemark.TargetRows = (*Sink)(nil)

// HasRows implements tidemark.TargetRows: whether the target table of table
// holds any row (false when it does not exist).
func (s *Sink) HasRows(ctx context.Context, table *tidemark.Table) (bool, error) {
	d, _, err := s.def(table)
	if err != nil {
		return false, err
	}
	var has bool
	err = s.retry(ctx, "look for rows in "+d.display, func(ctx context.Context) error {
		return s.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+d.qname+")").Scan(&has)
	})
	if err != nil && isUndefinedTable(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("look for rows in %s: %w", d.display, redact(err, s.secret))
	}
	return has, nil
}

var _ tidemark.TargetIdentity = (*Sink)(nil)

// TargetIdentity implements tidemark.TargetIdentity: the target table's oid
// and its relfilenode, which DROP + CREATE, TRUNCATE and every rewrite
// (VACUUM FULL, CLUSTER, an ALTER that rewrites) change.
func (s *Sink) TargetIdentity(ctx context.Context, id tidemark.TableID) (string, bool, error) {
	_, _, qname, err := s.targetOf(id)
	if err != nil {
		return "", false, err
	}
	var oid, node int64
	err = s.retry(ctx, "identify "+qname, func(ctx context.Context) error {
		return s.pool.QueryRow(ctx, "SELECT c.oid::bigint, c.relfilenode::bigint FROM pg_class c WHERE c.oid = to_regclass($1)", qname).Scan(&oid, &node)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows) || err != nil && isUndefinedTable(err):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("identify %s: %w", qname, redact(err, s.secret))
	}
	return fmt.Sprintf("pg:%d/%d", oid, node), true, nil
}
