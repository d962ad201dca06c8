package main

import (
	"fmt"
	"io"
	"os"

	"github.com/iidp/metasync/schema"
)

// validate checks a config file: every problem on its own line and exit 1,
// or a one-line summary and exit 0.
func validate(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("validate", stderr)
	config := fs.String("config", "", "config file (required)")
	if err := fs.Parse(args); err != nil {
		return exitError{2}
	}
	if *config == "" {
		fmt.Fprintln(stderr, "metasync validate: --config is required")
		return exitError{2}
	}
	plan, err := schema.LoadPlan(*config, schema.LoadOptions{Environ: os.Environ()})
	if err != nil {
		for _, p := range schema.Problems(err) {
			fmt.Fprintln(stderr, p)
		}
		return exitError{1}
	}
	indexes := 0
	for _, r := range plan.Resources() {
		indexes += len(r.Indexes)
	}
	fmt.Fprintf(stdout, "%s: valid: %d resources, %d indexes, %d chains\n", *config, len(plan.Resources()), indexes, len(plan.Chains()))
	return nil
}
