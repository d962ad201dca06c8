package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/iidp/metasync/internal/streamclient"
	"github.com/iidp/metasync/internal/tlsfiles"
	"github.com/iidp/metasync/internal/wire"
)

// defaultServer is where get and indexes find a daemon by default.
const defaultServer = "http://127.0.0.1:8080"

// get asks a running daemon for the values of a key and prints them one
// per line; given an index and no key, it prints the index's keys, one per
// line, following the pages of the answer.
func get(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("get", stderr)
	server := fs.String("server", defaultServer, "URL of a running metasync serve (env METASYNC_SERVER)")
	cf := addClientFlags(fs)
	chain := fs.String("chain", "", "resolve KEY through this chain instead of an index")
	limit := fs.Int("limit", 0, "with INDEX alone: keys asked per request (default: the daemon's page, at most 10000); every page is printed")
	watch := fs.Bool("watch", false, "print each answer as it changes, one JSON line each, until interrupted (with INDEX alone: every key's)")
	zone := fs.String("zone", "", "with a KEY: ask as a caller in this zone (topology-aware answers, from an index's hints)")
	node := fs.String("node", "", "with a KEY: ask as a caller on this node (topology-aware answers, from an index's hints)")
	objects := fs.Bool("objects", false, "with INDEX KEY: print the objects behind the key, with their projected fields, one JSON line each")
	resource := fs.String("resource", "", "with a KEY: print the projected fields of the object of this resource entry whose key (namespace/name, or name) is KEY, one JSON line (with clusters:, one per cluster that has it; CLUSTER:KEY names one cluster's)")
	explain := fs.Bool("explain", false, "with INDEX KEY or --chain CHAIN KEY: print where the answer comes from, as a tree: each index the lookup follows, its keys and values, and the objects (with resourceVersion) that gave them; a conflict on a unique index lists every claimant and marks the one answered")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return exitError{2}
	}
	if err := envForFlags(fs, stderr); err != nil {
		return err
	}
	c, err := newClient(*server, cf, "get", stderr)
	if err != nil {
		return err
	}
	for k, v := range map[string]string{"zone": *zone, "node": *node} {
		if v != "" {
			if c.query == nil {
				c.query = url.Values{}
			}
			c.query.Set(k, v)
		}
	}
	resourceSet := false
	fs.Visit(func(f *flag.Flag) { resourceSet = resourceSet || f.Name == "resource" })
	if *explain && (*resource != "" || *objects || resourceSet) {
		fmt.Fprintln(stderr, "metasync get: --explain explains one answer: not with --objects or --resource")
		return exitError{2}
	}
	switch {
	case *resource != "" || *objects || resourceSet:
		switch {
		case slices.Contains(pos, "") || resourceSet && *resource == "":
			fmt.Fprintln(stderr, "metasync get: --objects and --resource need a non-empty INDEX (or RESOURCE) and KEY")
			return exitError{2}
		case *watch || *chain != "" || *resource != "" && *objects:
			fmt.Fprintln(stderr, "metasync get: --objects and --resource read objects now: not with --watch, --chain or each other")
			return exitError{2}
		case *resource != "" && len(pos) == 1:
			return c.printObject(*resource, pos[0], stdout, stderr)
		case *objects && len(pos) == 2:
			return c.printObjects(pos[0], pos[1], stdout, stderr)
		}
		fmt.Fprintln(stderr, "usage: metasync get [--server URL] --objects INDEX KEY   or   metasync get [--server URL] --resource RESOURCE KEY")
		return exitError{2}
	}
	if *explain {
		var path string
		switch {
		case *watch:
		case *chain != "" && len(pos) == 1:
			path = "/v1/chains/" + pathSegment(*chain) + "/keys/" + pathSegment(pos[0])
		case *chain == "" && len(pos) == 2:
			path = "/v1/indexes/" + pathSegment(pos[0]) + "/keys/" + pathSegment(pos[1])
		}
		if path == "" || *limit != 0 {
			fmt.Fprintln(stderr, "metasync get: --explain explains one answer: give INDEX KEY or --chain CHAIN KEY, without --watch or --limit")
			return exitError{2}
		}
		return c.printExplained(path, stdout, stderr)
	}
	if *limit != 0 && (*watch || *chain != "" || len(pos) != 1) {
		fmt.Fprintln(stderr, "metasync get: --limit pages the keys of an index: give INDEX alone, without --watch or --chain")
		return exitError{2}
	}
	if *watch {
		var path string
		switch {
		case *chain != "" && len(pos) == 1:
			path = "/v1/chains/" + pathSegment(*chain) + "/keys/" + pathSegment(pos[0])
		case *chain == "" && len(pos) == 2:
			path = "/v1/indexes/" + pathSegment(pos[0]) + "/keys/" + pathSegment(pos[1])
		case *chain == "" && len(pos) == 1:
			path = "/v1/indexes/" + pathSegment(pos[0]) + "/keys"
		}
		if path != "" {
			ctx, stop := watchContext()
			defer stop()
			return c.follow(ctx, path, stdout, stderr)
		}
	}
	switch {
	case *chain != "" && len(pos) == 1:
		path := "/v1/chains/" + pathSegment(*chain) + "/keys/" + pathSegment(pos[0])
		if err := c.printValues(path, stdout, stderr); err != nil {
			return err
		}
		c.noteConflicts(path, "--chain "+printable(*chain)+" "+printable(pos[0]), stderr)
		return nil
	case *chain == "" && len(pos) == 2:
		path := "/v1/indexes/" + pathSegment(pos[0]) + "/keys/" + pathSegment(pos[1])
		if err := c.printValues(path, stdout, stderr); err != nil {
			return err
		}
		c.noteConflicts(path, printable(pos[0])+" "+printable(pos[1]), stderr)
		return nil
	case *chain == "" && len(pos) == 1:
		return c.printKeys(pos[0], *limit, stdout, stderr)
	default:
		fmt.Fprintln(stderr, "usage: metasync get [--server URL] [--watch] INDEX KEY   or   metasync get [--server URL] [--watch] --chain CHAIN KEY   or   metasync get [--server URL] [--watch] INDEX   or   metasync get [--server URL] --objects INDEX KEY   or   metasync get [--server URL] --resource RESOURCE KEY")
		return exitError{2}
	}
}

