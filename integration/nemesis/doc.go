// Package nemesis is tidemark's campaign runner (docs/RELIABILITY.md, "The
// nemesis"): one campaign is one seed. From the seed (math/rand/v2, a PCG
// seeded with it) a campaign draws a topology and configuration, the shapes
// and column types of its tables, a workload, schema changes made while the
// daemon streams, and faults (kill -9, SIGSTOP/SIGCONT, server restarts,
// network faults through toxiproxy, binlog purges, Kafka restarts and
// partition changes), runs them against the real tidemark binary on the
// local servers (scripts/services.sh), lets the system settle, and judges
// the result with harness.Compare (the oracle that shares no code with
// verify), the I5 version-regression trigger during the whole campaign,
// and "never wrong in silence": a table may end different from the source
// only when tidemark said so in one error naming it and the cause, and
// only where the campaign's draws make that a documented refusal.
//
// The tests are the runner:
//
//	make nemesis SEED=17          # replay one campaign exactly (same draws, same step order)
//	make soak DURATION=30m        # fresh random seeds until the time is up, then a table
//	go test ./integration/nemesis # the CI seed set (ciSeeds), part of make test
package nemesis
