package binlog

import (
	"errors"
	"strings"
	"testing"
	"time"
	_ "time/tzdata"

	"tidemark"
)

func env(t *testing.T, zone string, zeroDates string) *valueEnv {
	t.Helper()
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	return &valueEnv{
		table:     tidemark.TableID{Database: "shop", Name: "orders"},
		column:    "updated_at",
		zone:      tidemark.ZonePolicy{Location: loc, Fold: tidemark.ResolveLater, Gap: tidemark.ResolveLater},
		zeroDates: zeroDates,
		stats:     &Stats{},
	}
}

func TestConvDateTime(t *testing.T) {
	tests := []struct {
		name string
		zone string
		in   any
		want any
	}{
		// go-mysql with ParseTime labels the wall digits UTC.
		{"IST time.Time", "Asia/Kolkata", time.Date(2026, 3, 10, 23, 58, 0, 0, time.UTC), time.Date(2026, 3, 10, 18, 28, 0, 0, time.UTC)},
		{"IST string pre-1970", "Asia/Kolkata", "1969-07-20 20:17:40.5", time.Date(1969, 7, 20, 14, 47, 40, 500000000, time.UTC)},
		{"UTC micro", "UTC", "2026-03-10 23:58:00.000001", time.Date(2026, 3, 10, 23, 58, 0, 1000, time.UTC)},
		{"zero to NULL", "UTC", "0000-00-00 00:00:00", nil},
		{"zero with fraction", "UTC", "0000-00-00 00:00:00.000", nil},
		{"partial zero", "UTC", "2026-00-10 00:00:00", nil},
		{"NULL", "UTC", nil, nil},
	}
	for _, local := range []string{"UTC", "Asia/Kolkata", "America/New_York"} {
		saved := time.Local
		time.Local, _ = time.LoadLocation(local)
		for _, tc := range tests {
			t.Run(local+"/"+tc.name, func(t *testing.T) {
				got, err := env(t, tc.zone, ZeroDateNull).convDateTime(tc.in)
				if err != nil {
					t.Fatal(err)
				}
				if tc.want == nil {
					if got != nil {
						t.Fatalf("got %v, want NULL", got)
					}
					return
				}
				gt, ok := got.(time.Time)
				if !ok || !gt.Equal(tc.want.(time.Time)) || gt.Location() != time.UTC {
					t.Fatalf("got %v, want %v", got, tc.want)
				}
			})
		}
		time.Local = saved
	}
}

func TestZeroDatePolicy(t *testing.T) {
	e := env(t, "UTC", ZeroDateNull)
	for _, f := range []converter{e.convDateTime, e.convDate, e.convTimestamp} {
		if v, err := f("0000-00-00 00:00:00"); err != nil || v != nil {
			t.Fatalf("null policy: %v, %v", v, err)
		}
	}
	if got := e.stats.ZeroDates.Load(); got != 3 {
		t.Fatalf("zero dates counted %d, want 3", got)
	}
	e = env(t, "UTC", ZeroDateError)
	_, err := e.convDateTime("0000-00-00 00:00:00")
	if !errors.Is(err, tidemark.ErrZeroDate) || !strings.Contains(err.Error(), "shop.orders.updated_at") {
		t.Fatalf("error policy: %v", err)
	}
}

func TestConvTimestampIgnoresHostZone(t *testing.T) {
	instant := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	for _, local := range []string{"UTC", "Asia/Kolkata", "America/New_York"} {
		loc, _ := time.LoadLocation(local)
		// go-mysql returns the instant labelled with the daemon's zone.
		got, err := env(t, "Asia/Kolkata", ZeroDateNull).convTimestamp(instant.In(loc))
		if err != nil {
			t.Fatal(err)
		}
		if g := got.(time.Time); !g.Equal(instant) || g.Location() != time.UTC {
			t.Fatalf("%s: got %v", local, got)
		}
	}
}

func TestDSTPolicyErrorNamesColumn(t *testing.T) {
	e := env(t, "America/New_York", ZeroDateNull)
	e.zone.Gap = tidemark.ResolveError
	_, err := e.convDateTime(time.Date(2026, 3, 8, 2, 30, 0, 0, time.UTC))
	if !errors.Is(err, tidemark.ErrNonexistentTime) || !strings.Contains(err.Error(), "shop.orders.updated_at") {
		t.Fatalf("got %v", err)
	}
}

