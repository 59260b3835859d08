package binlog

import (
	"context"
	"fmt"
	"strings"

	"github.com/go-mysql-org/go-mysql/mysql"

	"tidemark"
)

// mysqlType is a column's MySQL type as information_schema.COLUMNS spells
// it (DATA_TYPE, lower case), with what its kind depends on besides.
type mysqlType struct {
	dataType string
	unsigned bool
	// binary is set when the column's character set is binary: BINARY,
	// VARBINARY and the BLOBs always; a CHAR or TEXT column declared with
	// it (or carrying the binary collation in a table map).
	binary bool
	// json is set for a column declared JSON: MySQL's JSON type, or
	// MariaDB's LONGTEXT with a json_valid check (jsonColumns).
	json bool
}

// intBits are the widths of the integer types.
var intBits = map[string]int{"tinyint": 8, "smallint": 16, "mediumint": 24, "int": 32, "bigint": 64}

// kindOf is the one MySQL type → tidemark.Kind mapping (docs/type-mapping.md),
// for the tailer (table-map events, through tableMapType), the reader of
// the fallback and the verifier (information_schema). bits is the width of
// an integer type (0 otherwise). ok is false for a type tidemark does not
// support.
func kindOf(t mysqlType) (kind tidemark.Kind, bits int, ok bool) {
	switch t.dataType {
	case "tinyint", "smallint", "mediumint", "int", "bigint":
		if t.unsigned {
			return tidemark.KindUint, intBits[t.dataType], true
		}
		return tidemark.KindInt, intBits[t.dataType], true
	case "decimal":
		return tidemark.KindDecimal, 0, true
	case "float":
		return tidemark.KindFloat, 0, true
	case "double":
		return tidemark.KindDouble, 0, true
	case "bit":
		return tidemark.KindBit, 0, true
	case "year":
		return tidemark.KindYear, 0, true
	case "date":
		return tidemark.KindDate, 0, true
	case "time":
		return tidemark.KindTime, 0, true
	case "datetime":
		return tidemark.KindDateTime, 0, true
	case "timestamp":
		return tidemark.KindTimestamp, 0, true
	case "enum":
		return tidemark.KindEnum, 0, true
	case "set":
		return tidemark.KindSet, 0, true
	case "json":
		return tidemark.KindJSON, 0, true
	case "binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob":
		return tidemark.KindBytes, 0, true
	case "char", "varchar", "tinytext", "text", "mediumtext", "longtext":
		switch {
		case t.json:
			return tidemark.KindJSON, 0, true
		case t.binary:
			return tidemark.KindBytes, 0, true
		}
		return tidemark.KindText, 0, true
	}
	return 0, 0, false
}

// tableMapType names a table-map column type (after realType) as
// information_schema does, for kindOf. The binlog's string and BLOB types
// are TEXT or BLOB by their collation: they map to the text types, whose
// kind follows mysqlType.binary. It returns "" for a type tidemark does not
// support.
func tableMapType(typ byte) string {
	switch typ {
	case mysql.MYSQL_TYPE_TINY:
		return "tinyint"
	case mysql.MYSQL_TYPE_SHORT:
		return "smallint"
	case mysql.MYSQL_TYPE_INT24:
		return "mediumint"
	case mysql.MYSQL_TYPE_LONG:
		return "int"
	case mysql.MYSQL_TYPE_LONGLONG:
		return "bigint"
	case mysql.MYSQL_TYPE_NEWDECIMAL:
		return "decimal"
	case mysql.MYSQL_TYPE_FLOAT:
		return "float"
	case mysql.MYSQL_TYPE_DOUBLE:
		return "double"
	case mysql.MYSQL_TYPE_BIT:
		return "bit"
	case mysql.MYSQL_TYPE_YEAR:
		return "year"
	case mysql.MYSQL_TYPE_DATE, mysql.MYSQL_TYPE_NEWDATE:
		return "date"
	case mysql.MYSQL_TYPE_TIME, mysql.MYSQL_TYPE_TIME2:
		return "time"
	case mysql.MYSQL_TYPE_DATETIME, mysql.MYSQL_TYPE_DATETIME2:
		return "datetime"
	case mysql.MYSQL_TYPE_TIMESTAMP, mysql.MYSQL_TYPE_TIMESTAMP2:
		return "timestamp"
	case mysql.MYSQL_TYPE_ENUM:
		return "enum"
	case mysql.MYSQL_TYPE_SET:
		return "set"
	case mysql.MYSQL_TYPE_JSON:
		return "json"
	case mysql.MYSQL_TYPE_STRING:
		return "char"
	case mysql.MYSQL_TYPE_VARCHAR, mysql.MYSQL_TYPE_VAR_STRING:
		return "varchar"
	case mysql.MYSQL_TYPE_BLOB:
		return "text"
	}
	return ""
}

// queryFunc runs one SQL statement on the source.
type queryFunc func(ctx context.Context, q string, args ...any) (*mysql.Result, error)

