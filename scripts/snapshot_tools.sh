#!/usr/bin/env bash
# mongodump and mongoexport of a named snapshot as a database
# (`shop@nightly`, issue #22 item 6) while the live database changes.
# Not run in CI: it needs the MongoDB Database Tools.
#
# What it checks: `shop` is seeded, the named snapshot `nightly` is taken
# and the state it holds is recorded (nothing writes between the two);
# then an updater changes, inserts and deletes documents of `shop` without
# pause while `mongodump --db 'shop@nightly'` and
# `mongoexport --db 'shop@nightly'` run. The dump's BSON files and the
# export's lines must equal the recorded state exactly (same documents,
# same bytes per document), the dump's metadata must list the snapshot's
# indexes, the live database must by then differ from the snapshot (or the
# test proves nothing), `mongorestore` of the dump into `restored` must
# give the snapshot's state back, and writes through `shop@nightly` must be
# refused (20 IllegalOperation).
#
# Needs: target/debug/duet (cargo build -p duet; DUET_BIN to override), the
# python venv of tests/python (.venv, with pymongo), and `mongodump`,
# `mongoexport` and `mongorestore` (MongoDB Database Tools 100.x) in
# $MONGO_TOOLS_BIN (default .cache/mongo-tools, shared with
# scripts/oplog_tools.sh) or on PATH. When they are missing and
# $MONGO_TOOLS_SRC names a checkout of the mongo-tools repository (it
# vendors its Go dependencies), they are built from it with `go build
# -mod=vendor` into .cache/mongo-tools (about 4 minutes on 2 cores). The
# Go module proxy does not serve mongo-tools (its tags are not semver), so
# `go install …@version` cannot fetch them.
#
# Usage: scripts/snapshot_tools.sh   (SEED_DOCS: documents per collection,
#   default 20000)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DUET=${DUET_BIN:-$ROOT/target/debug/duet}
PY=${PYTHON:-$ROOT/.venv/bin/python}
TOOLS=${MONGO_TOOLS_BIN:-$ROOT/.cache/mongo-tools}

build_tools() {
  local src=${MONGO_TOOLS_SRC:-}
  [[ -n $src && -f $src/go.mod ]] || return 0
  mkdir -p "$TOOLS"
  for t in mongodump mongoexport mongorestore; do
    [[ -x $TOOLS/$t ]] && continue
    echo "== building $t from $src"
    (cd "$src" && go build -mod=vendor -o "$TOOLS/$t" "./$t/main")
  done
}
tool() {
  if [[ -x "$TOOLS/$1" ]]; then echo "$TOOLS/$1"; return; fi
  if command -v "$1" >/dev/null; then command -v "$1"; return; fi
  echo "snapshot_tools: $1 not found in $TOOLS or on PATH (set MONGO_TOOLS_BIN, or MONGO_TOOLS_SRC to build it)" >&2
  exit 2
}
build_tools
MONGODUMP=$(tool mongodump)
MONGOEXPORT=$(tool mongoexport)
MONGORESTORE=$(tool mongorestore)

NAME=snapshot_tools
# shellcheck source=lib/serve.sh
source scripts/lib/serve.sh
PORT=$(free_port)
serve data "$PORT"
URI="mongodb://127.0.0.1:$PORT/?directConnection=true"

echo "== seed shop, take the snapshot 'nightly', record its state"
"$PY" - "$URI" "$WORK" "${SEED_DOCS:-20000}" <<'EOF'
import pickle, sys
from pathlib import Path
from pymongo import MongoClient
uri, work, n = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
c = MongoClient(uri)
shop = c.shop
for cn in ("items", "carts"):
    for lo in range(0, n, 1000):
        shop[cn].insert_many([{"_id": i, "n": i % 97, "tags": ["a", i % 3], "s": {"x": i},
                               "pad": "p" * 100} for i in range(lo, min(lo + 1000, n))])
shop.items.create_index([("n", 1), ("s.x", -1)], name="n_sx")
shop.command({"createSnapshot": "nightly"})
# Nothing writes between the snapshot and these reads: they are its state,
# as raw BSON bytes so that the comparison is byte for byte.
from bson.raw_bson import RawBSONDocument
raw = c.get_database("shop", codec_options=c.codec_options.with_options(document_class=RawBSONDocument))
state = {cn: {RawBSONDocument(d.raw)["_id"]: d.raw for d in raw[cn].find()} for cn in ("items", "carts")}
pickle.dump(state, open(work / "snapshot.pickle", "wb"))
print(f"  snapshot holds {len(state['items'])} items, {len(state['carts'])} carts")
EOF

