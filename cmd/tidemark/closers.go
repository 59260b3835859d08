package main

import "errors"

// closers is a command's cleanup stack: each part is pushed right after it
// is opened, and close runs the stack in reverse order (the last part
// opened is closed first), once. A builder that fails part-way leaves
// nothing open: `defer cl.closeOnError(&err)`.
type closers struct {
	fns []func() error
}

// push adds the close of a part just opened.
func (c *closers) push(close func() error) {
	c.fns = append(c.fns, close)
}

// close closes every part pushed, the last one first, and empties the
// stack; the errors are joined.
func (c *closers) close() error {
	var errs []error
	for i := len(c.fns) - 1; i >= 0; i-- {
		errs = append(errs, c.fns[i]())
	}
	c.fns = nil
	return errors.Join(errs...)
}

// closeOnError closes the stack when *err is set (a builder's deferred
// cleanup); on success the parts stay open for the caller.
func (c *closers) closeOnError(err *error) {
	if *err != nil {
		c.close()
	}
}
