package plan

import (
	"strings"
)

// scanSlice reads an EndpointSlice in one pass over its JSON, where
// parseSliceGJSON walks each endpoint several times (to find its end, its
// addresses, its conditions, its hints). It gives the same table as
// parseSliceGJSON for every valid document it accepts, and refuses (ok
// false) whatever it could not read the same way: a broken structure or
// word where it reads (what it skips it checks no further than its
// brackets and quotes: the apiserver's JSON is valid), an escape in a
// key or in a string it keeps, a port number not written as a plain
// integer, a list or an element of a shape gjson reads in its own
// way (an object where an array is expected, a string where an object
// is, a key it reads written twice in one object: gjson then takes the
// first whose value has what its path asks for). The apiserver writes
// none of those, so its slices take this path.
func scanSlice(doc string) (*slice, bool) {
	sc := scanner{s: doc}
	p := &slice{eps: make([]sliceEndpoint, 0, 16)}
	var arena []byte
	var offs []int
	seenType := false
	ok := sc.object(func(key string) bool {
		switch key {
		case "addressType":
			if seenType || sc.peek() != '"' {
				return false
			}
			seenType = true
			t, ok := sc.plain()
			p.fqdn = t == "FQDN"
			return ok
		case "ports":
			return sc.list(func() bool { return sc.port(p) })
		case "endpoints":
			return sc.list(func() bool {
				e, addr, ok := sc.endpoint()
				if ok && addr != "" {
					offs = append(offs, len(arena))
					arena = append(arena, addr...)
					e.addr = addr
					p.eps = append(p.eps, e)
				}
				return ok
			})
		}
		return sc.skip()
	})
	if !ok {
		return nil, false
	}
	sc.ws()
	if sc.i != len(sc.s) {
		return nil, false
	}
	all := string(arena)
	for i := range p.eps {
		p.eps[i].addr = all[offs[i] : offs[i]+len(p.eps[i].addr)]
	}
	return p, true
}

// scanner is a cursor in a JSON document. Its methods return false when
// they refuse the document; the cursor is then anywhere.
type scanner struct {
	s string
	i int
}

func (sc *scanner) ws() {
	if sc.i < len(sc.s) && sc.s[sc.i] > ' ' {
		return
	}
	for sc.i < len(sc.s) {
		switch sc.s[sc.i] {
		case ' ', '\t', '\n', '\r':
			sc.i++
		default:
			return
		}
	}
}

// peek is the next byte after white space, 0 at the end.
func (sc *scanner) peek() byte {
	sc.ws()
	if sc.i >= len(sc.s) {
		return 0
	}
	return sc.s[sc.i]
}

// str reads the string at the cursor and returns its text between the
// quotes, escapes as written, and whether it has an escape.
func (sc *scanner) str() (text string, esc, ok bool) {
	if sc.peek() != '"' {
		return "", false, false
	}
	// A loop of bytes: the strings of a slice are short, shorter than
	// what a call of IndexByte pays for.
	s := sc.s
	for j := sc.i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			esc = true
			j++
		case '"':
			text = s[sc.i+1 : j]
			sc.i = j + 1
			return text, esc, true
		}
	}
	return "", false, false
}

// plain reads a string that holds no escape: its text is its value.
func (sc *scanner) plain() (string, bool) {
	s, esc, ok := sc.str()
	return s, ok && !esc
}

// literal reads a number, true, false or null as written; a word that is
// none of those three (gjson reads "fals" as false) is refused.
func (sc *scanner) literal() (string, bool) {
	c := sc.peek()
	switch {
	case c == '-' || c >= '0' && c <= '9' || c == 't' || c == 'f' || c == 'n':
	default:
		return "", false
	}
	start := sc.i
	for sc.i < len(sc.s) {
		switch sc.s[sc.i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return sc.word(c, sc.s[start:sc.i])
		case '"', '{', '[', ':':
			return "", false
		}
		sc.i++
	}
	return sc.word(c, sc.s[start:sc.i])
}

func (sc *scanner) word(first byte, lit string) (string, bool) {
	switch first {
	case 't':
		return lit, lit == "true"
	case 'f':
		return lit, lit == "false"
	case 'n':
		return lit, lit == "null"
	}
	return lit, true
}

// skip reads past one value of any kind.
func (sc *scanner) skip() bool {
	switch sc.peek() {
	case '"':
		_, _, ok := sc.str()
		return ok
	case '{', '[':
	default:
		_, ok := sc.literal()
		return ok
	}
	// The walk of a container, in locals: the most of a document's
	// bytes (its metadata, every endpoint's targetRef) pass here.
	s, depth := sc.s, 0
	for i := sc.i; i < len(s); i++ {
		switch s[i] {
		case '"':
			for i++; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' {
					i++
				}
			}
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				sc.i = i + 1
				return true
			}
		}
	}
	return false
}

// object reads the object at the cursor, calling member for each of its
// members with the cursor on the value, which member must read. Keys with
// an escape are refused: gjson matches them unescaped.
func (sc *scanner) object(member func(key string) bool) bool {
	if sc.peek() != '{' {
		return false
	}
	sc.i++
	if sc.peek() == '}' {
		sc.i++
		return true
	}
	for {
		key, ok := sc.plain()
		if !ok || sc.peek() != ':' {
			return false
		}
		sc.i++
		if !member(key) {
			return false
		}
		switch sc.peek() {
		case ',':
			sc.i++
		case '}':
			sc.i++
			return true
		default:
			return false
		}
	}
}

