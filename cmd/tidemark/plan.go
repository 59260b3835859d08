package main

import (
	"context"
	"fmt"
	"strings"

	"tidemark"
	"tidemark/binlog"
)

// planCmd is `tidemark plan`: it prints the DDL tidemark would run on the
// PostgreSQL target for every included source table — the table when it
// is missing, what aligning an existing one takes (columns, types, NOT
// NULL), and the secondary indexes it mirrors — without running any of it
// (the target's catalog is read in read-only transactions). Indexes that
// cannot be mirrored are named on stderr.
type planCmd struct {
	cmdBase
}

func (c *planCmd) parseFlags(args []string) error {
	if err := c.parseConfig(args, nil); err != nil {
		return err
	}
	return c.cfg.needPostgres("plan")
}

func (c *planCmd) run(ctx context.Context) int {
	var cl closers
	defer cl.close()
	src, state, exit, ok := c.openSourceAndState(ctx, useReader, openReadOnly, &cl)
	if !ok {
		return exit
	}
	pl, err := need[planner](state, "tidemark plan")
	if err != nil {
		return c.fail("plan failed", err)
	}
	return c.print(ctx, src.reader, pl)
}

// print prints the plan of every table the reader lists.
func (c *planCmd) print(ctx context.Context, reader *binlog.Reader, pl planner) int {
	stdout, log := c.stdout, c.log
	tables, err := reader.Tables(ctx)
	if err != nil {
		log.Error("plan failed", "err", err)
		return exitFailed
	}
	fmt.Fprintf(stdout, "-- tidemark plan for source %s: %d tables (nothing is run)\n", c.cfg.Source.Name, len(tables))
	failed := false
	for _, id := range tables {
		t, err := reader.Table(ctx, id)
		if err != nil {
			fmt.Fprintf(stdout, "\n-- %s: not replicated: %v\n", id, err)
			continue
		}
		idx, err := reader.Indexes(ctx, id)
		if err != nil {
			log.Error("plan failed", "table", id.String(), "err", err)
			return exitFailed
		}
		stmts, err := pl.Plan(ctx, t, idx)
		if err != nil {
			fmt.Fprintf(stdout, "\n-- %s: cannot be aligned: %v\n", id, err)
			failed = true
			continue
		}
		if len(stmts) == 0 {
			fmt.Fprintf(stdout, "\n-- %s: up to date\n", id)
			continue
		}
		fmt.Fprintf(stdout, "\n-- %s\n", id)
		for _, s := range stmts {
			if strings.HasPrefix(s, "-- ") {
				fmt.Fprintln(stdout, s) // a note, not a statement
				continue
			}
			fmt.Fprintf(stdout, "%s;\n", s)
		}
	}
	if failed {
		return exitFailed
	}
	return exitOK
}

// planner prints the DDL that aligning a target table with t and its
// secondary indexes takes, without running it.
type planner interface {
	Plan(ctx context.Context, t *tidemark.Table, idx []tidemark.Index) ([]string, error)
}
