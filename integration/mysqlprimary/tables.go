package mysqlprimary

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	vtmysql "vitess.io/vitess/go/mysql"
	vtbinlog "vitess.io/vitess/go/mysql/binlog"
	"vitess.io/vitess/go/mysql/sqlerror"
	"vitess.io/vitess/go/sqltypes"
	querypb "vitess.io/vitess/go/vt/proto/query"
)

// The primary keeps the rows its committed transactions leave, so that the
// reads a replica's snapshot makes (information_schema lookups and keyed
// SELECTs of a whole table, the shapes tidemark's binlog.Reader issues) are
// answered from the same data the binlog carries. JSON values are returned
// as vitess renders MySQL's binary JSON (an implementation independent of
// the tailer's).

// tableData is a table's current rows by key.
type tableData struct {
	t    *Table
	rows map[string][]any
}

func rowKey(t *Table, vals []any) string {
	var parts []string
	for _, k := range t.Key {
		parts = append(parts, fmt.Sprint(vals[k]))
	}
	return strings.Join(parts, "\x00")
}

// apply changes the table data as committed rows do (p.mu held).
func (p *Primary) apply(rows []Row) {
	for _, r := range rows {
		name := r.Table.Schema + "." + r.Table.Name
		td := p.data[name]
		if td == nil {
			td = &tableData{t: r.Table, rows: map[string][]any{}}
			p.data[name] = td
		}
		switch r.Op {
		case Insert:
			td.rows[rowKey(r.Table, r.After)] = r.After
		case Delete:
			delete(td.rows, rowKey(r.Table, r.Before))
		case Update:
			delete(td.rows, rowKey(r.Table, r.Before))
			td.rows[rowKey(r.Table, r.After)] = r.After
		}
	}
}

func (c Column) dataType() (dataType, columnType string) {
	switch c.Type {
	case TypeLongLong:
		dataType, columnType = "bigint", "bigint"
	case TypeLong:
		dataType, columnType = "int", "int"
	case TypeVarchar:
		return "varchar", fmt.Sprintf("varchar(%d)", c.Meta/4)
	case TypeJSON:
		return "json", "json"
	}
	if c.Unsigned {
		columnType += " unsigned"
	}
	return dataType, columnType
}

var (
	selectTableRE   = regexp.MustCompile("^select (.+) from `([^`]+)`\\.`([^`]+)` order by (.+) limit (\\d+)$")
	columnsQuery    = "select column_name, data_type, column_type, is_nullable, numeric_precision, numeric_scale, datetime_precision, character_set_name from information_schema.columns where table_schema = ? and table_name = ? order by ordinal_position"
	keyQuery        = "select column_name from information_schema.key_column_usage where table_schema = ? and table_name = ? and constraint_name = 'primary' order by ordinal_position"
	tablesQuery     = "select table_schema, table_name from information_schema.tables where table_type = 'base table' order by 1, 2"
	tablesQuery2    = "select table_schema, table_name from information_schema.tables where table_type = 'base table' order by table_schema, table_name"
	convertTZQuery  = "select convert_tz('2026-01-01 00:00:00', 'utc', ?) is not null"
	collationsQuery = "select id, character_set_name from information_schema.collations where id is not null"
	indexesQuery    = "select index_name, non_unique, column_name, sub_part, collation, index_type from information_schema.statistics where table_schema = ? and table_name = ? and index_name <> 'primary' order by index_name, seq_in_index"
)

