#!/usr/bin/env bash
# YCSB A/B/C over the wire against two duet binaries — a previous commit and
# the current checkout — run interleaved (prev, cur, prev, cur, …) so both
# see the same machine load (issue #20 item 4). Each binary serves a fresh
# durable data directory (the default durability) for each run; two clients
# drive it at every thread count:
# - java: the real YCSB client (site.ycsb:core 0.17.0) with the MongoDB
#   binding of scripts/ycsb-java on the official Java driver;
# - rust: `duet bench ycsb --targets wire` (the official Rust driver), always
#   the current binary's bench, so only the server differs between columns.
# Not run in CI: it builds two duet binaries and (first run) downloads YCSB
# core and the Java driver from Maven Central into .cache/m2.
#
# Needs: cargo, git, java (17+), mvn, python3.
#
# Usage: scripts/ycsb_compare.sh [--prev REV] [--records N] [--seconds S]
#          [--threads 1,8,32,64] [--rounds R] [--workloads a,b,c]
#          [--drivers java,rust] [--profile release|dev] [--out DIR]
# YCSB 0.17 has no warm-up phase: the JVM's start (class loading, JIT) is
# inside each Java run, so runs shorter than ~10 s understate Java figures.
# Defaults: --prev HEAD~1, 100000 records, 20 s per run, 1,8,32,64 threads,
# 3 rounds, workloads a,b,c, both drivers, release builds, out
# target/ycsb-compare. The table (median of the rounds and the spread) is
# printed and written to OUT/table.md; every run's raw figures to
# OUT/results.tsv and its client output under OUT/runs/.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

PREV=HEAD~1 RECORDS=100000 SECONDS_PER_RUN=20 THREADS=1,8,32,64 ROUNDS=3
WORKLOADS=a,b,c DRIVERS=java,rust PROFILE=release OUT=$ROOT/target/ycsb-compare
while [[ $# -gt 0 ]]; do
  case $1 in
    --prev) PREV=$2 ;;
    --records) RECORDS=$2 ;;
    --seconds) SECONDS_PER_RUN=$2 ;;
    --threads) THREADS=$2 ;;
    --rounds) ROUNDS=$2 ;;
    --workloads) WORKLOADS=$2 ;;
    --drivers) DRIVERS=$2 ;;
    --profile) PROFILE=$2 ;;
    --out) OUT=$2 ;;
    *) echo "ycsb_compare: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift 2
done
[[ $PROFILE == release || $PROFILE == dev ]] || { echo "ycsb_compare: --profile is release or dev" >&2; exit 2; }
for tool in cargo git java mvn python3; do
  command -v "$tool" >/dev/null || { echo "ycsb_compare: needs $tool" >&2; exit 2; }
done
PREV_SHA=$(git rev-parse --verify "$PREV^{commit}")
CUR_SHA=$(git rev-parse HEAD)
[[ -z $(git status --porcelain --untracked-files=no) ]] || CUR_SHA="$CUR_SHA+dirty"
mkdir -p "$OUT/bin" "$OUT/runs"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BUILT=$CARGO_TARGET_DIR/$([[ $PROFILE == dev ]] && echo debug || echo release)/duet
PREV_SRC=$OUT/prev-src

remove_prev_src() {
  if [[ -d $PREV_SRC ]]; then git worktree remove --force "$PREV_SRC" || true; fi
}
trap remove_prev_src EXIT

echo "== build duet at $PREV_SHA (prev) and the checkout (cur), profile $PROFILE"
remove_prev_src
git worktree add --detach "$PREV_SRC" "$PREV_SHA" >/dev/null
# One target directory: the dependencies are built once for both.
(cd "$PREV_SRC" && cargo build --locked --profile "$PROFILE" -p duet)
cp "$BUILT" "$OUT/bin/duet-prev"
remove_prev_src
cargo build --locked --profile "$PROFILE" -p duet
cp "$BUILT" "$OUT/bin/duet-cur"

if [[ ,$DRIVERS, == *,java,* ]]; then
  echo "== build the Java YCSB client (first run downloads YCSB core and the driver)"
  (cd scripts/ycsb-java && mvn -q -B -Dmaven.repo.local="${M2_REPO:-$ROOT/.cache/m2}" package \
    dependency:build-classpath -Dmdep.outputFile=target/classpath.txt)
  JAVA_CP="$ROOT/scripts/ycsb-java/target/ycsb-java-0.1.0.jar:$(cat scripts/ycsb-java/target/classpath.txt)"
