package binlog

import (
	"context"
	"fmt"
	"math/big"
	"testing"

	"github.com/go-mysql-org/go-mysql/client"

	"tidemark"
	"tidemark/internal/testenv"
)

// TestKeyRangeSumWholeTable: the key diff first compares one sum of all the
// source's keys (KeyRangeSum with no bounds) with the target's. On MariaDB
// 10.11 and MySQL 9.7 it must equal the sums of the key chunks, and a key
// deleted in the middle of the table, its count made equal by a key added
// elsewhere, must change it.
func TestKeyRangeSumWholeTable(t *testing.T) {
	mdb := testenv.MySQL(t)
	my9, c9 := mysql9Server(t)
	for _, srv := range []struct {
		name string
		cfg  Config
		c    *client.Conn
	}{
		{"mariadb", Config{Name: "ks", Addr: mdb.Addr, User: mdb.User, Password: mdb.Password, ServerID: 7393}, mdb.Conn(t)},
		{"mysql9", my9, c9},
	} {
		t.Run(srv.name, func(t *testing.T) {
			c := srv.c
			db := testenv.Name("bks_")
			exec(t, c, "CREATE DATABASE "+db)
			t.Cleanup(func() { _, _ = c.Execute("DROP DATABASE " + db) })
			exec(t, c, "USE "+db, "CREATE TABLE k (a BIGINT NOT NULL, b VARCHAR(20) NOT NULL, PRIMARY KEY (a, b))")
			for i := 1; i <= 50; i++ {
				exec(t, c, fmt.Sprintf("INSERT INTO k VALUES (%d, 'x%d'), (%d, 'y|%d')", i, i, i, i))
			}
			r, err := NewReader(srv.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			ctx := context.Background()
			id := tidemark.TableID{Database: db, Name: "k"}
			chunks := func() tidemark.KeySum {
				t.Helper()
				var after []any
				var n int64
				total := new(big.Int)
				for {
					kc, err := r.KeyChunk(ctx, id, after, 7)
					if err != nil {
						t.Fatal(err)
					}
					s, ok := new(big.Int).SetString(kc.Sum.Sum, 10)
					if !ok {
						t.Fatalf("chunk sum %q", kc.Sum.Sum)
					}
					total.Add(total, s)
					n += kc.Sum.Count
					if kc.Last == nil {
						return tidemark.KeySum{Count: n, Sum: total.String()}
					}
					after = kc.Last
				}
			}
			whole := func() tidemark.KeySum {
				t.Helper()
				s, err := r.KeyRangeSum(ctx, id, nil, nil)
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			before := whole()
			if before.Count != 100 || before != chunks() {
				t.Fatalf("whole-table sum %v, chunks %v", before, chunks())
			}
			exec(t, c, "DELETE FROM k WHERE a = 25 AND b = 'x25'", "INSERT INTO k VALUES (51, 'x51')")
			after := whole()
			if after.Count != before.Count || after == before {
				t.Fatalf("a delete hidden by an insert: sum %v before, %v after (the count must be equal, the sum not)", before, after)
			}
			if after != chunks() {
				t.Fatalf("whole-table sum %v, chunks %v", after, chunks())
			}
		})
	}
}
