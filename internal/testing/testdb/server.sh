# The PostgreSQL server of one test binary, and its watchdog; server.go
# runs it as: sh -c SCRIPT server.sh INITDB PG_CTL PORT...
#
# It makes a directory of its own in $TMPDIR (or /tmp), a cluster in it
# and starts the cluster on 127.0.0.1 on the first PORT it can bind, with
# scripts/pg-start's settings (durability off, 400 connections), as the
# postgres user when run as root: PostgreSQL refuses to run as root, and
# the user is created if missing, as pg-start does. It reports one line
# on stdout, "ready PORT DIR", or "error: WHY" followed by the logs'
# tails, and closes stdout.
#
# Then it waits for EOF on stdin, the read end of a pipe whose only
# writer is the test binary: EOF comes when the binary closes its end
# (testdb.Run, at the end) or exits, however it exits (a panic, a
# go test -timeout, SIGKILL). It then stops the server (immediate
# shutdown: nothing in it is kept) and removes the directory. It runs
# in a session of its own (server.go), so a Ctrl-C on the terminal
# reaches the test binary, whose exit ends the server, and not this
# script before it has cleaned up.
set -u
initdb=$1 pg_ctl=$2
shift 2

# A report whose reader is gone (the binary died while starting) must not
# kill the script before it stops the server.
trap '' PIPE

dir=
as=
cleanup() {
	[ -n "$dir" ] || return 0
	if [ -f "$dir/data/postmaster.pid" ]; then
		$as "$pg_ctl" -D "$dir/data" -m immediate -w -t 30 stop </dev/null >/dev/null 2>&1 ||
			kill -9 "$(head -n 1 "$dir/data/postmaster.pid")" 2>/dev/null
	fi
	rm -rf "$dir"
}
trap 'cleanup; exit 1' HUP INT TERM

# fail WHY LOG...: reports WHY and the logs' tails, cleans up, exits.
fail() {
	echo "error: $1"
	shift
	for f in "$@"; do
		if [ -s "$f" ]; then
			echo "--- ${f##*/}:"
			tail -n 20 "$f"
		fi
	done
	exec >/dev/null
	cleanup
	exit 1
}

dir=$(mktemp -d "${TMPDIR:-/tmp}/bmdbtest-pg.XXXXXX") || { dir=; fail "cannot make a directory in ${TMPDIR:-/tmp}"; }
cd "$dir" || fail "cannot enter $dir"

if [ "$(id -u)" = 0 ]; then
	if ! id postgres >/dev/null 2>&1; then
		# Another test binary may be creating it at the same moment.
		useradd --system --home-dir /var/lib/postgresql postgres </dev/null >useradd.log 2>&1 ||
			id postgres >/dev/null 2>&1 ||
			fail "cannot create the user postgres to run PostgreSQL as (it refuses to run as root)" useradd.log
	fi
	chown postgres "$dir" || fail "cannot give $dir to the user postgres"
	as="runuser -u postgres --"
	$as test -w "$dir" </dev/null ||
		fail "the user postgres, which runs PostgreSQL, cannot reach $dir: set TMPDIR to a directory it can reach"
fi

$as "$initdb" -D "$dir/data" -U postgres -A trust --no-sync -E UTF8 --no-locale </dev/null >initdb.log 2>&1 ||
	fail "$initdb failed" initdb.log

for port in "$@"; do
	# The port is 127.0.0.1's only: no Unix socket, whose path could
	# exceed the 107 bytes allowed under a long TMPDIR.
	if $as "$pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start -o "-c listen_addresses=127.0.0.1 -c port=$port \
-c unix_socket_directories='' -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=400 -c shared_buffers=256MB" \
		</dev/null >pg_ctl.log 2>&1; then
		echo "ready $port $dir"
		exec >/dev/null
		while read -r _; do :; done
		cleanup
		exit 0
	fi
	grep -q "could not bind" server.log 2>/dev/null || fail "$pg_ctl start failed" pg_ctl.log server.log
	rm -f server.log
done
fail "no free port among $*" server.log
