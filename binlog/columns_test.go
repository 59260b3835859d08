package binlog

import (
	"testing"

	"github.com/go-mysql-org/go-mysql/mysql"

	"tidemark"
)

// TestKindOf: the one type mapping, by information_schema type name and by
// table-map type code (tableMapType), including the text types whose kind
// depends on a JSON declaration or the binary character set.
func TestKindOf(t *testing.T) {
	for _, tc := range []struct {
		t    mysqlType
		kind tidemark.Kind
		bits int
	}{
		{mysqlType{dataType: "tinyint"}, tidemark.KindInt, 8},
		{mysqlType{dataType: "mediumint", unsigned: true}, tidemark.KindUint, 24},
		{mysqlType{dataType: "bigint", unsigned: true}, tidemark.KindUint, 64},
		{mysqlType{dataType: "int"}, tidemark.KindInt, 32},
		{mysqlType{dataType: "decimal", unsigned: true}, tidemark.KindDecimal, 0},
		{mysqlType{dataType: "float"}, tidemark.KindFloat, 0},
		{mysqlType{dataType: "double"}, tidemark.KindDouble, 0},
		{mysqlType{dataType: "bit"}, tidemark.KindBit, 0},
		{mysqlType{dataType: "year"}, tidemark.KindYear, 0},
		{mysqlType{dataType: "date"}, tidemark.KindDate, 0},
		{mysqlType{dataType: "time"}, tidemark.KindTime, 0},
		{mysqlType{dataType: "datetime"}, tidemark.KindDateTime, 0},
		{mysqlType{dataType: "timestamp"}, tidemark.KindTimestamp, 0},
		{mysqlType{dataType: "enum"}, tidemark.KindEnum, 0},
		{mysqlType{dataType: "set"}, tidemark.KindSet, 0},
		{mysqlType{dataType: "json"}, tidemark.KindJSON, 0},
		{mysqlType{dataType: "longtext", json: true}, tidemark.KindJSON, 0},
		{mysqlType{dataType: "longtext", json: true, binary: true}, tidemark.KindJSON, 0},
		{mysqlType{dataType: "varchar"}, tidemark.KindText, 0},
		{mysqlType{dataType: "char", binary: true}, tidemark.KindBytes, 0},
		{mysqlType{dataType: "varbinary"}, tidemark.KindBytes, 0},
		{mysqlType{dataType: "blob", json: true}, tidemark.KindBytes, 0},
	} {
		kind, bits, ok := kindOf(tc.t)
		if !ok || kind != tc.kind || bits != tc.bits {
			t.Errorf("kindOf(%+v) = %s, %d, %v; want %s, %d", tc.t, kind, bits, ok, tc.kind, tc.bits)
		}
	}
	for _, dt := range []string{"geometry", "point", "vector", ""} {
		if _, _, ok := kindOf(mysqlType{dataType: dt}); ok {
			t.Errorf("kindOf(%q) is supported", dt)
		}
	}

	// Every table-map type the tailer decodes names a supported type, of
	// the kind its information_schema name has.
	for typ, want := range map[byte]tidemark.Kind{
		mysql.MYSQL_TYPE_TINY: tidemark.KindInt, mysql.MYSQL_TYPE_SHORT: tidemark.KindInt, mysql.MYSQL_TYPE_INT24: tidemark.KindInt,
		mysql.MYSQL_TYPE_LONG: tidemark.KindInt, mysql.MYSQL_TYPE_LONGLONG: tidemark.KindInt, mysql.MYSQL_TYPE_NEWDECIMAL: tidemark.KindDecimal,
		mysql.MYSQL_TYPE_FLOAT: tidemark.KindFloat, mysql.MYSQL_TYPE_DOUBLE: tidemark.KindDouble, mysql.MYSQL_TYPE_BIT: tidemark.KindBit,
		mysql.MYSQL_TYPE_YEAR: tidemark.KindYear, mysql.MYSQL_TYPE_DATE: tidemark.KindDate, mysql.MYSQL_TYPE_NEWDATE: tidemark.KindDate,
		mysql.MYSQL_TYPE_TIME: tidemark.KindTime, mysql.MYSQL_TYPE_TIME2: tidemark.KindTime,
		mysql.MYSQL_TYPE_DATETIME: tidemark.KindDateTime, mysql.MYSQL_TYPE_DATETIME2: tidemark.KindDateTime,
		mysql.MYSQL_TYPE_TIMESTAMP: tidemark.KindTimestamp, mysql.MYSQL_TYPE_TIMESTAMP2: tidemark.KindTimestamp,
		mysql.MYSQL_TYPE_ENUM: tidemark.KindEnum, mysql.MYSQL_TYPE_SET: tidemark.KindSet, mysql.MYSQL_TYPE_JSON: tidemark.KindJSON,
		mysql.MYSQL_TYPE_STRING: tidemark.KindText, mysql.MYSQL_TYPE_VARCHAR: tidemark.KindText,
		mysql.MYSQL_TYPE_VAR_STRING: tidemark.KindText, mysql.MYSQL_TYPE_BLOB: tidemark.KindText,
	} {
		kind, _, ok := kindOf(mysqlType{dataType: tableMapType(typ)})
		if !ok || kind != want {
			t.Errorf("table-map type %d (%q): %s, %v; want %s", typ, tableMapType(typ), kind, ok, want)
		}
	}
	if tableMapType(mysql.MYSQL_TYPE_GEOMETRY) != "" {
		t.Error("GEOMETRY maps to a supported type")
	}
	// A BLOB with the binary collation is bytes, one with a character set
	// text.
	if k, _, _ := kindOf(mysqlType{dataType: tableMapType(mysql.MYSQL_TYPE_BLOB), binary: true}); k != tidemark.KindBytes {
		t.Errorf("binary BLOB: %s", k)
	}
}
