#!/usr/bin/env bash
# mongodump --oplog and mongorestore --oplogReplay against `duet serve`
# (issue #16, item 8). Not run in CI: it needs the MongoDB Database Tools.
#
# What it checks: a writer changes two collections without pause while
# `mongodump --oplog` runs; the dump is restored with
# `mongorestore --oplogReplay` into a fresh server; the restored data must
# equal the source's data at the dump's end (the `ts` of the last entry in
# the dump's oplog.bson). The writer keeps a model of every document it
# touched (read back after each write, with the reply's `operationTime`),
# so the source's state at any time of the run is known exactly.
#
# Needs: target/debug/duet (cargo build -p duet; DUET_BIN to override), the
# python venv of tests/python (.venv, with pymongo), and `mongodump` and
# `mongorestore` (MongoDB Database Tools 100.x) in $MONGO_TOOLS_BIN
# (default .cache/mongo-tools) or on PATH. This script does not fetch or
# build them.
#
# Usage: scripts/oplog_tools.sh [--standalone]   (SEED_DOCS: documents per
#   collection before the dump, default 30000)
#   --standalone: serve with --standalone (no `hosts` in hello), so mongodump
#   reads the oplog from `local.oplog.$main`, the view's other name.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DUET=${DUET_BIN:-$ROOT/target/debug/duet}
PY=${PYTHON:-$ROOT/.venv/bin/python}
TOOLS=${MONGO_TOOLS_BIN:-$ROOT/.cache/mongo-tools}
EXTRA=()
if [[ ${1:-} == --standalone ]]; then EXTRA=(--standalone); fi

tool() {
  if [[ -x "$TOOLS/$1" ]]; then echo "$TOOLS/$1"; return; fi
  if command -v "$1" >/dev/null; then command -v "$1"; return; fi
  echo "oplog_tools: $1 not found in $TOOLS or on PATH (set MONGO_TOOLS_BIN)" >&2
  exit 2
}
MONGODUMP=$(tool mongodump)
MONGORESTORE=$(tool mongorestore)
NAME=oplog_tools
# shellcheck source=lib/serve.sh
source scripts/lib/serve.sh

SRC_PORT=$(free_port); serve src "$SRC_PORT" "${EXTRA[@]}"
DST_PORT=$(free_port); serve dst "$DST_PORT" "${EXTRA[@]}"
SRC="mongodb://127.0.0.1:$SRC_PORT/?directConnection=true"
DST="mongodb://127.0.0.1:$DST_PORT/?directConnection=true"

