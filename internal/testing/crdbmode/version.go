package crdbmode

import (
	"fmt"
	"strconv"
	"strings"
)

// Version is the CockroachDB release cockroach mode emulates: what differs
// between releases that bmdb depends on is decided by it (the methods
// below), and SELECT version() reports it. The zero Version is
// VersionDefault.
type Version struct{ Major, Minor int }

// The releases the mode models. bmdb supports 23.2, 24.x and 25.x; CI runs
// the suite in the mode of VersionOldest and of VersionNewest.
var (
	VersionOldest  = Version{23, 2}
	VersionNewest  = Version{25, 2}
	VersionDefault = VersionNewest
)

// supportedVersions are the releases Settings.Version may name.
var supportedVersions = []Version{{23, 2}, {24, 1}, {24, 3}, {25, 1}, {25, 2}, {25, 3}}

// ParseVersion parses "MAJOR.MINOR" (e.g. "23.2"), one of the releases
// the mode models.
func ParseVersion(s string) (Version, error) {
	major, minor, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(s), "v"), ".")
	if ok {
		ma, err1 := strconv.Atoi(major)
		mi, err2 := strconv.Atoi(minor)
		if err1 == nil && err2 == nil {
			for _, v := range supportedVersions {
				if v == (Version{ma, mi}) {
					return v, nil
				}
			}
		}
	}
	return Version{}, fmt.Errorf("version %q is not one cockroach mode models (want one of %v)", s, supportedVersions)
}

// orDefault returns v, or VersionDefault if v is zero.
func (v Version) orDefault() Version {
	if v == (Version{}) {
		return VersionDefault
	}
	return v
}

func (v Version) String() string {
	v = v.orDefault()
	return fmt.Sprintf("%d.%d", v.Major, v.Minor)
}

// AtLeast reports whether v is major.minor or later.
func (v Version) AtLeast(major, minor int) bool {
	v = v.orDefault()
	return v.Major > major || (v.Major == major && v.Minor >= minor)
}