fi

NAME=ycsb_compare
DUET=$OUT/bin/duet-cur
PY=${PYTHON:-$(command -v python3)}
# shellcheck source=lib/serve.sh
source scripts/lib/serve.sh
trap 'cleanup; remove_prev_src' EXIT

stop_last() { # stop the server `serve` started last
  local pid=${PIDS[-1]}
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  unset 'PIDS[-1]'
}

RESULTS=$OUT/results.tsv
printf 'round\tbinary\tdriver\tthreads\tworkload\tops_per_s\tread_p50_us\tread_p99_us\tupdate_p50_us\tupdate_p99_us\tserver_cpu_us_per_op\tclient_cpu_us_per_op\n' >"$RESULTS"
TICK=$(getconf CLK_TCK)
# cpu_ticks PID: user + system CPU time the process has used, in clock ticks.
cpu_ticks() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"; }

# java_run ROUND BIN THREADS PORT: load, then each workload; appends rows.
java_run() {
  local round=$1 bin=$2 t=$3 port=$4 w log
  # minPoolSize: the driver opens the threads' connections in the background
  # at start-up instead of inside the first measured operations.
  local url="mongodb://127.0.0.1:$port/ycsb?w=1&directConnection=true&minPoolSize=$t"
  local common=(-cp "$JAVA_CP" site.ycsb.Client -db duet.ycsb.MongoBinding
    -p recordcount="$RECORDS" -p mongodb.url="$url")
  log=$OUT/runs/java-$round-$bin-$t-load.log
  java "${common[@]}" -load -P scripts/ycsb-java/workloads/workloada -p operationcount="$RECORDS" \
    -p batchsize=100 -threads 4 >"$log" 2>&1 || { echo "java load failed: $log" >&2; exit 1; }
  for w in ${WORKLOADS//,/ }; do
    log=$OUT/runs/java-$round-$bin-$t-$w.log
    # Where each operation's CPU goes: the server's (from /proc, over the
    # run alone) and the client JVM's (its whole process, start-up and JIT
    # included), per operation.
    local before after
    before=$(cpu_ticks "${PIDS[-1]}")
    # operationcount bounds nothing here (maxexecutiontime does); 0 would mean no operations.
    /usr/bin/time -f '%U %S' -o "$log.cpu" \
      java "${common[@]}" -t -P "scripts/ycsb-java/workloads/workload$w" -p operationcount=2000000000 \
      -p maxexecutiontime="$SECONDS_PER_RUN" -p hdrhistogram.percentiles=50,99 -threads "$t" \
      >"$log" 2>&1 || { echo "java run failed: $log" >&2; exit 1; }
    after=$(cpu_ticks "${PIDS[-1]}")
    awk -F', ' -v r="$round" -v b="$bin" -v t="$t" -v w="${w^^}" \
      -v server_ticks="$(( after - before ))" -v tick="$TICK" -v client="$(cat "$log.cpu")" '
      $1 == "[OVERALL]" && $2 == "RunTime(ms)" { ms = $3 }
      $1 == "[OVERALL]" && $2 == "Throughput(ops/sec)" { ops = $3 }
      $1 == "[READ]" && $2 == "50thPercentileLatency(us)" { r50 = $3 }
      $1 == "[READ]" && $2 == "99thPercentileLatency(us)" { r99 = $3 }
      $1 == "[UPDATE]" && $2 == "50thPercentileLatency(us)" { u50 = $3 }
      $1 == "[UPDATE]" && $2 == "99thPercentileLatency(us)" { u99 = $3 }
      $1 ~ /^\[(READ|UPDATE)\]$/ && $2 == "Return=ERROR" { err = 1 }
      END {
        if (ops == "" || err) { print "no throughput or errors in the YCSB output" > "/dev/stderr"; exit 1 }
        n = ops * ms / 1000
        split(client, c, " ")
        printf "%s\t%s\tjava\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%.1f\n", r, b, t, w, ops, r50, r99, u50, u99,
          server_ticks / tick / n * 1e6, (c[1] + c[2]) / n * 1e6
      }' "$log" >>"$RESULTS" || { echo "unreadable YCSB output: $log" >&2; exit 1; }
  done
}

# rust_run ROUND BIN THREADS PORT: `duet bench ycsb` (current binary) over the wire.
rust_run() {
  local round=$1 bin=$2 t=$3 port=$4
  local dir=$OUT/runs/rust-$round-$bin-$t
  local wl=${WORKLOADS^^}
  "$OUT/bin/duet-cur" bench ycsb --targets wire --uri "mongodb://127.0.0.1:$port/?directConnection=true" \
    --workloads "$wl" --threads "$t" --records "$RECORDS" --seconds "$SECONDS_PER_RUN" --repeat 1 \
    --out "$dir" --quiet >"$dir.log" 2>&1 || { echo "rust run failed: $dir.log" >&2; exit 1; }
  "$PY" - "$dir/ycsb.json" "$round" "$bin" "$t" >>"$RESULTS" <<'EOF'
import json, sys
path, rnd, binary, threads = sys.argv[1:]
figs = {}
for f in json.load(open(path))["figures"]:
    w = f["case"].get("workload")
    if w and w != "load":
        figs.setdefault(w, {})[f["metric"]] = f["median"]
for w, m in sorted(figs.items()):
    cols = [m.get(k, "") for k in ("ops_per_s", "read_latency_us_p50", "read_latency_us_p99",
                                   "update_latency_us_p50", "update_latency_us_p99")]
    print("\t".join([rnd, binary, "rust", threads, w] + [str(c) for c in cols] + ["", ""]))
EOF
}

for round in $(seq "$ROUNDS"); do
  for t in ${THREADS//,/ }; do
    for driver in ${DRIVERS//,/ }; do
      for bin in prev cur; do
        echo "== round $round, $t threads, $driver client, $bin server"
        DUET=$OUT/bin/duet-$bin
        port=$(free_port)
        serve "$bin-$round-$t-$driver" "$port"
        case $driver in
          java) java_run "$round" "$bin" "$t" "$port" ;;
          rust) rust_run "$round" "$bin" "$t" "$port" ;;
          *) echo "ycsb_compare: unknown driver $driver (java, rust)" >&2; exit 2 ;;
        esac
        stop_last
        rm -rf "${WORK:?}/$bin-$round-$t-$driver"
      done
    done
  done
