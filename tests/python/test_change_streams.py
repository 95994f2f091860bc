"""Change streams through pymongo: `watch()` on a collection, a database
and the client; every operation type; resume tokens (resumeAfter,
startAfter after an invalidate, startAtOperationTime); transactions;
resume across a restart, SIGKILL included, without loss or duplicate."""

import signal
import time

import pytest
from bson import Timestamp
from pymongo.errors import OperationFailure


def drain(stream, n, timeout=10.0):
    """The next n events of `stream` (fails after `timeout` seconds)."""
    out = []
    deadline = time.time() + timeout
    while len(out) < n:
        assert time.time() < deadline, f"only {len(out)} of {n} events: {out}"
        e = stream.try_next()
        if e is not None:
            out.append(e)
    return out


def quiet(stream, wait=0.5):
    """No event arrives within `wait` seconds."""
    deadline = time.time() + wait
    while time.time() < deadline:
        e = stream.try_next()
        assert e is None, f"unexpected event {e}"


def test_collection_watch_every_operation_type(db):
    coll = db.c
    coll.insert_one({"_id": 0})  # the collection exists before the stream
    with coll.watch(max_await_time_ms=200) as s:
        coll.insert_one({"_id": 1, "a": 1, "s": {"x": 1}})
        coll.update_one({"_id": 1}, {"$set": {"a": 2, "s.y": 3}, "$unset": {"gone": ""}})
        coll.update_one({"_id": 1}, {"$unset": {"a": ""}})
        coll.replace_one({"_id": 1}, {"b": 1})
        coll.delete_one({"_id": 1})
        coll.drop()
        ev = drain(s, 7)
        assert [e["operationType"] for e in ev] == [
            "insert", "update", "update", "replace", "delete", "drop", "invalidate"]
        ins, upd, unset, rep, dele, drop, inv = ev
        assert ins["fullDocument"] == {"_id": 1, "a": 1, "s": {"x": 1}}
        assert ins["documentKey"] == {"_id": 1}
        assert ins["ns"] == {"db": db.name, "coll": "c"}
        assert isinstance(ins["clusterTime"], Timestamp)
        assert ins["_id"]["_data"].startswith("82")
        assert upd["updateDescription"]["updatedFields"] == {"a": 2, "s.y": 3}
        assert upd["updateDescription"]["removedFields"] == []
        assert "fullDocument" not in upd
        assert unset["updateDescription"]["removedFields"] == ["a"]
        assert rep["fullDocument"] == {"_id": 1, "b": 1}
        assert dele["documentKey"] == {"_id": 1}
        assert drop["ns"] == {"db": db.name, "coll": "c"}
        times = [e["clusterTime"] for e in ev]
        assert times == sorted(times)
        assert s.alive is False or s.try_next() is None


def test_update_lookup_and_pipeline(db):
    """updateLookup returns the document as it is when the event is read
    (MongoDB's rule), null once deleted; whenAvailable returns the version
    the update wrote (the log holds it)."""
    coll = db.c
    with coll.watch([{"$match": {"operationType": "update"}}],
                    full_document="updateLookup", max_await_time_ms=200) as s, \
            coll.watch([{"$match": {"operationType": "update"}}],
                       full_document="whenAvailable", max_await_time_ms=200) as w:
        coll.insert_one({"_id": 1, "v": 1})
        coll.update_one({"_id": 1}, {"$inc": {"v": 1}})
        coll.update_one({"_id": 1}, {"$inc": {"v": 1}})
        coll.insert_one({"_id": 2, "v": 1})
        coll.update_one({"_id": 2}, {"$inc": {"v": 1}})
        coll.delete_one({"_id": 2})
        ev = drain(s, 3)
        assert [e["fullDocument"] for e in ev] == [
            {"_id": 1, "v": 3}, {"_id": 1, "v": 3}, None]
        assert [e["fullDocument"]["v"] for e in drain(w, 3)] == [2, 3, 2]
        quiet(s, 0.3)


