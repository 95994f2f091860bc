// Mongoose's TTL pattern against `duet serve` (run by tests/python/test_mongoose.py):
// a schema with `expires`, Model.init() from two connections (a second
// application start sends createCollection and createIndexes again and must
// be a no-op), syncIndexes() dropping nothing, documents inserted, one TTL
// monitor pass run now through the test hook, and exactly the expired
// documents gone. Exits 0 and prints "PASSED" when every assertion holds.
//
//   node mongoose_ttl.js mongodb://127.0.0.1:PORT/?directConnection=true DBNAME
"use strict";
const assert = require("assert");
const mongoose = require("mongoose");

const [uri, dbName] = process.argv.slice(2);
assert(uri && dbName, "usage: node mongoose_ttl.js URI DBNAME");
const ok = (what) => console.log("ok  " + what);

// A session store's schema: `expires` in seconds on one path, and a string
// duration (Mongoose converts "1h" with the `ms` package) on another model.
const sessionSchema = new mongoose.Schema({
  sid: { type: String, required: true, unique: true },
  createdAt: { type: Date, default: Date.now, expires: 3600 },
});
const tokenSchema = new mongoose.Schema({
  token: String,
  issuedAt: { type: Date, expires: "1h" },
});

async function main() {
  const opts = { dbName, serverSelectionTimeoutMS: 10000, autoIndex: true };
  const first = await mongoose.createConnection(uri, opts).asPromise();
  const Session = first.model("Session", sessionSchema);
  const Token = first.model("Token", tokenSchema);
  await Session.init();
  await Token.init();
  const indexes = await Session.listIndexes();
  const ttl = indexes.find((ix) => ix.name === "createdAt_1");
  assert(ttl, "no createdAt_1 index: " + JSON.stringify(indexes));
  assert.deepStrictEqual(ttl.key, { createdAt: 1 });
  assert.strictEqual(ttl.expireAfterSeconds, 3600);
  assert(indexes.some((ix) => ix.name === "sid_1" && ix.unique === true), JSON.stringify(indexes));
  const tokenTtl = (await Token.listIndexes()).find((ix) => ix.name === "issuedAt_1");
  assert.strictEqual(tokenTtl && tokenTtl.expireAfterSeconds, 3600, "expires: '1h'");
  ok("Model.init(): the TTL index created with expireAfterSeconds 3600");

  // A second application start: a new connection, a new model, init again.
  const second = await mongoose.createConnection(uri, opts).asPromise();
  const Session2 = second.model("Session", sessionSchema);
  await Session2.init();
  await Session2.init(); // the same promise again: still no error
  assert.deepStrictEqual(await Session2.listIndexes(), indexes);
  ok("Model.init() again from a second connection is a no-op");
  const dropped = await Session2.syncIndexes();
  assert.deepStrictEqual(dropped, [], "syncIndexes dropped " + JSON.stringify(dropped));
  assert.deepStrictEqual(await Session2.listIndexes(), indexes);
  ok("syncIndexes() finds the server's TTL index equal to the schema's");

  const now = Date.now();
  const hour = 3600 * 1000;
  await Session.create([
    { sid: "old", createdAt: new Date(now - 2 * hour) },
    { sid: "edge", createdAt: new Date(now - hour - 60 * 1000) },
    { sid: "fresh", createdAt: new Date(now - 10 * 1000) },
    { sid: "default" }, // createdAt: Date.now
  ]);
  await Token.create([
    { token: "stale", issuedAt: new Date(now - 3 * hour) },
    { token: "live", issuedAt: new Date(now) },
    { token: "no-date" },
  ]);
  // A unique index beside the TTL index still rejects duplicates (11000).
  await assert.rejects(Session.create({ sid: "old" }), (e) => e.code === 11000);

  const pass = await first.db.admin().command({ duetRunTtlPass: 1 });
  assert.strictEqual(pass.ok, 1);
  assert(pass.deletedDocuments >= 3, JSON.stringify(pass));
  const left = (await Session.find().sort({ sid: 1 }).lean()).map((d) => d.sid);
  assert.deepStrictEqual(left, ["default", "fresh"]);
  const tokens = (await Token.find().sort({ token: 1 }).lean()).map((d) => d.token);
  assert.deepStrictEqual(tokens, ["live", "no-date"]);
  ok("a TTL pass deletes exactly the expired sessions and tokens");

  // collMod lowers expireAfterSeconds (what an application changing
  // `expires` does, since createIndexes with another value conflicts: 85).
  await assert.rejects(
    first.db.collection("sessions").createIndex({ createdAt: 1 }, { expireAfterSeconds: 30 }),
    (e) => e.code === 85,
  );
  await first.db.command({ collMod: "sessions", index: { name: "createdAt_1", expireAfterSeconds: 30 } });
  await Session.updateOne({ sid: "fresh" }, { $set: { createdAt: new Date(now - 60 * 1000) } });
  await first.db.admin().command({ duetRunTtlPass: 1 });
  assert.deepStrictEqual((await Session.find().lean()).map((d) => d.sid), ["default"]);
  ok("collMod expireAfterSeconds, then the next pass uses it");

  await first.dropDatabase();
  await first.close();
  await second.close();
  console.log("PASSED");
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error("FAILED:", e);
    process.exit(1);
  },
);