// indexes prints every index of a running daemon (name, resource, number
// of keys, whether its resource has synced, whether it is stale, how many
// objects fail its rule now), then every chain, then the last rule error
// of each index whose rule fails.
func indexes(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("indexes", stderr)
	server := fs.String("server", defaultServer, "URL of a running metasync serve (env METASYNC_SERVER)")
	cf := addClientFlags(fs)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return exitError{2}
	}
	if err := envForFlags(fs, stderr); err != nil {
		return err
	}
	if len(pos) > 0 {
		fmt.Fprintln(stderr, "usage: metasync indexes [--server URL]")
		return exitError{2}
	}
	var ans wire.Indexes
	c, err := newClient(*server, cf, "indexes", stderr)
	if err != nil {
		return err
	}
	if err := c.getJSON("indexes", "/v1/indexes", &ans, stderr); err != nil {
		return err
	}
	var chains wire.Chains
	if err := c.getJSON("indexes", "/v1/chains", &chains, stderr); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tRESOURCE\tKEYS\tSYNCED\tSTALE\tFAILING\tCONFLICTS")
	conflicts := 0
	for _, ix := range ans.Indexes {
		c := "-" // not unique: every value is answered
		if ix.Unique {
			c = strconv.Itoa(ix.Conflicts)
			conflicts += ix.Conflicts
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%t\t%t\t%d\t%s\n", ix.Name, ix.Resource, ix.Keys, ix.Synced, ix.Stale, ix.Failing, c)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(chains.Chains) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "CHAIN\tINDEXES\tSYNCED")
		for _, ch := range chains.Chains {
			fmt.Fprintf(tw, "%s\t%s\t%t\n", ch.Name, strings.Join(ch.Indexes, " -> "), ch.Synced)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	first := true
	for _, ix := range ans.Indexes {
		if rf := ix.LastRuleError; rf != nil {
			if first {
				fmt.Fprintln(stdout, "\nFAILING: objects that add nothing to an index, its rule failing for them; the last of each index:")
				first = false
			}
			object := printable(rf.Object)
			if rf.Cluster != "" {
				object += " in cluster " + rf.Cluster
			}
			fmt.Fprintf(stdout, "  %s: %d object(s); last %s at %s: %s\n", ix.Name, ix.Failing, object, rf.At.Format(time.RFC3339), rf.Error)
		}
	}
	if conflicts > 0 {
		fmt.Fprintln(stdout, "\nCONFLICTS: keys of a unique index claimed by several objects with different values; each answers the oldest's (/readyz?verbose names the keys; metasync get --explain INDEX KEY the claimants)")
	}
	if ans.Stale {
		fmt.Fprintln(stderr, staleNote)
	}
	return nil
}

// noteConflicts says on stderr when the answer of path (a lookup or a
// chain lookup, printed already) went through a key in conflict on a
// unique index: several objects claim it, and the oldest's value is
// answered. It asks only when some unique index has conflicts, and says
// nothing when it cannot tell.
func (c *client) noteConflicts(path, what string, stderr io.Writer) {
	var ixs wire.Indexes
	if c.getJSON("get", "/v1/indexes", &ixs, io.Discard) != nil {
		return
	}
	some := false
	for _, ix := range ixs.Indexes {
		some = some || ix.Unique && ix.Conflicts > 0
	}
	if !some {
		return
	}
	q := url.Values{}
	for k, v := range c.query {
		q[k] = v
	}
	q.Set("explain", "true")
	var ans wire.Lookup
	if c.getJSON("get", path+"?"+q.Encode(), &ans, io.Discard) != nil {
		return
	}
	for _, st := range ans.Steps {
		if len(st.Conflicts) > 0 {
			fmt.Fprintf(stderr, "metasync: note: conflict: several objects claim %s in the unique index %s, with different values; the oldest's is answered (metasync get --explain %s names them)\n",
				list(st.Conflicts), st.Index, what)
		}
	}
}

// staleNote is what get and indexes say of an answer marked stale.
const staleNote = "metasync: note: stale: the daemon answers from data that may be behind the apiserver (a warm start's snapshot that its watch has not caught up with yet); see /readyz?verbose"

// noteState says on stderr what an answer's synced and stale flags mean,
// for a reader who sees only the values on stdout.
func noteState(synced *bool, stale bool, stderr io.Writer) {
	if synced != nil && !*synced {
		fmt.Fprintln(stderr, "metasync: note: not synced: the daemon has not completed its first list of this resource; an empty answer means not known yet")
	}
	if stale {
		fmt.Fprintln(stderr, staleNote)
	}
}

// printObject prints one object's projected fields as a JSON line,
// {"key":...,"fields":{...}} ("cluster" too, of a config with
// clusters:); a key that names an object in several clusters, a line
// each.
func (c *client) printObject(resource, key string, stdout, stderr io.Writer) error {
	var ans wire.Object
	if err := c.getJSON("get", "/v1/resources/"+pathSegment(resource)+"/objects/"+pathSegment(key), &ans, stderr); err != nil {
		return err
	}
	if ans.Fields == nil {
		fmt.Fprintf(stderr, "metasync get: %s answered without fields: not an object\n", c.base)
		return exitError{1}
	}
	objs := ans.Objects
	if len(objs) == 0 {
		objs = []wire.ObjectFields{{Key: ans.Key, Cluster: ans.Cluster, Fields: ans.Fields}}
	}
	for _, o := range objs {
		line, _ := json.Marshal(o)
		if _, err := fmt.Fprintf(stdout, "%s\n", line); err != nil {
			return err
		}
	}
	noteState(nil, ans.Stale, stderr)
	return nil
}

// printObjects prints the objects behind an index key, a JSON line each.
func (c *client) printObjects(index, key string, stdout, stderr io.Writer) error {
	var ans wire.Objects
	path := "/v1/indexes/" + pathSegment(index) + "/keys/" + pathSegment(key) + "/objects"
	if err := c.getJSON("get", path, &ans, stderr); err != nil {
		return err
	}
	if ans.Objects == nil {
		fmt.Fprintf(stderr, "metasync get: %s answered %s without objects\n", c.base, path)
		return exitError{1}
	}
	for _, o := range ans.Objects {
		line, _ := json.Marshal(o)
		if _, err := fmt.Fprintf(stdout, "%s\n", line); err != nil {
			return err
		}
	}
	noteState(ans.Synced, ans.Stale, stderr)
	return nil
}

// parseInterspersed parses args with fs, flags before, between and after
// the positional arguments, which it returns; after "--" every argument
// is positional ("--" as the value of a flag, --zone --, is a value).
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var after []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			args, after = args[:i], args[i+1:]
			break
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && a != "-" && !hasValue {
			if f := fs.Lookup(name); f != nil && !isBoolFlag(f) {
				i++ // its value, whatever it looks like
			}
		}
	}
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return append(pos, after...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// isBoolFlag reports whether f takes no value (-watch, not -zone Z).
func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// pathSegment escapes s as one segment of a URL path (see
// streamclient.PathSegment).
func pathSegment(s string) string { return streamclient.PathSegment(s) }

// clientFlags are how get and indexes reach a daemon that serves TLS and
// reviews tokens: --token-file, --ca-file, --tls-server-name.
type clientFlags struct {
	tokenFile, caFile, serverName *string
}

// addClientFlags defines the clientFlags on fs.
func addClientFlags(fs *flag.FlagSet) clientFlags {
	return clientFlags{
		tokenFile:  fs.String("token-file", "", "send the token in this file as a bearer token (to a daemon with --auth=tokenreview), read again at each connection; give a token for the daemon's --auth-audience (env METASYNC_TOKEN_FILE)"),
		caFile:     fs.String("ca-file", "", "with an https:// --server: verify the daemon's certificate against the PEM CA certificates in this file, read again at each connection (default: the system's roots) (env METASYNC_CA_FILE)"),
		serverName: fs.String("tls-server-name", "", "with an https:// --server: the name the daemon's certificate must hold, when it is not the URL's host (env METASYNC_TLS_SERVER_NAME)"),
	}
}

// client asks one daemon.
type client struct {
	base  string
	http  *http.Client
	token func() (string, error) // nil: no token
	// stream is the client of change streams: the same, without Timeout.
	stream *http.Client
	// query is sent with lookups of a key and their streams (zone, node).
	query url.Values
}

// newClient returns a client of the daemon at server (a base URL), as the
// client flags say. Flags that cannot work (a CA file that holds no
// certificate, TLS flags with an http:// URL) are a usage error, printed
// on stderr after "metasync cmd:".
func newClient(server string, cf clientFlags, cmd string, stderr io.Writer) (*client, error) {
	base := strings.TrimRight(server, "/")
	if !strings.Contains(base, "://") && base != "" {
		base = "http://" + base // HOST:PORT, as --listen takes it
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		fmt.Fprintf(stderr, "metasync %s: --server %q: want http://HOST:PORT or https://HOST:PORT\n", cmd, server)
		return nil, exitError{2}
	}
	if u.Scheme == "http" && (*cf.caFile != "" || *cf.serverName != "") {
		fmt.Fprintf(stderr, "metasync %s: --ca-file and --tls-server-name need an https:// --server, not %s\n", cmd, server)
		return nil, exitError{2}
	}
	if *cf.caFile != "" {
		if _, err := tlsfiles.CAPool(*cf.caFile); err != nil {
			fmt.Fprintf(stderr, "metasync %s: --ca-file: %v\n", cmd, err)
			return nil, exitError{2}
		}
	}
	// metasync answers every API path itself: a redirect means something
	// else answers, or a path was rewritten; say so rather than follow it
	// to another endpoint.
	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	c := &client{
		base:   base,
		http:   &http.Client{Timeout: 10 * time.Second, Transport: tlsfiles.Transport(*cf.caFile, *cf.serverName), CheckRedirect: noRedirect},
		stream: streamclient.NewClient(*cf.caFile, *cf.serverName),
	}
	if *cf.tokenFile != "" {
		c.token = streamclient.TokenFile(*cf.tokenFile)
	}
	return c, nil
}

// getJSON GETs path (escaped already) and decodes the answer into v. On
// failure it prints why on stderr, prefixed with "metasync cmd:", and
// returns exitError{1}.
func (c *client) getJSON(cmd, path string, v any, stderr io.Writer) error {
	req, err := http.NewRequest(http.MethodGet, c.base+path, nil)
	if err != nil {
		fmt.Fprintf(stderr, "metasync %s: %v\n", cmd, err)
		return exitError{1}
	}
	if c.token != nil {
		token, err := c.token()
		if err != nil {
			fmt.Fprintf(stderr, "metasync %s: --token-file: %v\n", cmd, err)
			return exitError{1}
		}
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "metasync %s: cannot reach metasync at %s: %v\n", cmd, c.base, err)
		return exitError{1}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		fmt.Fprintf(stderr, "metasync %s: read answer from %s: %v\n", cmd, c.base, err)
		return exitError{1}
	}
	var e wire.Error
	if resp.StatusCode != http.StatusOK {
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			fmt.Fprintf(stderr, "metasync %s: %s (%s)\n", cmd, e.Error, resp.Status)
		} else {
			fmt.Fprintf(stderr, "metasync %s: %s answered %s to %s, not metasync's JSON: %.200s\n", cmd, c.base, resp.Status, path, body)
		}
		return exitError{1}
	}
	if err := json.Unmarshal(body, v); err != nil {
		fmt.Fprintf(stderr, "metasync %s: %s answered %s, not metasync's JSON: %.200s\n", cmd, c.base, resp.Status, body)
		return exitError{1}
	}
	return nil
}