def test_database_and_client_watch(client, db):
    other = client[db.name + "_o"]
    client.drop_database(other.name)
    with db.watch(max_await_time_ms=200) as ds, \
            client.watch(max_await_time_ms=200) as cs:
        db.a.insert_one({"_id": 1})
        other.b.insert_one({"_id": 2})
        db.a.rename("a2")
        db.a2.drop()
        dev = drain(ds, 3)
        assert [e["operationType"] for e in dev] == ["insert", "rename", "drop"]
        assert dev[1]["to"] == {"db": db.name, "coll": "a2"}
        cev = drain(cs, 4)
        assert [(e["operationType"], e["ns"]["db"]) for e in cev] == [
            ("insert", db.name), ("insert", other.name), ("rename", db.name),
            ("drop", db.name)]
        client.drop_database(other.name)
        assert [(e["operationType"], e["ns"]) for e in drain(cs, 2)] == [
            ("drop", {"db": other.name, "coll": "b"}), ("dropDatabase", {"db": other.name})]


def test_resume_after_every_token_and_start_after_invalidate(db):
    coll = db.c
    coll.insert_one({"_id": 0})
    with coll.watch(max_await_time_ms=200) as s:
        for i in range(1, 6):
            coll.insert_one({"_id": i})
        ev = drain(s, 5)
    for k, e in enumerate(ev):
        with coll.watch(resume_after=e["_id"], max_await_time_ms=200) as r:
            rest = drain(r, 5 - k - 1)
            assert [x["documentKey"]["_id"] for x in rest] == list(range(k + 2, 6))
            quiet(r, 0.2)
    with coll.watch(max_await_time_ms=200) as s:
        coll.drop()
        drop, inv = drain(s, 2)
        assert inv["operationType"] == "invalidate"
    with pytest.raises(OperationFailure) as err:
        with coll.watch(resume_after=inv["_id"]) as r:
            r.try_next()
    assert err.value.code == 260
    with coll.watch(start_after=inv["_id"], max_await_time_ms=200) as r:
        coll.insert_one({"_id": "again"})
        assert drain(r, 1)[0]["documentKey"] == {"_id": "again"}


def test_post_batch_resume_token_on_empty_batches(db):
    coll = db.c
    coll.insert_one({"_id": 0})
    with coll.watch(max_await_time_ms=100) as s:
        assert s.try_next() is None
        t1 = s.resume_token
        assert t1 is not None and t1["_data"].startswith("82")
        db.other.insert_one({"_id": 1})  # not this collection: token still advances
        time.sleep(0.05)
        assert s.try_next() is None
        assert s.resume_token["_data"] >= t1["_data"]
        coll.insert_one({"_id": 2})
        assert drain(s, 1)[0]["documentKey"] == {"_id": 2}


def test_start_at_operation_time(db):
    coll = db.c
    coll.insert_one({"_id": 1})
    # A reply's operationTime is the time of the latest commit (the insert
    # of 1, as in MongoDB), and startAtOperationTime is inclusive.
    t = db.command("ping")["operationTime"]
    coll.insert_one({"_id": 2})
    with coll.watch(start_at_operation_time=t, max_await_time_ms=200) as s:
        ids = [e["documentKey"]["_id"] for e in drain(s, 2)]
        assert ids == [1, 2]
        quiet(s, 0.2)
    # The stream's own operationTime starts it exactly where it started.
    with coll.watch(max_await_time_ms=100) as s:
        assert s.try_next() is None
        start = s._start_at_operation_time
    coll.insert_one({"_id": 3})
    if start is not None:
        with coll.watch(start_at_operation_time=start, max_await_time_ms=200) as r:
            assert [e["documentKey"]["_id"] for e in drain(r, 1)] == [3]
            quiet(r, 0.2)