func TestParseTimeOfDay(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		bad  bool
	}{
		{"00:00:00", 0, false},
		{"12:34:56", 12*time.Hour + 34*time.Minute + 56*time.Second, false},
		{"838:59:59", 838*time.Hour + 59*time.Minute + 59*time.Second, false},
		{"-838:59:59.000000", -(838*time.Hour + 59*time.Minute + 59*time.Second), false},
		{"-00:00:01.5", -(1500 * time.Millisecond), false},
		{"25:00:00.000001", 25*time.Hour + time.Microsecond, false},
		{"1:2", 0, true},
		{"10:61:00", 0, true},
		{"10:00:00.1234567", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseTimeOfDay(tc.in)
			if tc.bad {
				if err == nil {
					t.Fatalf("parsed %q", tc.in)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestConvIntegersAndDecimal(t *testing.T) {
	e := env(t, "UTC", ZeroDateNull)
	if v, _ := e.convUint(uint64(18446744073709551615)); v != uint64(18446744073709551615) {
		t.Fatalf("uint64 max: %v", v)
	}
	if v, _ := e.convUint(uint32(4294967295)); v != uint64(4294967295) {
		t.Fatalf("uint32 max: %v", v)
	}
	if v, _ := e.convInt(int8(-128)); v != int64(-128) {
		t.Fatalf("int8 min: %v", v)
	}
	if v, _ := e.convInt(int32(-8388608)); v != int64(-8388608) {
		t.Fatalf("int24 min: %v", v)
	}
	if _, err := e.convInt("12"); err == nil {
		t.Fatal("string accepted as int")
	}
	for _, ok := range []string{"0", "-1.50", "12345678901234567890123456789.123456789", ".5"} {
		if v, err := e.convDecimal(ok); err != nil || v != tidemark.Decimal(ok) {
			t.Fatalf("decimal %q: %v %v", ok, v, err)
		}
	}
	for _, bad := range []string{"", "-", "1e5", "1.2.3", "NaN"} {
		if _, err := e.convDecimal(bad); err == nil {
			t.Fatalf("decimal %q accepted", bad)
		}
	}
}

func TestConvTextAndBytes(t *testing.T) {
	e := env(t, "UTC", ZeroDateNull)
	if v, err := e.convText(nil)("héllo 🐳"); err != nil || v != "héllo 🐳" {
		t.Fatalf("utf8: %v %v", v, err)
	}
	if _, err := e.convText(nil)(string([]byte{0xff, 0xfe})); err == nil {
		t.Fatal("invalid UTF-8 accepted")
	}
	// latin1 (cp1252): 0xE9 = é, 0x80 = €.
	if v, err := e.convText(decodeLatin1)(string([]byte{'c', 0xE9, ' ', 0x80})); err != nil || v != "cé €" {
		t.Fatalf("latin1: %q %v", v, err)
	}
	if v, err := e.convText(nil)([]byte("blob text")); err != nil || v != "blob text" {
		t.Fatalf("text from blob: %v %v", v, err)
	}
	src := []byte{0, 1, 2}
	v, _ := e.convBytes(src)
	src[0] = 9
	if b := v.([]byte); b[0] != 0 {
		t.Fatal("bytes alias the decoder's buffer")
	}
}

func TestConvEnumSet(t *testing.T) {
	e := env(t, "UTC", ZeroDateNull)
	enum := e.convEnum([]string{"new", "paid", "shipped"})
	if v, _ := enum(int64(2)); v != "paid" {
		t.Fatalf("enum 2 = %v", v)
	}
	if v, _ := enum(int64(0)); v != "" {
		t.Fatalf("enum 0 = %v", v)
	}
	if _, err := enum(int64(4)); err == nil {
		t.Fatal("enum out of range accepted")
	}
	set := e.convSet([]string{"a", "b", "c"})
	if v, _ := set(int64(5)); v != "a,c" {
		t.Fatalf("set 5 = %v", v)
	}
	if v, _ := set(int64(0)); v != "" {
		t.Fatalf("set 0 = %v", v)
	}
}

func TestConfigValidateNamesFields(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		field string
	}{
		{"missing name", Config{Addr: "127.0.0.1:3306", User: "u", ServerID: 1}, "name"},
		{"bad addr", Config{Name: "s", Addr: "nohostport", User: "u", ServerID: 1}, "addr"},
		{"no server id", Config{Name: "s", Addr: "127.0.0.1:3306", User: "u"}, "server_id"},
		{"flavor", Config{Name: "s", Flavor: "oracle", Addr: "127.0.0.1:3306", User: "u", ServerID: 1}, "flavor"},
		{"mysql gtid version", Config{Name: "s", Flavor: FlavorMySQL, Version: VersionGTID, Addr: "127.0.0.1:3306", User: "u", ServerID: 1}, "version"},
		{"zero dates", Config{Name: "s", Addr: "127.0.0.1:3306", User: "u", ServerID: 1, ZeroDates: "zero"}, "zero_dates"},
		{"fold", Config{Name: "s", Addr: "127.0.0.1:3306", User: "u", ServerID: 1, Zone: tidemark.ZonePolicy{Fold: "middle"}}, "zone.fold"},
		{"business key", Config{Name: "s", Addr: "127.0.0.1:3306", User: "u", ServerID: 1, BusinessKeys: map[string][]string{"orders": {"id"}}}, "business_keys"},
		{"include", Config{Name: "s", Addr: "127.0.0.1:3306", User: "u", ServerID: 1, Include: []string{"["}}, "include"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Password = "s3cret-pw"
			err := tc.cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("err = %v, want it to name %q", err, tc.field)
			}
			if strings.Contains(err.Error(), "s3cret-pw") {
				t.Fatal("password in error")
			}
		})
	}
	ok := Config{Name: "s", Addr: "127.0.0.1:3306", User: "u", ServerID: 1}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestIncludeFilter(t *testing.T) {
	c := Config{Include: []string{"shop.*"}, Exclude: []string{"shop.secret*"}}
	for name, want := range map[string]bool{"shop.orders": true, "shop.secrets": false, "other.orders": false} {
		db, tbl, _ := strings.Cut(name, ".")
		if got := c.included(db, tbl); got != want {
			t.Errorf("%s: %v", name, got)
		}
	}
	c = Config{}
	if c.included("mysql", "user") || !c.included("app", "t") {
		t.Fatal("default filter must skip system schemas only")
	}
}

// TestCharsetDecoders: legacy character sets decode to the text MySQL
// converts them to; bytes a character set does not define are an error,
// never U+FFFD (review finding 7).
func TestCharsetDecoders(t *testing.T) {
	for _, c := range []struct {
		cs, in, want string
	}{
		{"latin2", "\xC5\xA1", "ĹĄ"}, // valid UTF-8 ('š'), still latin2
		{"cp1251", "\xcf\xf0\xe8\xe2\xe5\xf2 \x88", "Привет €"},
		{"koi8r", "\xf0\xd2\xc9\xd7\xc5\xd4", "Привет"},
		{"gbk", "\xd6\xd0\xce\xc4", "中文"},
		{"big5", "\xa4\xa4\xa4\xe5", "中文"},
		{"euckr", "\xc7\xd1", "한"},
		{"ucs2", "\x00A\x00\xe9", "Aé"},
		{"utf16", "\xd8\x3d\xdc\x33", "🐳"},
		{"utf16le", "A\x00", "A"},
		{"utf32", "\x00\x01\xf4\x33", "🐳"},
		{"latin1", "K\xf6ln \x80", "Köln €"},
	} {
		got, err := charsetDecoders[c.cs](c.in)
		if err != nil || got != c.want {
			t.Errorf("%s: %q → %q, %v; want %q", c.cs, c.in, got, err, c.want)
		}
	}
	for _, c := range []struct{ cs, in string }{
		{"gbk", "\xd6"},       // a lead byte alone
		{"utf16", "\xd8\x3d"}, // a lone surrogate
		{"cp1250", "\x81"},    // undefined in cp1250
		{"euckr", "\xff\xff"}, // not EUC-KR
	} {
		if got, err := charsetDecoders[c.cs](c.in); err == nil {
			t.Errorf("%s: %q → %q, want an error", c.cs, c.in, got)
		}
	}
}