// printValues prints the values of a lookup (index or chain), one per line.
func (c *client) printValues(path string, stdout, stderr io.Writer) error {
	var ans wire.Lookup
	if len(c.query) > 0 {
		path += "?" + c.query.Encode()
	}
	if err := c.getJSON("get", path, &ans, stderr); err != nil {
		return err
	}
	if ans.Values == nil {
		fmt.Fprintf(stderr, "metasync get: %s answered %s without values: not a lookup\n", c.base, path)
		return exitError{1}
	}
	for _, v := range *ans.Values {
		fmt.Fprintln(stdout, v)
	}
	noteState(ans.Synced, ans.Stale, stderr)
	if len(*ans.Values) == 0 && (ans.Synced == nil || *ans.Synced) && !ans.Stale {
		fmt.Fprintln(stderr, "metasync: note: no values: no object gives this key a value now (--explain tells each step)")
	}
	return nil
}

// printExplained prints an explained answer as a tree: the answer, then
// each step with the objects behind its values.
func (c *client) printExplained(path string, stdout, stderr io.Writer) error {
	if c.query == nil {
		c.query = url.Values{}
	}
	c.query.Set("explain", "true")
	path += "?" + c.query.Encode()
	var ans wire.Lookup
	if err := c.getJSON("get", path, &ans, stderr); err != nil {
		return err
	}
	if ans.Values == nil {
		fmt.Fprintf(stderr, "metasync get: %s answered %s without values: not a lookup\n", c.base, path)
		return exitError{1}
	}
	if len(ans.Steps) == 0 {
		fmt.Fprintf(stderr, "metasync get: %s answered %s without steps: it does not explain (a metasync older than --explain?)\n", c.base, path)
		return exitError{1}
	}
	name := ans.Index
	if ans.Chain != "" {
		name = "chain " + ans.Chain
	}
	fmt.Fprintf(stdout, "%s %s → %s\n", name, printable(ans.Key), list(*ans.Values))
	for i, st := range ans.Steps {
		branch, indent := "├─", "│  "
		if i == len(ans.Steps)-1 {
			branch, indent = "└─", "   "
		}
		line := fmt.Sprintf("%s %s: %s → %s", branch, st.Index, list(st.Keys), list(st.Values))
		switch {
		case st.Empty != "":
			line += " (" + st.Empty + ")"
		case !st.Synced:
			line += " (not synced)"
		case st.Stale:
			line += " (stale)"
		}
		fmt.Fprintln(stdout, line)
		for _, k := range st.Conflicts {
			fmt.Fprintf(stdout, "%s   conflict on %s: claimed by several objects, the oldest answered\n", indent, printable(k))
		}
		// An object that gives a key both values and fallback values
		// (an EndpointSlice with ready and terminating endpoints) is
		// one line: its values, then its fallback's.
		type claim struct{ resource, key, cluster, indexKey string }
		var order []claim
		byClaim := map[claim][]wire.StepObject{}
		for _, o := range st.Objects {
			c := claim{o.Resource, o.Key, o.Cluster, o.IndexKey}
			if _, seen := byClaim[c]; !seen {
				order = append(order, c)
			}
			byClaim[c] = append(byClaim[c], o)
		}
		for j, c := range order {
			b := "├─"
			if j == len(order)-1 {
				b = "└─"
			}
			parts := byClaim[c]
			slices.SortStableFunc(parts, func(x, y wire.StepObject) int { // values before the fallback's
				switch {
				case x.Fallback == y.Fallback:
					return 0
				case y.Fallback:
					return -1
				}
				return 1
			})
			o := parts[0]
			line := fmt.Sprintf("%s%s %s %s (", indent, b, o.Resource, printable(o.Key))
			if o.Cluster != "" {
				line += "cluster " + printable(o.Cluster) + ", "
			}
			line += "resourceVersion " + printable(o.ResourceVersion)
			if o.CreationTimestamp != nil {
				line += ", created " + o.CreationTimestamp.UTC().Format(time.RFC3339)
			}
			line += fmt.Sprintf("): %s → ", printable(o.IndexKey))
			for k, o := range parts {
				if k > 0 {
					line += "; "
				}
				if o.Fallback && len(parts) > 1 {
					line += "fallback "
				}
				line += list(o.Values)
				switch {
				case o.Chosen:
					line += "  [chosen: oldest]"
				case len(o.Unanswered) > 0 && slices.Contains(st.Conflicts, o.IndexKey):
					line += "  [not answered: younger claimant]"
				case len(o.Unanswered) > 0 && o.Why != "":
					line += "  [not answered: " + list(o.Unanswered) + ", " + o.Why + "]"
				}
				if o.Fallback && len(o.Unanswered) < len(o.Values) {
					line += "  [fallback: serving terminating]"
				}
			}
			fmt.Fprintln(stdout, line)
		}
	}
	noteState(ans.Synced, ans.Stale, stderr)
	return nil
}

