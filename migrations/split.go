package migrations

import (
	"strings"
	"unicode"
)

// statement is one statement of a migration file, as CockroachDB is sent
// it: without the comments before it or its semicolon.
type statement struct {
	text string
	line int // the file's line it starts on, from 1
}

// splitStatements splits a migration file at the semicolons that end its
// statements, not at those inside comments (-- and nested /* */), quoted
// strings ('...', E'...' with backslash escapes), quoted identifiers or
// dollar-quoted bodies ($$...$$, $tag$...$tag$). What holds no statement
// (whitespace and comments) is dropped.
func splitStatements(file string) []statement {
	var out []statement
	code := -1 // where the current statement's first code is; -1: none yet
	line, codeLine := 1, 0
	flush := func(end int) {
		if code >= 0 {
			out = append(out, statement{text: strings.TrimSpace(file[code:end]), line: codeLine})
		}
		code = -1
	}
	mark := func(i int) {
		if code < 0 {
			code, codeLine = i, line
		}
	}
	// skipTo moves i past the end of a quoted or commented span, counting
	// its newlines.
	skipTo := func(i, end int) int {
		line += strings.Count(file[i:end], "\n")
		return end - 1
	}
	for i := 0; i < len(file); i++ {
		ch := file[i]
		switch {
		case ch == '\n':
			line++
		case strings.HasPrefix(file[i:], "--"):
			end := strings.IndexByte(file[i:], '\n')
			if end < 0 {
				i = len(file)
				continue
			}
			i += end - 1 // the newline is counted next
		case strings.HasPrefix(file[i:], "/*"):
			i = skipTo(i, blockCommentEnd(file, i))
		case ch == '\'' || ch == '"':
			mark(i)
			backslash := ch == '\'' && i > 0 && (file[i-1] == 'E' || file[i-1] == 'e') && (i < 2 || !isIdentByte(file[i-2]))
			i = skipTo(i, quoteEnd(file, i, ch, backslash))
		case ch == '$' && (i == 0 || !isIdentByte(file[i-1])):
			mark(i)
			if tag := dollarTag(file[i:]); tag != "" {
				end := strings.Index(file[i+len(tag):], tag)
				if end < 0 {
					i = skipTo(i, len(file))
					continue
				}
				i = skipTo(i, i+len(tag)+end+len(tag))
			}
		case ch == ';':
			flush(i)
		case !unicode.IsSpace(rune(ch)):
			mark(i)
		}
	}
	flush(len(file))
	return out
}

// blockCommentEnd returns the index just past the /* */ comment at i
// (nested, as PostgreSQL and CockroachDB read them), or len(s).
func blockCommentEnd(s string, i int) int {
	depth := 0
	for j := i; j < len(s)-1; j++ {
		switch {
		case s[j] == '/' && s[j+1] == '*':
			depth++
			j++
		case s[j] == '*' && s[j+1] == '/':
			depth--
			j++
			if depth == 0 {
				return j + 1
			}
		}
	}
	return len(s)
}

// quoteEnd returns the index just past the quoted span opened by q at i
// (a doubled quote stays inside; with backslash, so does an escaped one),
// or len(s).
func quoteEnd(s string, i int, q byte, backslash bool) int {
	for j := i + 1; j < len(s); j++ {
		switch {
		case backslash && s[j] == '\\':
			j++
		case s[j] == q && j+1 < len(s) && s[j+1] == q:
			j++
		case s[j] == q:
			return j + 1
		}
	}
	return len(s)
}

// dollarTag returns the dollar quote ($$ or $tag$) that s starts with, or
// "" (a parameter such as $1 is not one: a tag does not start with a
// digit).
func dollarTag(s string) string {
	for j := 1; j < len(s); j++ {
		switch c := s[j]; {
		case c == '$':
			return s[:j+1]
		case c == '_' || unicode.IsLetter(rune(c)) || (j > 1 && c >= '0' && c <= '9') || c >= 0x80:
		default:
			return ""
		}
	}
	return ""
}

// isIdentByte reports whether c may be part of an identifier.
func isIdentByte(c byte) bool {
	return c == '_' || c == '$' || c >= 0x80 || (c >= '0' && c <= '9') || (c|0x20 >= 'a' && c|0x20 <= 'z')
}
