// Command metasync keeps Kubernetes metadata in memory and answers lookups
// over HTTP.
//
//	metasync serve    --config FILE [--kubeconfig FILE] [--context NAME] [--listen ADDR]
//	metasync validate --config FILE [--cluster]
//	metasync get      [--server URL] INDEX KEY   (or: --chain CHAIN KEY)
//	metasync version
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// exitError carries an exit code; its message, if any, is already printed.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

func main() {
	err := run(os.Args[1:], os.Stdout, os.Stderr)
	var ee exitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		os.Exit(ee.code)
	default:
		fmt.Fprintln(os.Stderr, "metasync:", err)
		os.Exit(1)
	}
}

const usage = `usage:
  metasync serve    --config FILE [--kubeconfig FILE] [--context NAME] [--listen ADDR]
  metasync validate --config FILE [--cluster]
  metasync get      [--server URL] INDEX KEY    (or: --chain CHAIN KEY)
  metasync version
`

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitError{2}
	}
	switch args[0] {
	case "serve":
		return serve(args[1:], stdout, stderr)
	case "validate":
		return validate(args[1:], stdout, stderr)
	case "get":
		return get(args[1:], stdout, stderr)
	case "version", "--version", "-v":
		fmt.Fprintln(stdout, "metasync", version)
		return nil
	case "help", "--help", "-h":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprintf(stderr, "metasync: unknown command %q\n%s", args[0], usage)
		return exitError{2}
	}
}

// newFlags returns a FlagSet that reports its errors on stderr.
func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("metasync "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}
