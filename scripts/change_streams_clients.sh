#!/usr/bin/env bash
# Change streams through Node's MongoDB driver (`collection.watch()`,
# `db.watch()`) and Mongoose (`Model.watch()`) against `duet serve`: installs
# the packages (npm, into .cache/node-clients) if missing, starts a debug
# `duet serve` on a free port with a temporary data directory, and checks
# with assertions that every operation type arrives (insert, update,
# replace, delete, drop, rename, dropDatabase, invalidate; pre-images), that
# resumeAfter/startAfter work, and that a stream resumes across a server
# restart (the driver's own resume, and resumeAfter a token from before it).
# Not part of the CI suite (it needs Node.js and npm packages).
#
#   bash scripts/change_streams_clients.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
mods="$root/.cache/node-clients"
if [ ! -d "$mods/node_modules/mongoose" ] || [ ! -d "$mods/node_modules/mongodb" ]; then
    mkdir -p "$mods"
    (cd "$mods" && npm install --silent --no-audit --no-fund mongodb@6 mongoose@8 >/dev/null)
fi
cargo build -q -p duet --locked
data="$(mktemp -d)"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
pid=""
start() {
    target/debug/duet serve --port "$port" --data-dir "$data/db" --log-level warn >>"$data/serve.log" 2>&1 &
    pid=$!
    for _ in $(seq 200); do
        python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.2)" 2>/dev/null && return
        sleep 0.1
    done
    echo "duet serve did not start"; cat "$data/serve.log"; exit 1
}
stop() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
trap 'stop; rm -rf "$data"' EXIT
start

# The client script restarts the server by writing to its stdout
# "RESTART" and waiting for "RESTARTED" on its stdin.
cat >"$data/clients.js" <<'EOF'
const assert = require("assert");
const readline = require("readline");
const { MongoClient } = require("mongodb");
const mongoose = require("mongoose");
const uri = process.argv[2];
const lines = readline.createInterface({ input: process.stdin });
const nextLine = () => new Promise((res) => lines.once("line", res));
let passed = 0;
const ok = (what) => { passed++; console.log("ok  " + what); };

async function take(stream, n, ms = 10000) {
  const out = [];
  const deadline = Date.now() + ms;
  while (out.length < n) {
    assert(Date.now() < deadline, `only ${out.length} of ${n} events: ${JSON.stringify(out)}`);
    const e = await stream.tryNext();
    if (e) out.push(e);
  }
  return out;
}

async function restartServer() {
  console.log("RESTART");
  assert.strictEqual(await nextLine(), "RESTARTED");
}