def test_transaction_events_share_time_and_carry_lsid(client, db):
    db.c.insert_one({"_id": 0, "v": 0})
    with db.c.watch(max_await_time_ms=200) as s:
        with client.start_session() as sess:
            lsid = sess.session_id["id"]
            with sess.start_transaction():
                db.c.insert_one({"_id": 1}, session=sess)
                db.c.update_one({"_id": 0}, {"$inc": {"v": 1}}, session=sess)
        ev = drain(s, 2)
    assert sorted(e["operationType"] for e in ev) == ["insert", "update"]
    assert ev[0]["clusterTime"] == ev[1]["clusterTime"]
    assert all("txnNumber" in e and "lsid" in e for e in ev)
    assert ev[0]["lsid"]["id"] == lsid


def test_expanded_events(db):
    with db.watch(show_expanded_events=True, max_await_time_ms=200) as s:
        db.create_collection("x")
        db.x.create_index("k")
        db.x.drop_index("k_1")
        # A create with options is one `create`; collMod is `modify`.
        db.create_collection("y", changeStreamPreAndPostImages={"enabled": True})
        db.command("collMod", "x", changeStreamPreAndPostImages={"enabled": True})
        ev = drain(s, 5)
    assert [e["operationType"] for e in ev] == [
        "create", "createIndexes", "dropIndexes", "create", "modify"]
    assert ev[4]["operationDescription"] == {"changeStreamPreAndPostImages": {"enabled": True}}


def test_bad_options(db):
    with pytest.raises(OperationFailure) as e:
        db.c.aggregate([{"$changeStream": {"bogus": 1}}])
    assert e.value.code == 40415
    with pytest.raises(OperationFailure) as e:
        db.c.aggregate([{"$changeStream": {}}, {"$group": {"_id": 1}}])
    assert e.value.code == 20
    with pytest.raises(OperationFailure) as e:
        db.c.aggregate([{"$changeStream": {"resumeAfter": {"_data": "00"}}}])
    assert e.value.code == 260


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_resume_across_restart_without_loss_or_duplicate(make_server, sig):
    srv = make_server()
    c = srv.client()
    coll = c.d.c
    coll.insert_one({"_id": "seed"})
    with coll.watch(max_await_time_ms=200) as s:
        for i in range(10):
            coll.insert_one({"_id": i})
        first = drain(s, 4)
        token = first[-1]["_id"]
    for i in range(10, 20):
        coll.insert_one({"_id": i})
    c.close()
    srv.stop(sig)
    srv2 = make_server()
    c2 = srv2.client()
    with c2.d.c.watch(resume_after=token, max_await_time_ms=200) as r:
        for i in range(20, 25):
            c2.d.c.insert_one({"_id": i})
        rest = drain(r, 21)
        quiet(r, 0.3)
    assert [e["documentKey"]["_id"] for e in rest] == list(range(4, 25))
    c2.close()


def test_snapshot_then_stream_has_no_gap_and_no_duplicate(client, db):
    """Item 7: a snapshot read's atClusterTime, given to startAtOperationTime,
    delivers exactly the changes after the snapshot, while writes run. Checked
    against a model: snapshot + events replayed == the final state."""
    import random
    import threading

    coll = db.c
    coll.insert_many([{"_id": i, "v": 0} for i in range(50)])
    stop = threading.Event()
    next_id = [1000]

    def writer():
        w = client[db.name].c
        rng = random.Random(next_id[0])
        n = next_id[0]
        while not stop.is_set():
            op = rng.random()
            if op < 0.4:
                w.insert_one({"_id": n, "v": 0})
                n += 1
            elif op < 0.8:
                w.update_one({"_id": rng.randrange(n)}, {"$inc": {"v": 1}})
            else:
                w.delete_one({"_id": rng.randrange(n)})
        next_id[0] = n

    for _round in range(3):
        t = threading.Thread(target=writer)
        t.start()
        time.sleep(0.2)
        with client.start_session(snapshot=True) as sess:
            model = {d["_id"]: d for d in coll.find({}, session=sess)}
            at = sess._snapshot_time
        assert isinstance(at, Timestamp)
        with coll.watch(start_at_operation_time=at, full_document="whenAvailable",
                        max_await_time_ms=200) as s:
            time.sleep(0.2)
            stop.set()
            t.join()
            stop.clear()
            coll.insert_one({"_id": "marker", "round": _round})
            while True:
                e = s.try_next()
                if e is None:
                    continue
                key = e["documentKey"]["_id"]
                if key == "marker":
                    break
                op = e["operationType"]
                if op == "insert":
                    assert key not in model, f"duplicate insert of {key}"
                    model[key] = e["fullDocument"]
                elif op in ("update", "replace"):
                    assert key in model, f"update of {key} the snapshot lacks (gap)"
                    model[key] = e["fullDocument"]
                elif op == "delete":
                    assert key in model, f"delete of {key} the snapshot lacks (gap)"
                    del model[key]
        final = {d["_id"]: d for d in coll.find({"_id": {"$ne": "marker"}})}
        assert model == final
        coll.delete_one({"_id": "marker"})


