// Package problems collects the problems found in a config, or in a cluster
// checked against one, into a single error that prints one problem per line
// after a count (a go-multierror list, so that callers can take it apart).
package problems

import (
	"fmt"
	"strings"

	"github.com/hashicorp/go-multierror"
)

// List collects problems. The zero List is empty and ready to use.
type List struct{ err *multierror.Error }

// Add appends one problem.
func (l *List) Add(err error) { l.err = multierror.Append(l.err, err) }

// Len returns the number of problems.
func (l *List) Len() int { return l.err.Len() }

// Err returns nil when the list is empty, else a *multierror.Error that
// prints as "N problems WHERE:" (where, such as "in the config") and then
// one problem per line.
func (l *List) Err(where string) error {
	if l.err == nil {
		return nil
	}
	l.err.ErrorFormat = func(errs []error) string {
		lines := make([]string, len(errs))
		for i, err := range errs {
			lines[i] = err.Error()
		}
		noun := "problems"
		if len(errs) == 1 {
			noun = "problem"
		}
		return fmt.Sprintf("%d %s %s:\n%s", len(errs), noun, where, strings.Join(lines, "\n"))
	}
	return l.err
}