// list prints values for a tree: comma-separated, or "nothing"; each as
// shown by printable.
func list(vs []string) string {
	if len(vs) == 0 {
		return "nothing"
	}
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = printable(v)
	}
	return strings.Join(out, ", ")
}

// printable is s, or s quoted when it holds what would break a line of
// the tree or the terminal (a newline, an escape, a comma): keys and
// values come from objects anyone who may write them chooses.
func printable(s string) string {
	if s == "" || strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) || r == ',' }) {
		return strconv.Quote(s)
	}
	return s
}

// printKeys prints every key of an index, one per line, asking page after
// page until the last: each answer's "continue", passed back as it is
// (opaque), asks for the next. limit > 0 is the size of a page.
func (c *client) printKeys(index string, limit int, stdout, stderr io.Writer) error {
	after := ""
	for {
		path := "/v1/indexes/" + pathSegment(index) + "/keys"
		q := url.Values{}
		if limit > 0 {
			q.Set("limit", fmt.Sprint(limit))
		}
		if after != "" {
			q.Set("continue", after)
		}
		if len(q) > 0 {
			path += "?" + q.Encode()
		}
		var ans wire.Keys
		if err := c.getJSON("get", path, &ans, stderr); err != nil {
			return err
		}
		if ans.Keys == nil {
			fmt.Fprintf(stderr, "metasync get: %s answered %s without keys\n", c.base, path)
			return exitError{1}
		}
		for _, k := range *ans.Keys {
			if _, err := fmt.Fprintln(stdout, k); err != nil {
				return err
			}
		}
		if ans.Continue == "" {
			noteState(ans.Synced, ans.Stale, stderr)
			return nil
		}
		if ans.Continue == after || len(*ans.Keys) == 0 {
			fmt.Fprintf(stderr, "metasync get: %s answered a page of keys that does not advance (continue=%q)\n", c.base, ans.Continue)
			return exitError{1}
		}
		after = ans.Continue
	}
}
