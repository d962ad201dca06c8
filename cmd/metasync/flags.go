package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// newFlags returns a FlagSet that reports its errors on stderr, with the
// command's synopsis above its flags in its usage.
func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("metasync "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		synopsis := synopses[name]
		if synopsis == "" {
			synopsis = "metasync " + name
		}
		fmt.Fprintf(fs.Output(), "usage:\n  %s\nflags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// envForFlags sets every flag that was not given on the command line from
// its METASYNC_ variable (METASYNC_ + the flag's name in upper snake case),
// so that flags > environment. A variable whose value the flag refuses is
// a usage error: printed on stderr after the command's name ("metasync
// serve: ..."), and exitError{2}.
func envForFlags(fs *flag.FlagSet, stderr io.Writer) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		name := "METASYNC_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", name, v, e)
			}
		}
	})
	if err != nil {
		fmt.Fprintln(stderr, fs.Name()+":", err)
		return exitError{2}
	}
	return nil
}

// listMode is --streaming-list: "false" (every list a LIST), "true" (every
// list streamed) or "auto" (the lists of resources watched whole
// streamed). The flag alone means "true"; it takes what a boolean flag
// takes (1, t, TRUE, 0, f, ...) and "auto" in any case.
type listMode string

func (m *listMode) String() string { return string(*m) }

func (m *listMode) Set(v string) error {
	if strings.EqualFold(v, "auto") {
		*m = "auto"
		return nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return fmt.Errorf(`want true, false or auto, got %q`, v)
	}
	*m = listMode(strconv.FormatBool(b))
	return nil
}

func (m *listMode) IsBoolFlag() bool { return true }

// given reports whether the flag name was set on the command line.
func given(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
