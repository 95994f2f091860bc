#!/usr/bin/env bash
# PostgreSQL for the benchmark peers: install (apt-get) if missing, then start a
# throw-away cluster on 127.0.0.1 only, as the postgres user, in a temp data
# directory; `stop` shuts it down and deletes the directory.
#
#   scripts/peers/postgres.sh start   # listens on 127.0.0.1:${DUET_PG_PORT:-54329}
#   scripts/peers/postgres.sh stop
#
# Connection for `duet bench … --targets postgres`:
#   host=127.0.0.1 port=54329 user=postgres dbname=postgres   (the default of --pg)
set -euo pipefail

port="${DUET_PG_PORT:-54329}"
data="${DUET_PG_DATA:-/tmp/duet-bench-pg}"
sock="$data-sock"

pg_bin() {
    local d
    d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    [ -n "$d" ] && echo "$d"
}

as_postgres() {
    if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi
}

case "${1:-}" in
start)
    if [ -z "$(pg_bin)" ]; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq postgresql >/dev/null
        # The package starts its own cluster on the default port; we do not use it.
        (pg_ctlcluster --help >/dev/null 2>&1 && pg_lsclusters -h 2>/dev/null | while read -r ver name _; do
            pg_ctlcluster "$ver" "$name" stop || true
        done) || true
    fi
    bin=$(pg_bin)
    if [ -f "$data/postmaster.pid" ]; then
        echo "already running (data in $data)"
        exit 0
    fi
    rm -rf "$data" "$sock"
    mkdir -p "$data" "$sock"
    chown postgres:postgres "$data" "$sock"
    as_postgres "$bin/initdb" -D "$data" -U postgres --auth=trust -E UTF8 >/dev/null
    as_postgres "$bin/pg_ctl" -D "$data" -l "$data/server.log" -w start \
        -o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories=$sock -c shared_buffers=256MB -c max_connections=64" >/dev/null
    echo "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port (data $data)"
    ;;
stop)
    bin=$(pg_bin)
    if [ -n "$bin" ] && [ -f "$data/postmaster.pid" ]; then
        as_postgres "$bin/pg_ctl" -D "$data" -m fast -w stop >/dev/null
    fi
    rm -rf "$data" "$sock"
    echo "stopped"
    ;;
*)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