async function main() {
  const client = new MongoClient(uri, { serverSelectionTimeoutMS: 10000 });
  await client.connect();
  const db = client.db("nodecs");
  await db.dropDatabase();
  await db.createCollection("c", { changeStreamPreAndPostImages: { enabled: true } });
  const c = db.collection("c");

  // collection.watch(): every document operation type, pre- and post-images.
  const cs = c.watch([], { fullDocument: "updateLookup", fullDocumentBeforeChange: "whenAvailable", maxAwaitTimeMS: 200 });
  await cs.tryNext(); // opens the cursor before the writes
  await c.insertOne({ _id: 1, a: 1 });
  await c.updateOne({ _id: 1 }, { $set: { a: 2 } });
  await c.replaceOne({ _id: 1 }, { b: 1 });
  await c.deleteOne({ _id: 1 });
  const ev = await take(cs, 4);
  assert.deepStrictEqual(ev.map((e) => e.operationType), ["insert", "update", "replace", "delete"]);
  assert.deepStrictEqual(ev[0].fullDocument, { _id: 1, a: 1 });
  assert.deepStrictEqual(ev[1].updateDescription.updatedFields, { a: 2 });
  assert.deepStrictEqual(ev[1].fullDocumentBeforeChange, { _id: 1, a: 1 });
  assert.deepStrictEqual(ev[2].fullDocument, { _id: 1, b: 1 });
  assert.deepStrictEqual(ev[3].fullDocumentBeforeChange, { _id: 1, b: 1 });
  assert(ev[0]._id._data.startsWith("82"), "resume tokens start with 0x82");
  ok("collection.watch(): insert, update, replace, delete with pre-images");

  // resumeAfter: exactly the events after the token.
  const rs = c.watch([], { resumeAfter: ev[1]._id, maxAwaitTimeMS: 200 });
  assert.deepStrictEqual((await take(rs, 2)).map((e) => e.operationType), ["replace", "delete"]);
  await rs.close();
  ok("resumeAfter a token");

  // db.watch(): rename and drop; then the collection stream's invalidate.
  const ds = db.watch([], { maxAwaitTimeMS: 200 });
  await ds.tryNext();
  await c.insertOne({ _id: 2 });
  await c.rename("c2");
  await db.collection("c2").drop();
  const dev = await take(ds, 3);
  assert.deepStrictEqual(dev.map((e) => e.operationType), ["insert", "rename", "drop"]);
  assert.deepStrictEqual(dev[1].to, { db: "nodecs", coll: "c2" });
  ok("db.watch(): insert, rename, drop");
  const inv = await take(cs, 3);
  assert.deepStrictEqual(inv.map((e) => e.operationType), ["insert", "rename", "invalidate"]);
  const inv2 = inv.slice(2);
  ok("a collection stream ends with invalidate after its rename");
  // startAfter the invalidate: the stream continues.
  const sa = c.watch([], { startAfter: inv2[0]._id, maxAwaitTimeMS: 200 });
  await c.insertOne({ _id: 3 });
  assert.strictEqual((await take(sa, 1))[0].operationType, "insert");
  await sa.close();
  ok("startAfter an invalidate");

  // dropDatabase: drop per collection, dropDatabase, invalidate.
  await db.dropDatabase();
  const dd = await take(ds, 4);
  assert.deepStrictEqual(dd.map((e) => e.operationType), ["insert", "drop", "dropDatabase", "invalidate"]);
  ok("dropDatabase: drop, dropDatabase, invalidate");
  await ds.close();
  await cs.close();

  // A stream resumes across a server restart: the driver's own resume
  // (a resumable error on getMore, then resumeAfter its cached token), and
  // resumeAfter a token saved before the restart.
  const r = db.collection("r");
  const live = r.watch([], { maxAwaitTimeMS: 200 });
  await live.tryNext(); // the driver opens the stream lazily
  await r.insertOne({ _id: 0 });
  const first = await take(live, 1);
  await r.insertOne({ _id: 1 });
  await restartServer();
  for (let i = 2; i < 5; i++) {
    // The driver retries the write once the server is back.
    await r.insertOne({ _id: i });
  }
  const after = await take(live, 4, 30000);
  assert.deepStrictEqual(after.map((e) => e.documentKey._id), [1, 2, 3, 4]);
  ok("the driver resumes a stream across a server restart, no loss, no duplicate");
  await live.close();
  const again = r.watch([], { resumeAfter: first[0]._id, maxAwaitTimeMS: 200 });
  assert.deepStrictEqual((await take(again, 4)).map((e) => e.documentKey._id), [1, 2, 3, 4]);
  await again.close();
  ok("resumeAfter a token from before the restart");
  await client.close();

  // Mongoose Model.watch().
  await mongoose.connect(uri, { dbName: "nodecs_mongoose", serverSelectionTimeoutMS: 10000 });
  const Kitten = mongoose.model("Kitten", new mongoose.Schema({ name: String, age: Number }));
  await Kitten.init();
  const ms = Kitten.watch([], { fullDocument: "updateLookup", maxAwaitTimeMS: 200 });
  const seen = [];
  ms.on("change", (e) => seen.push(e));
  await new Promise((res) => setTimeout(res, 300));
  const k = await Kitten.create({ name: "Tom", age: 1 });
  await Kitten.updateOne({ _id: k._id }, { $inc: { age: 1 } });
  await Kitten.replaceOne({ _id: k._id }, { name: "Tom", age: 5 });
  await Kitten.deleteOne({ _id: k._id });
  const deadline = Date.now() + 10000;
  while (seen.length < 4 && Date.now() < deadline) await new Promise((res) => setTimeout(res, 50));
  assert.deepStrictEqual(seen.map((e) => e.operationType), ["insert", "update", "replace", "delete"]);
  assert.strictEqual(seen[0].fullDocument.name, "Tom");
  // updateLookup: the version current when the event was read (MongoDB's rule).
  assert([2, 5].includes(seen[1].fullDocument?.age) || seen[1].fullDocument === null, JSON.stringify(seen[1]));
  assert.deepStrictEqual(seen[1].updateDescription.updatedFields, { age: 2 });
  await ms.close();
  ok("Mongoose Model.watch(): insert, update, replace, delete");
  await mongoose.connection.db.dropDatabase();
  await mongoose.disconnect();
  console.log(`PASSED ${passed}`);
}

main().then(() => process.exit(0), (e) => { console.error("FAILED:", e); process.exit(1); });
EOF

# Run the clients; restart the server when they ask.
coproc CLIENTS { NODE_PATH="$mods/node_modules" node "$data/clients.js" "mongodb://127.0.0.1:$port/?directConnection=true" 2>&1; }
clients_pid=$CLIENTS_PID
result=1
while IFS= read -r line <&"${CLIENTS[0]}"; do
    if [ "$line" = "RESTART" ]; then
        kill -KILL "$pid"; wait "$pid" 2>/dev/null || true
        start
        echo "(server killed with SIGKILL and restarted)"
        echo "RESTARTED" >&"${CLIENTS[1]}"
        continue
    fi
    echo "$line"
    case "$line" in PASSED*) result=0 ;; esac
done
wait "$clients_pid" 2>/dev/null || result=1
if [ "$result" -ne 0 ]; then
    echo "--- server log"; tail -30 "$data/serve.log"
    exit 1
fi
echo "change stream clients test passed"
