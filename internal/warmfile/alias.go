package warmfile

import "unsafe"

// unsafeString returns b's bytes as a string without a copy. The caller
// must not change b afterwards: Decode's data is read-only for it.
func unsafeString(b []byte) string { return unsafe.String(&b[0], len(b)) }