def test_replace_root_and_replace_with_keep_the_token(db):
    coll = db.rr
    coll.insert_one({"_id": 0})
    pipeline = [
        {"$match": {"operationType": "insert"}},
        {"$replaceRoot": {"newRoot": {"_id": "$_id", "doc": "$fullDocument"}}},
        {"$replaceWith": {"_id": "$_id", "doc": "$doc", "k": "$doc.k"}},
    ]
    with coll.watch(pipeline, max_await_time_ms=200) as s:
        coll.insert_one({"_id": 1, "k": "a"})
        coll.delete_one({"_id": 1})
        coll.insert_one({"_id": 2, "k": "b"})
        ev = drain(s, 2)
        assert [sorted(e.keys()) for e in ev] == [["_id", "doc", "k"]] * 2
        assert [e["k"] for e in ev] == ["a", "b"]
        # The token survived: resuming after the first gives the second.
        with coll.watch(pipeline, resume_after=ev[0]["_id"], max_await_time_ms=200) as r:
            assert drain(r, 1)[0]["k"] == "b"


def test_pipeline_that_changes_the_token_fails_280_and_bad_new_root_40228(db):
    coll = db.rr2
    coll.insert_one({"_id": 0})
    with coll.watch([{"$replaceWith": "$fullDocument"}], max_await_time_ms=200) as s:
        coll.insert_one({"_id": 1})
        with pytest.raises(OperationFailure) as e:
            drain(s, 1)
        assert e.value.code == 280
    with coll.watch([{"$replaceRoot": {"newRoot": "$nope"}}], max_await_time_ms=200) as s:
        coll.insert_one({"_id": 2})
        with pytest.raises(OperationFailure) as e:
            drain(s, 1)
        assert e.value.code == 40228
    with pytest.raises(OperationFailure) as e:
        coll.watch([{"$replaceRoot": {"newRoot": "$x", "extra": 1}}])
    assert e.value.code == 40415


def test_get_more_max_time_ms_only_on_await_cursors(db):
    db.gm.insert_many([{"_id": i} for i in range(5)])
    r = db.command({"find": "gm", "batchSize": 2})
    with pytest.raises(OperationFailure) as e:
        db.command({"getMore": r["cursor"]["id"], "collection": "gm", "maxTimeMS": 1000})
    assert e.value.code == 2
    assert "non-awaitData" in str(e.value)
    # On a change stream it is the await time: an empty batch after ~it.
    r = db.command({"aggregate": "gm", "pipeline": [{"$changeStream": {}}], "cursor": {}})
    t0 = time.time()
    more = db.command({"getMore": r["cursor"]["id"], "collection": "gm", "maxTimeMS": 300})
    assert more["cursor"]["nextBatch"] == []
    assert time.time() - t0 >= 0.25


