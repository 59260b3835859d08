package integration

import "fmt"

func fmtAny(v any) string { return fmt.Sprint(v) }
