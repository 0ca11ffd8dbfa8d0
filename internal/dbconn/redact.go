package dbconn

import (
	"errors"
	"net/url"
	"regexp"
	"strings"
)

// keyValuePassword matches password=... in a key=value DSN, quoted or not.
var keyValuePassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// RedactDSN returns dsn fit for logs and errors: the password is replaced by
// "xxxxx", in both URL and key=value forms.
func RedactDSN(dsn string) string {
	if isURLDSN(dsn) {
		u, err := url.Parse(dsn)
		if err != nil {
			return "(malformed DSN URL)"
		}
		if q := u.Query(); q.Has("password") {
			q.Set("password", "xxxxx")
			u.RawQuery = q.Encode()
		}
		return u.Redacted()
	}
	return keyValuePassword.ReplaceAllString(dsn, "${1}xxxxx")
}

// isURLDSN reports whether dsn is in URL form rather than key=value pairs.
func isURLDSN(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// dsnPassword returns the password in dsn, or "".
func dsnPassword(dsn string) string {
	if !isURLDSN(dsn) {
		if m := keyValuePassword.FindStringSubmatch(dsn); m != nil {
			return strings.Trim(m[2], "'")
		}
		return ""
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return ""
	}
	if u.User != nil {
		if p, ok := u.User.Password(); ok {
			return p
		}
	}
	return u.Query().Get("password")
}

// redactedError keeps the chain of an error (errors.Is / As still see the
// driver's error) while its message has the password removed.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// RedactError returns err with every occurrence of dsn, and of its password,
// removed from its message.
func RedactError(err error, dsn string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	clean := strings.ReplaceAll(msg, dsn, RedactDSN(dsn))
	if p := dsnPassword(dsn); p != "" {
		clean = strings.ReplaceAll(clean, p, "xxxxx")
		if esc := url.QueryEscape(p); esc != p {
			clean = strings.ReplaceAll(clean, esc, "xxxxx")
		}
	}
	if clean == msg {
		return err
	}
	var re *redactedError
	if errors.As(err, &re) {
		return &redactedError{msg: clean, err: re.err}
	}
	return &redactedError{msg: clean, err: err}
}