def test_full_document_before_change_without_pre_images(db):
    """A collection without changeStreamPreAndPostImages records no
    pre-images: whenAvailable reports null, and required fails on the first
    update/replace/delete event with NoMatchingDocument (47), as MongoDB's;
    inserts pass."""
    coll = db.pre
    coll.insert_one({"_id": 0})
    with coll.watch(full_document_before_change="whenAvailable", max_await_time_ms=200) as s:
        coll.update_one({"_id": 0}, {"$set": {"a": 1}})
        e = drain(s, 1)[0]
        assert "fullDocumentBeforeChange" in e and e["fullDocumentBeforeChange"] is None
    with coll.watch(full_document_before_change="required", max_await_time_ms=200) as s:
        coll.insert_one({"_id": 1})
        assert drain(s, 1)[0]["operationType"] == "insert"
        coll.delete_one({"_id": 1})
        with pytest.raises(OperationFailure) as e:
            drain(s, 1)
        assert e.value.code == 47


def pre_image_events(stream, n):
    return [(e["operationType"], e.get("fullDocumentBeforeChange", "absent"))
            for e in drain(stream, n)]


def test_pre_and_post_images(db):
    """changeStreamPreAndPostImages (create option and collMod, reported by
    listCollections as MongoDB does): update, replace and delete events
    carry the version they changed; inserts have none; fullDocument
    whenAvailable/required carry the version an update wrote."""
    db.create_collection("pi", changeStreamPreAndPostImages={"enabled": True})
    info = next(db.list_collections(filter={"name": "pi"}))
    assert info["options"] == {"changeStreamPreAndPostImages": {"enabled": True}}
    coll = db.pi
    with coll.watch(full_document_before_change="required", full_document="required",
                    max_await_time_ms=200) as s:
        coll.insert_one({"_id": 1, "v": 1})
        coll.update_one({"_id": 1}, {"$inc": {"v": 1}})
        coll.replace_one({"_id": 1}, {"w": 1})
        coll.delete_one({"_id": 1})
        ev = drain(s, 4)
    assert [(e["operationType"], e.get("fullDocumentBeforeChange", "absent")) for e in ev] == [
        ("insert", "absent"),
        ("update", {"_id": 1, "v": 1}),
        ("replace", {"_id": 1, "v": 2}),
        ("delete", {"_id": 1, "w": 1}),
    ]
    assert ev[1]["fullDocument"] == {"_id": 1, "v": 2}
    # collMod turns it off: whenAvailable reports null from then on, and an
    # existing collection can be turned on by collMod too.
    db.command("collMod", "pi", changeStreamPreAndPostImages={"enabled": False})
    info = next(db.list_collections(filter={"name": "pi"}))
    assert info["options"] == {}
    db.plain.insert_one({"_id": 5, "v": 5})
    with db.watch(full_document_before_change="whenAvailable", max_await_time_ms=200) as s:
        coll.insert_one({"_id": 2})
        coll.delete_one({"_id": 2})
        db.command("collMod", "plain", changeStreamPreAndPostImages={"enabled": True})
        db.plain.update_one({"_id": 5}, {"$set": {"v": 6}})
        assert pre_image_events(s, 3) == [
            ("insert", "absent"), ("delete", None), ("update", {"_id": 5, "v": 5})]
    # Creating it again: the same options succeed, other options are 48.
    db.create_collection("plain", changeStreamPreAndPostImages={"enabled": True},
                         check_exists=False)
    with pytest.raises(OperationFailure) as e:
        db.create_collection("plain", check_exists=False)
    assert e.value.code == 48
    for bad, code in [(1, 14), ({}, 40414), ({"enabled": 1}, 14),
                      ({"enabled": True, "x": 1}, 40415)]:
        with pytest.raises(OperationFailure) as e:
            db.command("collMod", "plain", changeStreamPreAndPostImages=bad)
        assert e.value.code == code, bad


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_pre_images_survive_a_restart(make_server, sig):
    """Pre-images are in the WAL effects: a stream resumed after a restart
    (SIGKILL included) still gets them, and the option itself survives."""
    srv = make_server()
    c = srv.client()
    c.d.create_collection("p", changeStreamPreAndPostImages={"enabled": True})
    coll = c.d.p
    with coll.watch(max_await_time_ms=200) as s:
        coll.insert_one({"_id": 1, "v": 1})
        token = drain(s, 1)[0]["_id"]
    coll.update_one({"_id": 1}, {"$set": {"v": 2}})
    coll.delete_one({"_id": 1})
    c.close()
    srv.stop(sig)
    srv2 = make_server()
    c2 = srv2.client()
    info = next(c2.d.list_collections(filter={"name": "p"}))
    assert info["options"] == {"changeStreamPreAndPostImages": {"enabled": True}}
    with c2.d.p.watch(resume_after=token, full_document_before_change="required",
                      max_await_time_ms=200) as r:
        c2.d.p.insert_one({"_id": 2, "v": 7})
        c2.d.p.replace_one({"_id": 2}, {"v": 8})
        assert pre_image_events(r, 4) == [
            ("update", {"_id": 1, "v": 1}), ("delete", {"_id": 1, "v": 2}),
            ("insert", "absent"), ("replace", {"_id": 2, "v": 7})]
    c2.close()


