package tidemark

// CheckStatus is the outcome of one prerequisite check.
type CheckStatus string

// Check outcomes.
const (
	// CheckOK: the prerequisite holds.
	CheckOK CheckStatus = "ok"
	// CheckWarn: tidemark runs, but a case it guards against (a failover,
	// a long outage) would stop it; Fix says how to prepare for it.
	CheckWarn CheckStatus = "warn"
	// CheckFix: tidemark cannot run correctly until Fix is done.
	CheckFix CheckStatus = "fix"
)

// Check is one prerequisite of a source or target, as `tidemark doctor`
// prints it and `tidemark run` enforces it (a CheckFix stops the start).
type Check struct {
	// Name says what is checked ("source binlog_format").
	Name string
	// Status is the outcome.
	Status CheckStatus
	// Found is what was found ("MIXED").
	Found string
	// Fix is what to do when Status is not CheckOK.
	Fix string
}
