package plan

import "strings"

// Closest returns the candidate nearest to word, a likely typo, or "" when
// none is close enough: at most 2 edits, or a third of word's length for a
// long word, and fewer edits than either word has letters. Case is ignored.
func Closest(word string, candidates []string) string {
	best, bestD := "", -1
	w := []rune(strings.ToLower(word))
	for _, c := range candidates {
		d := editDistance(w, []rune(strings.ToLower(c)))
		if bestD < 0 || d < bestD {
			best, bestD = c, d
		}
	}
	if bestD < 0 || bestD > max(2, len(w)/3) || bestD >= min(len(w), len([]rune(best))) {
		return ""
	}
	return best
}

// editDistance is the optimal string alignment distance of a and b:
// insertions, deletions, substitutions and transpositions of two adjacent
// letters each count one.
func editDistance(a, b []rune) int {
	rows := make([][]int, len(a)+1)
	for i := range rows {
		rows[i] = make([]int, len(b)+1)
		rows[i][0] = i
	}
	for j := range rows[0] {
		rows[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d := min(rows[i-1][j]+1, rows[i][j-1]+1, rows[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d = min(d, rows[i-2][j-2]+1)
			}
			rows[i][j] = d
		}
	}
	return rows[len(a)][len(b)]
}