// tableAnswer answers the reads of a table's data and schema (p.mu held),
// nil when the query is not one of them.
func (p *Primary) tableAnswer(q string, args []string) (*sqltypes.Result, error) {
	switch q {
	case convertTZQuery:
		// A server with its time-zone tables loaded knows every zone.
		r := &sqltypes.Result{Fields: []*querypb.Field{{Name: "known", Type: querypb.Type_INT64}}}
		r.Rows = [][]sqltypes.Value{{sqltypes.NewInt64(1)}}
		return r, nil
	case collationsQuery:
		// The character sets of MySQL 8's collations the primary's
		// columns use (the tailer decodes text by them).
		return textResult([]string{"ID", "CHARACTER_SET_NAME"},
			[]any{8, "latin1"}, []any{33, "utf8mb3"}, []any{45, "utf8mb4"}, []any{46, "utf8mb4"},
			[]any{63, "binary"}, []any{83, "utf8mb3"}, []any{255, "utf8mb4"}, []any{309, "utf8mb4"}), nil
	case indexesQuery:
		// The primary's tables have a primary key and no other index.
		return textResult([]string{"INDEX_NAME", "NON_UNIQUE", "COLUMN_NAME", "SUB_PART", "COLLATION", "INDEX_TYPE"}), nil
	case tablesQuery, tablesQuery2:
		var rows [][]any
		names := make([]string, 0, len(p.data))
		for n := range p.data {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			rows = append(rows, []any{p.data[n].t.Schema, p.data[n].t.Name})
		}
		return textResult([]string{"TABLE_SCHEMA", "TABLE_NAME"}, rows...), nil
	case columnsQuery, keyQuery:
		if len(args) != 2 {
			return nil, fmt.Errorf("mysqlprimary: %d arguments for %q", len(args), q)
		}
		var rows [][]any
		if td := p.data[args[0]+"."+args[1]]; td != nil {
			if q == keyQuery {
				for _, k := range td.t.Key {
					rows = append(rows, []any{td.t.Columns[k].Name})
				}
				return textResult([]string{"COLUMN_NAME"}, rows...), nil
			}
			for _, c := range td.t.Columns {
				dt, ct := c.dataType()
				nullable := "NO"
				if c.Nullable {
					nullable = "YES"
				}
				var prec, scale, charset any
				switch c.Type {
				case TypeLongLong:
					prec, scale = 19, 0
					if c.Unsigned {
						prec = 20
					}
				case TypeLong:
					prec, scale = 10, 0
				case TypeVarchar:
					charset = "utf8mb4"
				}
				rows = append(rows, []any{c.Name, dt, ct, nullable, prec, scale, nil, charset})
			}
		}
		return textResult([]string{"COLUMN_NAME", "DATA_TYPE", "COLUMN_TYPE", "IS_NULLABLE", "NUMERIC_PRECISION", "NUMERIC_SCALE", "DATETIME_PRECISION", "CHARACTER_SET_NAME"}, rows...), nil
	}
	m := selectTableRE.FindStringSubmatch(q)
	if m == nil {
		return nil, nil
	}
	td := p.data[m[2]+"."+m[3]]
	if td == nil {
		return nil, sqlerror.NewSQLErrorf(sqlerror.ERNoSuchTable, sqlerror.SSUnknownTable, "Table '%s.%s' doesn't exist", m[2], m[3])
	}
	var cols []int
	for _, sel := range strings.Split(m[1], ",") {
		name := strings.Trim(strings.TrimSpace(sel), "`")
		i := -1
		for j, c := range td.t.Columns {
			if strings.EqualFold(c.Name, name) {
				i = j
			}
		}
		if i < 0 {
			return nil, nil // an expression the primary does not evaluate
		}
		cols = append(cols, i)
	}
	keys := make([]string, 0, len(td.rows))
	for k := range td.rows {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(a, b int) bool { return lessKey(td.t, td.rows[keys[a]], td.rows[keys[b]]) })
	limit, _ := strconv.Atoi(m[5])
	if len(keys) > limit {
		keys = keys[:limit]
	}
	r := &sqltypes.Result{}
	for _, i := range cols {
		c := td.t.Columns[i]
		typ := querypb.Type_VARCHAR
		switch {
		case c.Type == TypeLongLong && c.Unsigned:
			typ = querypb.Type_UINT64
		case c.Type == TypeLongLong, c.Type == TypeLong:
			typ = querypb.Type_INT64
		case c.Type == TypeJSON:
			typ = querypb.Type_JSON
		}
		r.Fields = append(r.Fields, &querypb.Field{Name: c.Name, Type: typ})
	}
	for _, k := range keys {
		row := td.rows[k]
		var vals []sqltypes.Value
		for _, i := range cols {
			v, err := sqlValue(row[i])
			if err != nil {
				return nil, err
			}
			vals = append(vals, v)
		}
		r.Rows = append(r.Rows, vals)
	}
	return r, nil
}

// lessKey orders rows by their key columns (integers numerically).
func lessKey(t *Table, a, b []any) bool {
	for _, k := range t.Key {
		x, y := fmt.Sprint(a[k]), fmt.Sprint(b[k])
		if x == y {
			continue
		}
		xi, err1 := strconv.ParseInt(x, 10, 64)
		yi, err2 := strconv.ParseInt(y, 10, 64)
		if err1 == nil && err2 == nil {
			return xi < yi
		}
		return x < y
	}
	return false
}

// sqlValue is a stored value as a SELECT returns it.
func sqlValue(v any) (sqltypes.Value, error) {
	switch x := v.(type) {
	case nil:
		return sqltypes.NULL, nil
	case int64:
		return sqltypes.NewInt64(x), nil
	case uint64:
		return sqltypes.NewUint64(x), nil
	case string:
		return sqltypes.NewVarChar(x), nil
	case JSON:
		enc, err := EncodeJSON(x.V)
		if err != nil {
			return sqltypes.NULL, err
		}
		jv, err := vtbinlog.ParseBinaryJSON(enc)
		if err != nil {
			return sqltypes.NULL, err
		}
		return sqltypes.MakeTrusted(querypb.Type_JSON, jv.MarshalTo(nil)), nil
	}
	return sqltypes.NULL, fmt.Errorf("mysqlprimary: cannot return a %T", v)
}

// ComPrepare prepares a statement: its parameters are its question marks.
func (h *handler) ComPrepare(_ *vtmysql.Conn, query string) ([]*querypb.Field, uint16, error) {
	return nil, uint16(strings.Count(query, "?")), nil
}

// ComStmtExecute answers a prepared statement like the same query with its
// arguments.
func (h *handler) ComStmtExecute(c *vtmysql.Conn, prepare *vtmysql.PrepareData, callback func(*sqltypes.Result) error) error {
	args := make([]string, prepare.ParamsCount)
	for i := range args {
		bv := prepare.BindVars["v"+strconv.Itoa(i+1)]
		if bv != nil {
			args[i] = string(bv.Value)
		}
	}
	p := h.p
	p.mu.Lock()
	p.queries = append(p.queries, prepare.PrepareStmt)
	r, err := p.tableAnswer(normalize(prepare.PrepareStmt), args)
	if r == nil && err == nil {
		p.unscripted = append(p.unscripted, prepare.PrepareStmt)
		err = sqlerror.NewSQLError(sqlerror.ERNotSupportedYet, sqlerror.SSUnknownSQLState, "mysqlprimary: unscripted statement: "+prepare.PrepareStmt)
	}
	p.mu.Unlock()
	if err != nil {
		return err
	}
	return callback(r)
}