# The writer: seeds, then writes until $WORK/stop exists; writes its model log.
"$PY" - "$SRC" "$WORK" "${SEED_DOCS:-30000}" <<'EOF' &
import pickle, random, sys, time
from pathlib import Path
from pymongo import MongoClient
uri, work = sys.argv[1], Path(sys.argv[2])
c = MongoClient(uri)
db = c.shop
rng = random.Random(16)
SEED = int(sys.argv[3])
log = []  # (operationTime, [(coll, _id, doc or None)])
with c.start_session(causal_consistency=True) as s:
    def done(changes):
        log.append((s.operation_time, [(cn, i, db[cn].find_one({"_id": i}, session=s)) for cn, i in changes]))
    next_id = 0
    def new_id():
        global next_id
        next_id += 1
        return next_id
    # Enough data that the dump takes a while (the writer goes on meanwhile).
    pad = "p" * 200
    for cn in ("items", "carts"):
        for _ in range(SEED // 1000):
            docs = [{"_id": new_id(), "n": 0, "tags": ["a"], "s": {"x": 1}, "pad": pad}
                    for _ in range(1000)]
            db[cn].insert_many(docs, session=s)
            log.append((s.operation_time, [(cn, d["_id"], d) for d in docs]))
    (work / "seeded").touch()
    ops = 0
    while not (work / "stop").exists() or ops < 50:
        ops += 1
        cn = rng.choice(("items", "carts"))
        coll = db[cn]
        live = [d["_id"] for d in coll.find({"_id": {"$gte": rng.randint(0, next_id)}}, {"_id": 1},
                                            session=s).limit(20)] or [0]
        k = rng.random()
        if k < 0.2:
            i = new_id(); coll.insert_one({"_id": i, "n": 0, "tags": [], "s": {"x": 0}}, session=s); done([(cn, i)])
        elif k < 0.3:
            ids = [new_id() for _ in range(3)]
            coll.insert_many([{"_id": i, "n": 1} for i in ids], session=s); done([(cn, i) for i in ids])
        elif k < 0.55:
            i = rng.choice(live)
            coll.update_one({"_id": i}, {"$inc": {"n": 1}, "$set": {"s.y": rng.randint(0, 9)}, "$push": {"tags": "t"}}, session=s)
            done([(cn, i)])
        elif k < 0.65:
            i = rng.choice(live)
            coll.update_one({"_id": i}, {"$pop": {"tags": 1}, "$unset": {"s.x": ""}}, session=s); done([(cn, i)])
        elif k < 0.75:
            i = rng.choice(live)
            coll.replace_one({"_id": i}, {"replaced": ops}, session=s); done([(cn, i)])
        elif k < 0.85:
            i = rng.choice(live)
            coll.delete_one({"_id": i}, session=s); done([(cn, i)])
        elif k < 0.9:
            lo = rng.choice(live)
            coll.update_many({"_id": {"$gte": lo, "$lt": lo + 10}}, {"$inc": {"n": 5}}, session=s)
            done([(cn, d["_id"]) for d in coll.find({"_id": {"$gte": lo, "$lt": lo + 10}}, {"_id": 1}, session=s)])
        else:
            a, b = rng.choice(live), new_id()
            with s.start_transaction():
                coll.update_one({"_id": a}, {"$set": {"txn": ops}}, session=s)
                coll.insert_one({"_id": b, "txn": ops}, session=s)
            done([(cn, a), (cn, b)])
pickle.dump(log, open(work / "model.pickle", "wb"))
print(f"writer: {len(log)} writes")
EOF
WRITER=$!
PIDS+=($WRITER)
while [[ ! -e $WORK/seeded ]]; do sleep 0.1; kill -0 "$WRITER" || { echo "writer died" >&2; exit 1; }; done
sleep 0.5

echo "== mongodump --oplog (writes going on)"
"$MONGODUMP" --uri "$SRC" --oplog --out "$WORK/dump" 2>&1 | sed 's/^/  /'
sleep 0.3
touch "$WORK/stop"
wait "$WRITER"

echo "== mongorestore --oplogReplay into a fresh server"
"$MONGORESTORE" --uri "$DST" --oplogReplay "$WORK/dump" 2>&1 | sed 's/^/  /'

echo "== compare with the source at the dump's end"
"$PY" - "$DST" "$WORK" <<'EOF'
import pickle, sys
from pathlib import Path
import bson
from pymongo import MongoClient
uri, work = sys.argv[1], Path(sys.argv[2])
entries = list(bson.decode_file_iter(open(work / "dump" / "oplog.bson", "rb")))
assert entries, "the dump captured no oplog entry: were writes running?"
end = max(e["ts"] for e in entries)
log = pickle.load(open(work / "model.pickle", "rb"))
# The write whose commit is `end`: the first whose reply's operationTime
# reaches it (the only writer: the previous reply's time is below it).
model = {"items": {}, "carts": {}}
applied = 0
for op_time, changes in log:
    for cn, i, d in changes:
        if d is None:
            model[cn].pop(i, None)
        else:
            model[cn][i] = d
    applied += 1
    if op_time >= end:
        break
assert applied < len(log), "the writer stopped before the dump ended: nothing to prove"
c = MongoClient(uri)
for cn in ("items", "carts"):
    got = {d["_id"]: d for d in c.shop[cn].find()}
    want = model[cn]
    if got != want:
        missing = sorted(set(want) - set(got))[:5]
        extra = sorted(set(got) - set(want))[:5]
        differ = [i for i in want if i in got and got[i] != want[i]][:5]
        sys.exit(f"FAIL shop.{cn}: missing {missing}, extra {extra}, differ {[(i, got[i], want[i]) for i in differ]}")
ops = sum(len(e["o"]["applyOps"]) if "applyOps" in e.get("o", {}) else 1 for e in entries)
print(f"OK: restored state equals the source at {end} "
      f"({applied} of {len(log)} writes; the dump's oplog held {len(entries)} entries, {ops} operations)")
EOF