// readSchema is the one reader of a table's schema from information_schema
// (the fallback's Reader and the Verifier): the columns in order with their
// kinds (kindOf), except the excluded ones, and the configured business key
// or the primary key. json names the columns declared JSON (jsonColumns).
// A problem of the table itself (not found, an unsupported type, an invalid
// column name, no key) is a *tidemark.TableError wrapping
// tidemark.ErrUndecodable, so that a catch-up quarantines the table alone.
func readSchema(ctx context.Context, cfg *Config, query queryFunc, json map[string]bool, id tidemark.TableID) (*tidemark.Table, error) {
	if err := tidemark.CheckIdentifier("database", id.Database); err != nil {
		return nil, fmt.Errorf("read schema of %s: %w", id, err)
	}
	if err := tidemark.CheckIdentifier("table", id.Name); err != nil {
		return nil, fmt.Errorf("read schema of %s: %w", id, err)
	}
	// NULL precisions and character sets read as 0 and "".
	res, err := query(ctx, `SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, NUMERIC_PRECISION, NUMERIC_SCALE,
		DATETIME_PRECISION, CHARACTER_SET_NAME FROM information_schema.COLUMNS
		WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION`, id.Database, id.Name)
	if err != nil {
		return nil, fmt.Errorf("read schema of %s: %w", id, err)
	}
	if res.RowNumber() == 0 {
		return nil, fmt.Errorf("read schema of %s: table not found on source %s: %w", id, cfg.Name, tidemark.ErrTableGone)
	}
	tbl := &tidemark.Table{ID: id}
	excluded := cfg.excludedColumns(id)
	for i := 0; i < res.RowNumber(); i++ {
		name, _ := res.GetString(i, 0)
		if excluded[strings.ToLower(name)] {
			continue // never selected: the value does not leave the source
		}
		dataType, _ := res.GetString(i, 1)
		colType, _ := res.GetString(i, 2)
		nullable, _ := res.GetString(i, 3)
		prec, _ := res.GetInt(i, 4)
		scale, _ := res.GetInt(i, 5)
		dtPrec, _ := res.GetInt(i, 6)
		charset, _ := res.GetString(i, 7)
		if err := tidemark.CheckIdentifier("column of "+id.String(), name); err != nil {
			return nil, undecodable(id, fmt.Errorf("read schema of %s: %w", id, err))
		}
		col := tidemark.Column{Name: name, Nullable: nullable == "YES"}
		var ok bool
		col.Kind, col.Bits, ok = kindOf(mysqlType{
			dataType: strings.ToLower(dataType),
			unsigned: strings.Contains(strings.ToLower(colType), "unsigned"),
			binary:   strings.EqualFold(charset, "binary"),
			json:     json[name],
		})
		if !ok {
			return nil, undecodable(id, fmt.Errorf("read schema of %s: column %s: unsupported type %s", id, name, colType))
		}
		switch col.Kind {
		case tidemark.KindDecimal:
			col.Precision, col.Scale = int(prec), int(scale)
		case tidemark.KindBit:
			col.Bits = int(prec)
		case tidemark.KindTime, tidemark.KindDateTime, tidemark.KindTimestamp:
			col.Scale = int(dtPrec)
		}
		tbl.Columns = append(tbl.Columns, col)
	}
	if cols, ok := cfg.BusinessKeys[id.String()]; ok {
		for _, c := range cols {
			k := tbl.ColumnIndex(c)
			if k < 0 {
				return nil, undecodable(id, fmt.Errorf("read schema of %s: business_keys: column %q not in table", id, c))
			}
			tbl.Key = append(tbl.Key, k)
		}
		return tbl, nil
	}
	kr, err := query(ctx, `SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE
		WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND CONSTRAINT_NAME = 'PRIMARY' ORDER BY ORDINAL_POSITION`, id.Database, id.Name)
	if err != nil {
		return nil, fmt.Errorf("read primary key of %s: %w", id, err)
	}
	for i := 0; i < kr.RowNumber(); i++ {
		n, _ := kr.GetString(i, 0)
		k := tbl.ColumnIndex(n)
		if k < 0 {
			return nil, undecodable(id, fmt.Errorf("read schema of %s: exclude_columns: %s is a key column and cannot be excluded", id, n))
		}
		tbl.Key = append(tbl.Key, k)
	}
	if len(tbl.Key) == 0 {
		return nil, undecodable(id, fmt.Errorf("read schema of %s: table has no primary key (configure business_keys for it)", id))
	}
	return tbl, nil
}

// readJSONColumns returns the columns of a MariaDB table declared JSON: those
// with a json_valid(col) check constraint. MySQL has a real JSON type.
func readJSONColumns(ctx context.Context, query queryFunc, id tidemark.TableID) (map[string]bool, error) {
	r, err := query(ctx, "SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS WHERE CONSTRAINT_SCHEMA = ? AND TABLE_NAME = ?", id.Database, id.Name)
	if err != nil {
		return nil, err
	}
	m := map[string]bool{}
	for i := 0; i < r.RowNumber(); i++ {
		clause, _ := r.GetString(i, 0)
		if sm := jsonCheckRE.FindStringSubmatch(clause); sm != nil {
			m[strings.ReplaceAll(sm[1], "``", "`")] = true
		}
	}
	return m, nil
}

// readColumnNames returns the names of a table's columns as
// information_schema lists them now.
func readColumnNames(ctx context.Context, query queryFunc, id tidemark.TableID) (map[string]bool, error) {
	r, err := query(ctx, "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?", id.Database, id.Name)
	if err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", id, err)
	}
	m := make(map[string]bool, r.RowNumber())
	for i := 0; i < r.RowNumber(); i++ {
		name, _ := r.GetString(i, 0)
		m[name] = true
	}
	return m, nil
}