done

"$PY" - "$RESULTS" "$PREV_SHA" "$CUR_SHA" "$PROFILE" "$RECORDS" "$SECONDS_PER_RUN" "$ROUNDS" <<'EOF' | tee "$OUT/table.md"
import csv, statistics, sys
path, prev, cur, profile, records, seconds, rounds = sys.argv[1:]
rows = list(csv.DictReader(open(path), delimiter="\t"))
cells = {}
for r in rows:
    cells.setdefault((r["driver"], r["workload"], int(r["threads"])), {}).setdefault(r["binary"], []).append(r)

def med(rs, k):
    v = [float(r[k]) for r in rs if r[k] not in ("", "nan", "NaN")]
    return statistics.median(v) if v else float("nan")

def spread(rs, k):
    v = [float(r[k]) for r in rs if r[k] not in ("", "nan", "NaN")]
    return f"{min(v):.0f}–{max(v):.0f}" if len(v) > 1 else ""

print(f"YCSB over the wire, prev {prev[:12]} vs cur {cur[:12]} ({profile} builds), "
      f"{records} records, {seconds} s per run, median of {rounds} interleaved rounds (spread)\n")
print("| driver | workload | threads | prev ops/s | cur ops/s | cur/prev | prev read p50/p99 µs | cur read p50/p99 µs | prev update p50/p99 µs | cur update p50/p99 µs | server CPU µs/op prev / cur | client CPU µs/op prev / cur |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for (d, w, t) in sorted(cells):
    c = cells[(d, w, t)]
    p, q = c.get("prev", []), c.get("cur", [])
    po, qo = med(p, "ops_per_s"), med(q, "ops_per_s")
    lat = lambda rs, op: f"{med(rs, op + '_p50_us'):.0f} / {med(rs, op + '_p99_us'):.0f}"
    cpu = lambda rs, who: f"{med(rs, who + '_cpu_us_per_op'):.0f}"
    print(f"| {d} | {w} | {t} | {po:.0f} ({spread(p, 'ops_per_s')}) | {qo:.0f} ({spread(q, 'ops_per_s')}) | "
          f"{qo / po if po else float('nan'):.2f} | {lat(p, 'read')} | {lat(q, 'read')} | {lat(p, 'update')} | {lat(q, 'update')} | "
          f"{cpu(p, 'server')} / {cpu(q, 'server')} | {cpu(p, 'client')} / {cpu(q, 'client')} |")
EOF