// array reads the array at the cursor, calling elem with the cursor on
// each element, which elem must read.
func (sc *scanner) array(elem func() bool) bool {
	if sc.peek() != '[' {
		return false
	}
	sc.i++
	if sc.peek() == ']' {
		sc.i++
		return true
	}
	for {
		if !elem() {
			return false
		}
		switch sc.peek() {
		case ',':
			sc.i++
		case ']':
			sc.i++
			return true
		default:
			return false
		}
	}
}

// list reads a value that gjson's ForEach would walk as a list of
// objects: an array of objects is read with elem; a number, true, false
// or null is nothing; anything else (an object, a string, an element that
// is not an object) is refused.
func (sc *scanner) list(elem func() bool) bool {
	switch sc.peek() {
	case '[':
		return sc.array(func() bool { return sc.peek() == '{' && elem() })
	case '{', '"':
		return false
	}
	_, ok := sc.literal()
	return ok
}

// port reads one element of ports, the object at the cursor.
func (sc *scanner) port(p *slice) bool {
	var name, number string
	seenName, seenPort, nameOK := false, false, true
	ok := sc.object(func(key string) bool {
		switch {
		case key == "name":
			if seenName {
				return false
			}
			seenName = true
			switch sc.peek() {
			case '"':
				var ok bool
				name, ok = sc.plain()
				return ok
			case 'n':
				lit, ok := sc.literal()
				return ok && lit == "null"
			}
			nameOK = false
			return sc.skip()
		case key == "port":
			if seenPort {
				return false
			}
			seenPort = true
			if c := sc.peek(); c == '-' || c >= '0' && c <= '9' {
				lit, ok := sc.literal()
				number = lit
				return ok
			}
		}
		return sc.skip()
	})
	if !ok || number == "" {
		return ok
	}
	// A port number as the apiserver writes it; any other way of writing
	// a number gjson reads in its own way.
	if len(number) > 5 || number[0] == '0' {
		return false
	}
	n := 0
	for i := 0; i < len(number); i++ {
		if number[i] < '0' || number[i] > '9' {
			return false
		}
		n = n*10 + int(number[i]-'0')
	}
	if n < 1 || n > 65535 {
		return true
	}
	if !nameOK {
		return false
	}
	p.ports = append(p.ports, slicePort{name: strings.Clone(name), port: strings.Clone(number)})
	return true
}

// endpoint reads one element of endpoints, the object at the cursor: its
// first address ("" when it has none, then the endpoint is left out),
// its conditions and its hints.
func (sc *scanner) endpoint() (e sliceEndpoint, addr string, ok bool) {
	e.ready, e.serving = true, true
	seenAddr, seenCond, seenHints := false, false, false
	ok = sc.object(func(key string) bool {
		switch {
		case key == "addresses":
			if seenAddr {
				return false
			}
			seenAddr = true
			switch sc.peek() {
			case '[':
				first := true
				return sc.array(func() bool {
					if !first {
						return sc.skip()
					}
					first = false
					switch sc.peek() {
					case '"':
						var ok bool
						addr, ok = sc.plain()
						return ok
					case '{', '[':
						return false
					}
					return sc.skip()
				})
			case '{', '"':
				return false
			}
		case key == "conditions":
			if seenCond {
				return false
			}
			seenCond = true
			if sc.peek() != '{' {
				// gjson walks an array or a scalar with empty keys:
				// no condition is set.
				return sc.skip()
			}
			return sc.object(func(key string) bool {
				switch key {
				case "ready", "serving", "terminating":
				default:
					return sc.skip()
				}
				isFalse, isTrue := false, false
				if c := sc.peek(); c == 't' || c == 'f' {
					lit, ok := sc.literal()
					if !ok {
						return false
					}
					isFalse, isTrue = lit == "false", lit == "true"
				} else if !sc.skip() {
					return false
				}
				switch key {
				case "ready":
					e.ready = !isFalse
				case "serving":
					e.serving = !isFalse
				case "terminating":
					e.terminating = isTrue
				}
				return true
			})
		case key == "hints":
			if seenHints {
				return false
			}
			seenHints = true
			if sc.peek() != '{' {
				return sc.skip()
			}
			seenZones, seenNodes := false, false
			var h sliceHints
			ok := sc.object(func(key string) bool {
				switch {
				case key == "forZones":
					if seenZones {
						return false
					}
					seenZones = true
					return sc.hintNames(&h.zones)
				case key == "forNodes":
					if seenNodes {
						return false
					}
					seenNodes = true
					return sc.hintNames(&h.nodes)
				}
				return sc.skip()
			})
			if len(h.zones)+len(h.nodes) > 0 {
				e.hints = &h
			}
			return ok
		}
		return sc.skip()
	})
	return e, addr, ok
}

// hintNames reads hints.forZones or hints.forNodes: the names of its
// elements, as hintNames does.
func (sc *scanner) hintNames(out *[]string) bool {
	return sc.list(func() bool {
		seen := false
		return sc.object(func(key string) bool {
			if key != "name" {
				return sc.skip()
			}
			if seen {
				return false
			}
			seen = true
			if sc.peek() != '"' {
				return sc.skip()
			}
			name, ok := sc.plain()
			if ok && name != "" && !strings.ContainsRune(name, '\t') {
				*out = append(*out, strings.Clone(name))
			}
			return ok
		})
	})
}
