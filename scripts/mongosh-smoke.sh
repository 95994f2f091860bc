#!/usr/bin/env bash
# mongosh against `duet serve`: installs mongosh (npm, into .cache/mongosh) if
# missing, starts a debug `duet serve` on a free port with a temporary data
# directory, runs a script of shell helpers with assertions, stops the server.
# Not part of the CI suite (it needs Node.js and ~100 MB of npm packages).
#
#   bash scripts/mongosh-smoke.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
shell_dir="$root/.cache/mongosh"
if [ ! -x "$shell_dir/node_modules/.bin/mongosh" ]; then
    mkdir -p "$shell_dir"
    (cd "$shell_dir" && npm install --silent --no-audit --no-fund mongosh@2 >/dev/null)
fi
cargo build -q -p duet --locked
data="$(mktemp -d)"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
target/debug/duet serve --port "$port" --data-dir "$data/db" --log-level warn >"$data/serve.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$data"' EXIT
for _ in $(seq 100); do grep -q "listening on" "$data/serve.log" && break; sleep 0.1; done
"$shell_dir/node_modules/.bin/mongosh" --quiet "mongodb://127.0.0.1:$port/smoke" --eval '
  function check(ok, what) { if (!ok) { throw new Error("FAILED: " + what); } print("ok  " + what); }
  db.c.drop();
  db.c.insertOne({a: 1}); db.c.insertMany([{a: 2}, {a: 3}]);
  check(db.c.countDocuments() === 3, "insert + countDocuments");
  check(db.c.find({a: {$gte: 2}}).toArray().length === 2, "find with a filter");
  const s = db.c.aggregate([{$group: {_id: null, s: {$sum: "$a"}}}]).toArray();
  check(s.length === 1 && s[0].s === 6, "aggregate $group");
  db.c.createIndex({a: 1});
  check(db.c.getIndexes().length === 2, "createIndex + getIndexes");
  check(db.c.find({a: 2}).explain().queryPlanner.winningPlan.stage === "FETCH", "explain uses the index");
  check(db.c.updateOne({a: 2}, {$inc: {a: 10}}).modifiedCount === 1, "updateOne $inc");
  check(db.c.deleteMany({a: {$gt: 5}}).deletedCount === 1, "deleteMany");
  check(JSON.stringify(db.c.distinct("a")) === "[1,3]", "distinct");
  check(db.getMongo().getDBNames().includes("smoke"), "show dbs");
  check(db.getCollectionNames().includes("c"), "show collections");
  check(db.runCommand({createSnapshot: "s1"}).ok === 1, "createSnapshot");
  db.c.insertOne({a: 9});
  check(Number(db.runCommand({count: "c", $duet: {snapshotName: "s1"}}).n) === 2, "count on a named snapshot");
  check(Number(db.runCommand({count: "c", $duet: {snapshot: "vls"}}).n) === 3, "count under vls");
  check(db.runCommand({dropSnapshot: "s1"}).ok === 1, "dropSnapshot");
  check(db.c.find().readConcern("snapshot").toArray().length === 3, "readConcern snapshot");
  const s1 = db.getMongo().startSession();
  s1.startTransaction();
  s1.getDatabase("smoke").c.insertOne({t: 1});
  check(db.c.countDocuments({t: 1}) === 0, "a transaction write is invisible before commit");
  s1.commitTransaction();
  check(db.c.countDocuments({t: 1}) === 1, "and visible after commit");
  s1.startTransaction();
  s1.getDatabase("smoke").c.insertOne({t: 2});
  s1.abortTransaction();
  check(db.c.countDocuments({t: 2}) === 0, "an aborted transaction leaves nothing");
  s1.endSession();
  // Admin helpers (issue #22).
  const n = db.c.countDocuments();
  check(db.stats().objects >= n && db.stats().collections >= 1, "db.stats()");
  const cs = db.c.stats();
  check(cs.count === n && cs.size > 0 && cs.nindexes === 2, "db.c.stats()");
  check(db.c.dataSize() === cs.size, "db.c.dataSize()");
  check(db.c.totalSize() >= db.c.dataSize(), "db.c.totalSize()");
  const v = db.c.validate();
  check(v.valid === true && v.nrecords === n, "db.c.validate()");
  check(Array.isArray(db.currentOp().inprog), "db.currentOp()");
  check(db.serverStatus().ok === 1, "db.serverStatus()");
  check(rs.status().members.length === 1 && rs.status().members[0].stateStr === "PRIMARY", "rs.status()");
  check(rs.conf().members.length === 1, "rs.conf()");
  check(db.adminCommand({top: 1}).totals["smoke.c"] !== undefined, "top");
  check(Array.isArray(db.adminCommand({getLog: "global"}).log), "getLog");
  check(db.hostInfo().system.numCores >= 1, "db.hostInfo()");
  check(Number(db.fsyncLock().lockCount) === 1, "db.fsyncLock()");
  check(db.c.countDocuments() === n, "reads go on under the fsync lock");
  check(Number(db.fsyncUnlock().lockCount) === 0, "db.fsyncUnlock()");
  db.c.insertOne({after: "unlock"});
  check(db.c.countDocuments() === n + 1, "writes go on after fsyncUnlock");
  check(Number(db.adminCommand({getParameter: 1, slowOpThresholdMs: 1}).slowOpThresholdMs) === 100, "getParameter");
  check(db.adminCommand({getCmdLineOpts: 1}).parsed["data-dir"] !== undefined, "getCmdLineOpts");
  const uses = () => db.c.aggregate([{$indexStats: {}}]).toArray().find(i => i.name === "a_1").accesses.ops.toNumber();
  const u0 = uses();
  db.c.find({a: 3}).toArray();
  check(uses() === u0 + 1, "$indexStats counts a read that uses the index");
  check(Array.isArray(db.getUsers().users), "db.getUsers()");
  check(db.runCommand({createSnapshot: "nightly"}).ok === 1, "createSnapshot nightly");
  db.c.insertOne({after: "nightly"});
  const snap = db.getSiblingDB("smoke@nightly");
  check(snap.c.countDocuments() === n + 1 && db.c.countDocuments() === n + 2, "db@snapshot reads the snapshot");
  check(snap.c.stats().count === n + 1, "db@snapshot: db.c.stats()");
  check(snap.getCollectionNames().includes("c"), "db@snapshot: show collections");
  let refused = null;
  // The Node.js driver turns any 20 on a retryable write into "does not
  // support retryable writes", keeping the error of the server as originalError.
  try { snap.c.insertOne({x: 1}); } catch (e) { refused = (e.originalError || e).code; }
  check(refused === 20, "db@snapshot refuses writes (20 IllegalOperation)");
  check(db.runCommand({dropSnapshot: "nightly"}).ok === 1, "dropSnapshot nightly");
'
echo "mongosh smoke test passed"
