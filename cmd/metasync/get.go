package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"strings"
	"time"
)

// get asks a running daemon for the values of a key and prints them one
// per line.
func get(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("get", stderr)
	server := fs.String("server", "http://127.0.0.1:8080", "URL of a running metasync serve (env METASYNC_SERVER)")
	chain := fs.String("chain", "", "resolve KEY through this chain instead of an index")
	if err := fs.Parse(args); err != nil {
		return exitError{2}
	}
	if err := envForFlags(fs); err != nil {
		fmt.Fprintln(stderr, "metasync get:", err)
		return exitError{2}
	}
	base := strings.TrimRight(*server, "/")
	var path string
	switch {
	case *chain != "" && fs.NArg() == 1:
		path = "/v1/chains/" + url.PathEscape(*chain) + "/keys/" + url.PathEscape(fs.Arg(0))
	case *chain == "" && fs.NArg() == 2:
		path = "/v1/indexes/" + url.PathEscape(fs.Arg(0)) + "/keys/" + url.PathEscape(fs.Arg(1))
	default:
		fmt.Fprintln(stderr, "usage: metasync get [--server URL] INDEX KEY   or   metasync get [--server URL] --chain CHAIN KEY")
		return exitError{2}
	}
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(base + path)
	if err != nil {
		fmt.Fprintf(stderr, "metasync get: cannot reach metasync at %s: %v\n", base, err)
		return exitError{1}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		fmt.Fprintf(stderr, "metasync get: read answer from %s: %v\n", base, err)
		return exitError{1}
	}
	var ans struct {
		Values []string `json:"values"`
		Error  string   `json:"error"`
	}
	if err := json.Unmarshal(body, &ans); err != nil {
		fmt.Fprintf(stderr, "metasync get: %s answered %s, not metasync's JSON: %.200s\n", base, resp.Status, body)
		return exitError{1}
	}
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "metasync get: %s (%s)\n", ans.Error, resp.Status)
		return exitError{1}
	}
	for _, v := range ans.Values {
		fmt.Fprintln(stdout, v)
	}
	return nil
}