# The updater: changes shop until $WORK/stop exists (at least 200 writes).
"$PY" - "$URI" "$WORK" <<'EOF' &
import random, sys
from pathlib import Path
from pymongo import MongoClient
uri, work = sys.argv[1], Path(sys.argv[2])
shop = MongoClient(uri).shop
rng = random.Random(22)
ops, next_id = 0, 10**9
while not (work / "stop").exists() or ops < 200:
    ops += 1
    coll = shop[rng.choice(("items", "carts"))]
    k = rng.random()
    i = rng.randrange(0, 20000)
    if k < 0.4:
        coll.update_one({"_id": i}, {"$inc": {"n": 1}, "$set": {"s.y": ops}, "$push": {"tags": "u"}})
    elif k < 0.6:
        next_id += 1
        coll.insert_one({"_id": next_id, "n": -1})
    elif k < 0.8:
        coll.delete_one({"_id": i})
    elif k < 0.9:
        coll.update_many({"_id": {"$gte": i, "$lt": i + 50}}, {"$set": {"bulk": ops}})
    else:
        coll.replace_one({"_id": i}, {"replaced": ops})
(work / "updates").write_text(str(ops))
EOF
UPDATER=$!
PIDS+=($UPDATER)
sleep 0.5

echo "== mongodump --db 'shop@nightly' (updates going on)"
"$MONGODUMP" --uri "$URI" --db 'shop@nightly' --out "$WORK/dump" 2>&1 | sed 's/^/  /'
echo "== mongoexport --db 'shop@nightly' -c items and -c carts (updates going on)"
for cn in items carts; do
  "$MONGOEXPORT" --uri "$URI" --db 'shop@nightly' -c "$cn" --out "$WORK/$cn.json" 2>&1 | sed 's/^/  /'
done
touch "$WORK/stop"
wait "$UPDATER"
echo "  the updater made $(cat "$WORK/updates") writes meanwhile"

echo "== mongorestore of the dump into 'restored'"
"$MONGORESTORE" --uri "$URI" --nsFrom 'shop@nightly.*' --nsTo 'restored.*' "$WORK/dump" 2>&1 | sed 's/^/  /'

echo "== compare with the snapshot's state"
"$PY" - "$URI" "$WORK" <<'EOF'
import json, pickle, sys
from pathlib import Path
import bson
from bson import json_util
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient
from pymongo.errors import OperationFailure
uri, work = sys.argv[1], Path(sys.argv[2])
want = pickle.load(open(work / "snapshot.pickle", "rb"))
c = MongoClient(uri)
fails = []
def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        fails.append(what)
def diff(got, exp):
    missing = sorted(set(exp) - set(got))[:3]
    extra = sorted(set(got) - set(exp))[:3]
    differ = [i for i in exp if i in got and got[i] != exp[i]][:3]
    return f"missing {missing}, extra {extra}, differ {differ}"
dump = work / "dump" / "shop@nightly"
for cn in ("items", "carts"):
    exp = want[cn]
    data = (dump / f"{cn}.bson").read_bytes()
    got = {}
    for d in bson.decode_iter(data, codec_options=bson.CodecOptions(document_class=RawBSONDocument)):
        got[d["_id"]] = d.raw
    check(got == exp, f"mongodump shop@nightly.{cn}: {len(got)} documents equal the snapshot's, byte for byte"
          + ("" if got == exp else f" ({diff(got, exp)})"))
    lines = (work / f"{cn}.json").read_text().splitlines()
    exported = {}
    for line in lines:
        d = json_util.loads(line)
        exported[d["_id"]] = d
    decoded = {i: bson.decode(b) for i, b in exp.items()}
    check(exported == decoded, f"mongoexport shop@nightly -c {cn}: {len(exported)} documents equal the snapshot's"
          + ("" if exported == decoded else f" ({diff(exported, decoded)})"))
    restored = {d["_id"]: d for d in c.restored[cn].find()}
    check(restored == decoded, f"mongorestore of the dump: restored.{cn} equals the snapshot"
          + ("" if restored == decoded else f" ({diff(restored, decoded)})"))
    live = {d["_id"]: d for d in c.shop[cn].find()}
    check(live != decoded, f"the live shop.{cn} changed meanwhile ({len(live)} documents now)")
meta = json.loads((dump / "items.metadata.json").read_text())
names = sorted(i["name"] for i in meta["indexes"])
check(names == ["_id_", "n_sx"], f"the dump's metadata lists the snapshot's indexes {names}")
check(sorted(i["name"] for i in c.restored.items.list_indexes()) == ["_id_", "n_sx"],
      "mongorestore rebuilt them")
try:
    c["shop@nightly"].items.insert_one({"x": 1})
    check(False, "a write through shop@nightly is refused")
except OperationFailure as e:
    check(e.code == 20, f"a write through shop@nightly is refused ({e.code} {e.details.get('codeName')})")
if fails:
    sys.exit(f"{len(fails)} check(s) failed")
print("snapshot tools: all checks passed")
EOF
