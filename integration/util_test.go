package integration

import (
	"regexp"
	"strings"
)

func regexpContains(s, pattern string) bool {
	return regexp.MustCompile("(?m)" + pattern).MatchString(s)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
