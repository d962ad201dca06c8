package main

import (
	"fmt"
	"io"
)

func serve(args []string, stdout, stderr io.Writer) error {
	fmt.Fprintln(stderr, "metasync serve: not built yet")
	return exitError{1}
}

func get(args []string, stdout, stderr io.Writer) error {
	fmt.Fprintln(stderr, "metasync get: not built yet")
	return exitError{1}
}
