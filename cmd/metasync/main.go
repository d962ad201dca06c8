// Command metasync keeps Kubernetes metadata in memory and answers lookups
// over HTTP.
//
//	metasync serve    --config FILE [--kubeconfig FILE] [--context NAME] [--listen ADDR]
//	metasync validate --config FILE [--cluster] [--diff OLD]   (or: metasync validate [flags] FILE)
//	metasync get      [--server URL] [--watch] INDEX KEY    (or: --chain CHAIN KEY)
//	metasync get      [--server URL] INDEX        (every key of the index, one per line)
//	metasync indexes  [--server URL]              (every index: name, resource, keys, synced)
//	metasync version
//
// `metasync COMMAND --help` (or -h, or `metasync help COMMAND`) prints a
// command's flags and exits 0.
package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"

	"github.com/iidp/metasync/schema"
)

// version is set at build time with -ldflags "-X main.version=..."; left
// at "dev", init reads it from what the Go toolchain stamped into the
// binary (see buildVersion), for `metasync version` and serve's logs.
var version = "dev"

func init() { version = buildVersion(version) }

// exitError carries an exit code; its message, if any, is already printed.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

// main runs the command that os.Args name and exits with its code.
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
  metasync validate --config FILE [--cluster] [--diff OLD]    (or: metasync validate [flags] FILE)
  metasync get      [--server URL] [--watch] INDEX KEY     (or: --chain CHAIN KEY)
  metasync get      [--server URL] INDEX         every key of the index, one per line
  metasync get      [--server URL] --objects INDEX KEY      the objects behind the key, with their fields
  metasync get      [--server URL] --resource RESOURCE KEY  one object's fields
  metasync indexes  [--server URL]               every index (keys, synced, stale, rules failing), every chain
  metasync version
Run 'metasync COMMAND --help' for the flags of a command.
`

// synopses are the usage lines of each subcommand (for --help).
var synopses = map[string]string{
	"serve":    "metasync serve --config FILE [--kubeconfig FILE] [--context NAME] [--listen ADDR]",
	"validate": "metasync validate --config FILE [--cluster] [--diff OLD]\n  metasync validate [flags] FILE",
	"get":      "metasync get [--server URL] [--watch] INDEX KEY\n  metasync get [--server URL] [--watch] --chain CHAIN KEY\n  metasync get [--server URL] [--watch] INDEX    (every key of the index, one per line)\n  metasync get [--server URL] --objects INDEX KEY    (the objects behind the key, with their fields, a JSON line each)\n  metasync get [--server URL] --resource RESOURCE KEY    (one object's fields, a JSON line)\n  --watch prints each answer as it changes, one JSON line each, until Ctrl-C\n  flags may come before or after the arguments; a stale or not yet synced answer is noted on stderr",
	"indexes":  "metasync indexes [--server URL]    (every index: name, resource, keys, synced, stale, objects failing its rule; every chain; the last rule error of each index)",
	"version":  "metasync version    (the version metasync was built as: a tag, or the commit)",
}

// command returns the subcommand called name, or nil.
func command(name string) func(args []string, stdout, stderr io.Writer) error {
	switch name {
	case "serve":
		return serve
	case "validate":
		return validate
	case "get":
		return get
	case "indexes":
		return indexes
	}
	return nil
}

// run runs the command that args name (version and help included),
// printing on stdout and stderr. An exitError carries the exit code.
func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitError{2}
	}
	switch args[0] {
	case "version", "--version", "-version", "-v":
		if wantsHelp(args[1:]) {
			fmt.Fprintf(stdout, "usage:\n  %s\n", synopses["version"])
			return nil
		}
		if len(args) > 1 {
			fmt.Fprintf(stderr, "metasync version: takes no flag or argument, not %q\nusage:\n  %s\n", args[1], synopses["version"])
			return exitError{2}
		}
		fmt.Fprintln(stdout, "metasync", version)
		return nil
	case "help", "--help", "-help", "-h":
		if len(args) > 1 {
			if command(args[1]) != nil {
				return help(args[1], stdout)
			}
			if args[1] == "version" {
				fmt.Fprintf(stdout, "usage:\n  %s\n", synopses["version"])
				return nil
			}
		}
		fmt.Fprint(stdout, usage)
		return nil
	}
	cmd := command(args[0])
	if cmd == nil {
		fmt.Fprintf(stderr, "metasync: unknown command %q\n%s", args[0], usage)
		return exitError{2}
	}
	if wantsHelp(args[1:]) {
		return help(args[0], stdout)
	}
	return cmd(args[1:], stdout, stderr)
}

// wantsHelp reports whether args ask for help: -h, -help or --help before
// a "--".
func wantsHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "-help", "--help", "--h":
			return true
		}
	}
	return false
}

// help prints a command's synopsis and flags on stdout. The command
// itself prints them, asked with -h alone: its flag set's usage (see
// newFlags) goes to the stderr it is given, nothing runs.
func help(name string, stdout io.Writer) error {
	var buf bytes.Buffer
	_ = command(name)([]string{"-h"}, io.Discard, &buf)
	_, err := stdout.Write(buf.Bytes())
	return err
}

// buildVersion is v when the build set it (-ldflags "-X main.version=...");
// otherwise what the Go toolchain stamped into the binary: a module
// version (go install ...@v1.2.3, or a checkout at a tag), else
// "dev-" and the commit of the checkout it was built from ("+dirty" with
// uncommitted changes), else v.
func buildVersion(v string) string {
	if v != "dev" {
		return v
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	return versionOf(info, v)
}

// versionOf is buildVersion's reading of a binary's build information.
func versionOf(info *debug.BuildInfo, fallback string) string {
	mod := info.Main.Version
	if mod == "(devel)" {
		mod = ""
	}
	if mod != "" && !isPseudoVersion(mod) {
		return mod
	}
	var rev string
	var dirty bool
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev != "" {
		if len(rev) > 7 {
			rev = rev[:7]
		}
		v := "dev-" + rev
		if dirty {
			v += "+dirty"
		}
		return v
	}
	if mod != "" {
		return mod
	}
	return fallback
}

// isPseudoVersion reports whether v is a Go pseudo-version, such as
// v0.0.0-20260102150405-9ba5f88abcde (a commit, not a release), possibly
// with +dirty.
func isPseudoVersion(v string) bool {
	v, _, _ = strings.Cut(v, "+")
	i := strings.LastIndexByte(v, '-')
	if i < 0 || len(v)-i-1 != 12 {
		return false
	}
	rest := v[:i]
	j := strings.LastIndexAny(rest, "-.")
	if j < 0 {
		return false
	}
	stamp := rest[j+1:]
	if len(stamp) != 14 {
		return false
	}
	for _, c := range stamp + v[i+1:] {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return false
		}
	}
	return true
}

// plural is "1 chain", "2 chains", "0 chains": n and the word, in the
// plural unless n is 1.
func plural(n int, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}

// printProblems prints every problem that err holds (see schema.Problems)
// on w, one per line, and returns how many it printed.
func printProblems(w io.Writer, err error) int {
	problems := schema.Problems(err)
	for _, p := range problems {
		fmt.Fprintln(w, p)
	}
	return len(problems)
}
