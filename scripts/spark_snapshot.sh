#!/usr/bin/env bash
# The MongoDB Spark connector (10.x) on local Spark reads a named snapshot
# as a database (`shop@nightly`, issue #22 item 6) while the live database
# is updated. Not run in CI: it downloads Spark 3.5 and the connector
# (10.5.0, for Scala 2.12) from Maven Central, ~250 MB into .cache/m2, and
# needs Java 17 and Maven.
#
# What it checks: `shop.items` is seeded, the named snapshot `nightly` is
# taken and its count, distinct _ids and sum of `n` are recorded (nothing
# writes between the two); an updater then changes `n`, inserts and deletes
# documents without pause while the Spark job (scripts/spark, `local[2]`,
# SamplePartitioner with small partitions) reads `shop@nightly.items` in
# parallel partitions. The job's count, distinct _ids and sum must equal the
# snapshot's, it must have read more than one partition, the updater must
# have written during the job, and the live collection must by then differ.
#
# Needs: target/debug/duet (cargo build -p duet; DUET_BIN to override), the
# python venv of tests/python (.venv, with pymongo), java (17+) and mvn.
#
# Usage: scripts/spark_snapshot.sh   (SEED_DOCS: documents, default 30000)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DUET=${DUET_BIN:-$ROOT/target/debug/duet}
PY=${PYTHON:-$ROOT/.venv/bin/python}
M2=${M2_REPO:-$ROOT/.cache/m2}
command -v mvn >/dev/null && command -v java >/dev/null || { echo "spark_snapshot: needs java and mvn" >&2; exit 2; }

echo "== build the Spark job (first run downloads Spark and the connector)"
(cd scripts/spark && mvn -q -B -Dmaven.repo.local="$M2" package dependency:build-classpath \
  -Dmdep.outputFile=target/classpath.txt)
CP="$ROOT/scripts/spark/target/spark-snapshot-0.1.0.jar:$(cat scripts/spark/target/classpath.txt)"

NAME=spark_snapshot
# shellcheck source=lib/serve.sh
source scripts/lib/serve.sh
PORT=$(free_port)
serve data "$PORT"
URI="mongodb://127.0.0.1:$PORT/?directConnection=true"

echo "== seed shop.items, take the snapshot 'nightly', record its figures"
"$PY" - "$URI" "$WORK" "${SEED_DOCS:-30000}" <<'EOF'
import json, sys
from pathlib import Path
from pymongo import MongoClient
uri, work, n = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
shop = MongoClient(uri).shop
for lo in range(0, n, 1000):
    shop.items.insert_many([{"_id": i, "n": i % 97, "s": {"x": i}, "pad": "p" * 100}
                            for i in range(lo, min(lo + 1000, n))])
shop.command({"createSnapshot": "nightly"})
docs = list(shop.items.find({}, {"n": 1}))
want = {"count": len(docs), "distinct_ids": len({d["_id"] for d in docs}),
        "sum_n": sum(d["n"] for d in docs)}
(work / "want.json").write_text(json.dumps(want))
print(f"  snapshot: {want}")
EOF

# The updater: changes shop.items until $WORK/stop exists; counts its writes.
"$PY" - "$URI" "$WORK" <<'EOF' &
import random, sys
from pathlib import Path
from pymongo import MongoClient
uri, work = sys.argv[1], Path(sys.argv[2])
items = MongoClient(uri).shop.items
rng = random.Random(22)
ops, next_id = 0, 10**9
while not (work / "stop").exists() or ops < 100:
    ops += 1
    i = rng.randrange(0, 30000)
    k = rng.random()
    if k < 0.5:
        items.update_one({"_id": i}, {"$inc": {"n": 1000}})
    elif k < 0.7:
        next_id += 1
        items.insert_one({"_id": next_id, "n": 5})
    elif k < 0.9:
        items.delete_one({"_id": i})
    else:
        items.update_many({"_id": {"$gte": i, "$lt": i + 100}}, {"$inc": {"n": 1}})
    if ops % 50 == 0:
        (work / "ops").write_text(str(ops))
(work / "ops").write_text(str(ops))
EOF
UPDATER=$!
PIDS+=($UPDATER)
sleep 1
before=$(cat "$WORK/ops" 2>/dev/null || echo 0)

echo "== Spark (local[2]) reads shop@nightly.items while the updater runs"
java --add-opens=java.base/sun.nio.ch=ALL-UNNAMED --add-opens=java.base/java.nio=ALL-UNNAMED \
  --add-opens=java.base/java.lang=ALL-UNNAMED --add-opens=java.base/java.util=ALL-UNNAMED \
  --add-opens=java.base/sun.util.calendar=ALL-UNNAMED \
  -cp "$CP" duet.SnapshotRead "$URI" 'shop@nightly' 1 2>"$WORK/spark.err" | tee "$WORK/spark.out" \
  || { tail -40 "$WORK/spark.err" >&2; exit 1; }
after=$(cat "$WORK/ops" 2>/dev/null || echo 0)
touch "$WORK/stop"
wait "$UPDATER"

echo "== compare"
"$PY" - "$URI" "$WORK" "$before" "$after" <<'EOF'
import json, re, sys
from pathlib import Path
from pymongo import MongoClient
uri, work, before, after = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
want = json.loads((work / "want.json").read_text())
line = [l for l in (work / "spark.out").read_text().splitlines() if l.startswith("RESULT ")]
assert line, "the Spark job printed no RESULT line"
got = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line[-1])}
fails = []
def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        fails.append(what)
for k in ("count", "distinct_ids", "sum_n"):
    check(got[k] == want[k], f"Spark's {k} over shop@nightly.items = the snapshot's ({got[k]} vs {want[k]})")
check(got["partitions"] > 1, f"read in {got['partitions']} partitions")
check(after - before > 0, f"the updater wrote during the job (~{after - before} writes)")
live = list(MongoClient(uri).shop.items.find({}, {"n": 1}))
check(sum(d["n"] for d in live) != want["sum_n"], "the live shop.items changed meanwhile")
if fails:
    sys.exit(f"{len(fails)} check(s) failed")
print("spark snapshot: all checks passed")
EOF
