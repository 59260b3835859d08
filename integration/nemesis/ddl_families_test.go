package nemesis

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// TestFamilyDDLAcceptedByMariaDB: every column type a campaign can write
// (each family's type, its widening MODIFY, and its backfill ADD COLUMN …
// NOT NULL DEFAULT) is accepted by MariaDB, and so are the values its
// generator writes; a campaign that drew an invalid one would fail on its
// own SQL instead of testing tidemark (the BIGINT UNSIGNED family's
// backfill was "… NOT DEFAULT 0 NOT NULL DEFAULT 0").
func TestFamilyDDLAcceptedByMariaDB(t *testing.T) {
	env, err := harness.EnvFromOS()
	if err != nil {
		t.Fatal(err)
	}
	my, err := env.MySQL()
	if err != nil {
		t.Fatal(err)
	}
	defer my.Close()
	db := "nm_ddl_" + testenv.Name("")
	if _, err := my.Execute("CREATE DATABASE `" + db + "`"); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = my.Execute("DROP DATABASE IF EXISTS `" + db + "`") }()
	r := rand.New(rand.NewPCG(1, 2))
	for _, f := range append(append([]family(nil), families...), legacyFamilies...) {
		tbl := fmt.Sprintf("`%s`.`%s`", db, f.name)
		b := backfill(f)
		steps := []string{
			fmt.Sprintf("CREATE TABLE %s (id BIGINT NOT NULL PRIMARY KEY, v %s) DEFAULT CHARSET=utf8mb4", tbl, f.sqlType),
			fmt.Sprintf("INSERT INTO %s (id) VALUES (0)", tbl),
			fmt.Sprintf("ALTER TABLE %s ADD COLUMN b %s", tbl, b.sqlType),
		}
		if f.widen != "" {
			steps = append(steps, fmt.Sprintf("ALTER TABLE %s MODIFY COLUMN v %s", tbl, f.widen))
		}
		for i := 1; i <= 50; i++ {
			steps = append(steps, fmt.Sprintf("INSERT INTO %s (id, v, b) VALUES (%d, %s, %s)", tbl, i, f.gen(r), b.gen(r)))
		}
		for _, q := range steps {
			if _, err := my.Execute(q); err != nil {
				t.Errorf("family %s: MariaDB refuses %.200s: %v", f.name, q, err)
				break
			}
		}
	}
}
