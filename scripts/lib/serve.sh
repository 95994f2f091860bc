# Shared by the scripts that drive `duet serve` with outside tools
# (oplog_tools.sh, snapshot_tools.sh, spark_snapshot.sh): source it after
# setting NAME (the script's name for messages), DUET and PY.
#
# It gives a scratch directory $WORK removed at exit, with every server
# started by `serve` killed first; `free_port`; `serve LABEL PORT [FLAG...]`,
# which starts `duet serve` on 127.0.0.1:PORT with data in $WORK/LABEL and
# its log in $WORK/LABEL.log, and returns once it accepts connections.

[[ -x $DUET ]] || { echo "$NAME: $DUET missing: cargo build -p duet" >&2; exit 2; }
[[ -x $PY ]] || { echo "$NAME: $PY missing: python3 -m venv .venv && .venv/bin/pip install -r tests/python/requirements.txt" >&2; exit 2; }

WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

serve() { # serve LABEL PORT [FLAG...]
  local label=$1 port=$2
  shift 2
  "$DUET" serve --bind 127.0.0.1 --port "$port" --data-dir "$WORK/$label" "$@" >"$WORK/$label.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do
    if "$PY" -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.2)" 2>/dev/null; then return; fi
    sleep 0.1
  done
  echo "$NAME: duet serve ($label) did not start" >&2; cat "$WORK/$label.log" >&2; exit 1
}