def test_resume_past_retention_is_history_lost_286(make_server, tmp_path):
    """Item 6 end to end: with tiny segments, frequent checkpoints and no
    retained history, the segment holding a token expires; after a restart
    (the in-memory tail no longer holds it) resumeAfter that token and
    startAtOperationTime before it fail with ChangeStreamHistoryLost (286),
    never skip silently."""
    flags = ("--wal-segment-mb", "0.01", "--checkpoint-wal-mb", "0.02",
             "--change-retention-mb", "0")
    srv = make_server(*flags)
    c = srv.client()
    coll = c.d.h
    with coll.watch(max_await_time_ms=200) as s:
        coll.insert_one({"_id": 0})
        first = drain(s, 1)[0]
    token, at = first["_id"], first["clusterTime"]
    first_segment = tmp_path / "data" / "d" / ("wal-%020d.log" % 1)
    deadline = time.time() + 30
    i = 1
    while first_segment.exists():
        assert time.time() < deadline, "the token's segment never expired"
        coll.insert_many([{"_id": i + k, "pad": "x" * 500} for k in range(50)])
        i += 50
        time.sleep(0.3)
    c.close()
    srv.stop()
    srv = make_server(*flags)
    c = srv.client()
    coll = c.d.h
    with pytest.raises(OperationFailure) as e:
        coll.watch(resume_after=token)
    assert e.value.code == 286, e.value.details
    assert e.value.details.get("codeName") == "ChangeStreamHistoryLost"
    with pytest.raises(OperationFailure) as e:
        coll.watch(start_at_operation_time=at)
    assert e.value.code == 286
    # A stream from now still works.
    with coll.watch(max_await_time_ms=200) as s:
        coll.insert_one({"_id": "late"})
        assert drain(s, 1)[0]["documentKey"] == {"_id": "late"}
    c.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_drop_database_events_survive_a_restart(make_server, sig):
    """The dropped database's WAL is gone, but the data directory's drop
    log keeps its events: a database stream resumed after a restart from a
    token before the drop gets drop, dropDatabase and invalidate, in order;
    a collection stream drop and invalidate."""
    srv = make_server()
    c = srv.client()
    with c.gone.watch(max_await_time_ms=200) as s:
        c.gone.a.insert_one({"_id": 1})
        c.gone.b.insert_one({"_id": 2})
        token = drain(s, 2)[-1]["_id"]
    c.drop_database("gone")
    c.close()
    srv.stop(sig)
    srv2 = make_server()
    c2 = srv2.client()
    with c2.gone.watch(resume_after=token, max_await_time_ms=200) as r:
        ev = drain(r, 4)
    assert [(e["operationType"], e["ns"].get("coll")) if "ns" in e else e["operationType"]
            for e in ev] == [("drop", "a"), ("drop", "b"), ("dropDatabase", None), "invalidate"]
    with c2.gone.b.watch(resume_after=token, max_await_time_ms=200) as r:
        assert [e["operationType"] for e in drain(r, 2)] == ["drop", "invalidate"]
    c2.close()
