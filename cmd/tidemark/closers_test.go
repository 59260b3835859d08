package main

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

// TestClosersCloseInReverseOnError: a builder that fails after opening
// three parts leaves none open, closing the last opened first; one that
// succeeds leaves them open until close, which runs once and joins the
// parts' errors.
func TestClosersCloseInReverseOnError(t *testing.T) {
	var closed []string
	part := func(cl *closers, name string, closeErr error) {
		cl.push(func() error { closed = append(closed, name); return closeErr })
	}
	build := func(cl *closers, failLate bool) (err error) {
		defer cl.closeOnError(&err)
		part(cl, "source", nil)
		part(cl, "state", nil)
		part(cl, "kafka", nil)
		if failLate {
			return errors.New("build pipeline: bad dedupe config")
		}
		return nil
	}

	var cl closers
	if err := build(&cl, true); err == nil {
		t.Fatal("the failing builder returned no error")
	}
	if want := []string{"kafka", "state", "source"}; !slices.Equal(closed, want) {
		t.Fatalf("a late builder's error closed %v, want %v (every part opened, in reverse)", closed, want)
	}
	if err := cl.close(); err != nil || len(closed) != 3 {
		t.Fatalf("close after the error's cleanup: err %v, closed %v; want nothing closed twice", err, closed)
	}

	closed = nil
	var ok closers
	if err := build(&ok, false); err != nil {
		t.Fatal(err)
	}
	if len(closed) != 0 {
		t.Fatalf("a builder that succeeded closed %v", closed)
	}
	part(&ok, "verifier", fmt.Errorf("close verifier: broken pipe"))
	err := ok.close()
	if want := []string{"verifier", "kafka", "state", "source"}; !slices.Equal(closed, want) {
		t.Fatalf("close closed %v, want %v", closed, want)
	}
	if err == nil || err.Error() != "close verifier: broken pipe" {
		t.Fatalf("close: err %v, want the verifier's", err)
	}
	if ok.close(); len(closed) != 4 {
		t.Fatalf("a second close closed again: %v", closed)
	}
}
