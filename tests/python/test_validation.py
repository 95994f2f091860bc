"""Collection validation (issue #18 item 7): validator with $jsonSchema,
query operators and $expr; validationLevel/validationAction; code 121 with
errInfo; bypassDocumentValidation; collMod; listCollections; restart."""

import signal

import pytest
from pymongo.errors import OperationFailure, WriteError, BulkWriteError

SCHEMA = {"$jsonSchema": {
    "bsonType": "object",
    "required": ["name"],
    "properties": {"name": {"bsonType": "string"}, "age": {"bsonType": "int", "minimum": 0}},
}}


def test_json_schema_insert_and_err_info(db):
    db.create_collection("people", validator=SCHEMA)
    db.people.insert_one({"_id": 1, "name": "ann", "age": 3})
    with pytest.raises(WriteError) as e:
        db.people.insert_one({"_id": 2, "age": -1})
    assert e.value.code == 121
    info = e.value.details["errInfo"]
    assert info["failingDocumentId"] == 2
    assert info["details"]["operatorName"] == "$jsonSchema"
    ops = [r["operatorName"] for r in info["details"]["schemaRulesNotSatisfied"]]
    assert ops == ["required", "properties"]
    assert db.people.count_documents({}) == 1


def test_query_operators_expr_and_updates(db):
    db.create_collection("c", validator={"a": {"$gte": 0}, "$expr": {"$lte": ["$a", "$max"]}})
    db.c.insert_one({"_id": 1, "a": 1, "max": 5})
    with pytest.raises(WriteError) as e:
        db.c.insert_one({"_id": 2, "a": 9, "max": 5})
    assert e.value.code == 121
    with pytest.raises(WriteError) as e:
        db.c.update_one({"_id": 1}, {"$set": {"a": -1}})
    assert e.value.code == 121
    with pytest.raises(WriteError):
        db.c.update_one({"_id": 3}, {"$set": {"a": -1}}, upsert=True)
    with pytest.raises(OperationFailure) as e:
        db.c.find_one_and_update({"_id": 1}, {"$set": {"a": 99}})
    assert e.value.code == 121
    assert db.c.find_one({"_id": 1})["a"] == 1
    # Unordered batch: the valid ones go in.
    with pytest.raises(BulkWriteError) as e:
        db.c.insert_many([{"_id": 10, "a": 1, "max": 1}, {"_id": 11, "a": -5, "max": 1},
                          {"_id": 12, "a": 0, "max": 1}], ordered=False)
    assert [w["code"] for w in e.value.details["writeErrors"]] == [121]
    assert db.c.count_documents({}) == 3


def test_bypass(db):
    db.create_collection("c", validator={"a": {"$type": "int"}})
    db.c.insert_one({"_id": 1, "a": "x"}, bypass_document_validation=True)
    db.c.update_one({"_id": 1}, {"$set": {"b": 1}}, bypass_document_validation=True)
    db.command("findAndModify", "c", query={"_id": 1}, update={"$set": {"b": 2}},
               bypassDocumentValidation=True)
    with pytest.raises(OperationFailure) as e:
        db.command("findAndModify", "c", query={"_id": 1}, update={"$set": {"b": 3}})
    assert e.value.code == 121
    with pytest.raises(WriteError):
        db.c.insert_one({"_id": 2, "a": "x"})


def test_levels_actions_and_coll_mod(db):
    db.create_collection("c")
    db.c.insert_many([{"_id": 1, "a": -1}, {"_id": 2, "a": 1}])
    db.command("collMod", "c", validator={"a": {"$gte": 0}}, validationLevel="moderate")
    # Moderate: a document that already fails may be updated; a valid one not broken.
    db.c.update_one({"_id": 1}, {"$set": {"a": -2}})
    with pytest.raises(WriteError):
        db.c.update_one({"_id": 2}, {"$set": {"a": -2}})
    db.command("collMod", "c", validationLevel="strict")
    with pytest.raises(WriteError):
        db.c.update_one({"_id": 1}, {"$set": {"a": -3}})
    db.command("collMod", "c", validationAction="warn")
    db.c.insert_one({"_id": 3, "a": -9})
    db.command("collMod", "c", validationAction="error", validationLevel="off")
    db.c.insert_one({"_id": 4, "a": -9})
    info = db.command("listCollections", filter={"name": "c"})["cursor"]["firstBatch"][0]
    assert info["options"] == {"validator": {"a": {"$gte": 0}}, "validationLevel": "off",
                               "validationAction": "error"}


def test_bad_options_refused(db):
    with pytest.raises(OperationFailure) as e:
        db.create_collection("c", validationLevel="loose")
    assert e.value.code == 2
    with pytest.raises(OperationFailure):
        db.create_collection("c", validator={"a": {"$nope": 1}})
    assert "c" not in db.list_collection_names()
    with pytest.raises(OperationFailure) as e:
        db.command("collMod", "missing", validator={"a": 1})
    assert e.value.code == 26
    db.create_collection("d", validator={"a": 1})
    with pytest.raises(OperationFailure) as e:
        db.command("create", "d", validator={"a": 2})
    db.command("create", "d", validator={"a": 1})
    assert e.value.code == 48


def test_validator_survives_restart(make_server):
    srv = make_server()
    c = srv.client()
    c.v.create_collection("c", validator=SCHEMA, validationAction="error")
    c.v.command("collMod", "c", validationLevel="moderate")
    c.close()
    # Killed: the WAL carries the options.
    srv.stop(sig=signal.SIGKILL)
    expected = {"validator": SCHEMA, "validationAction": "error", "validationLevel": "moderate"}
    for sig in (signal.SIGTERM, signal.SIGTERM):
        srv = make_server()
        c = srv.client()
        info = c.v.command("listCollections")["cursor"]["firstBatch"][0]
        assert info["options"] == expected
        with pytest.raises(WriteError):
            c.v.c.insert_one({"age": 1})
        c.admin.command("fsync")
        c.close()
        assert srv.stop(sig=sig) == 0


def test_defaults_shown_beside_a_validator(db):
    # As MongoDB: with a validator, listCollections shows the level and
    # action it applies.
    db.create_collection("c", validator={"a": {"$type": "int"}})
    info = db.command("listCollections", filter={"name": "c"})["cursor"]["firstBatch"][0]
    assert info["options"] == {"validator": {"a": {"$type": "int"}},
                               "validationLevel": "strict", "validationAction": "error"}
    # Creating it again with the same validator is fine (the defaults are implied).
    db.command("create", "c", validator={"a": {"$type": "int"}})
    # Pre-images and validation share the options document.
    db.command("collMod", "c", changeStreamPreAndPostImages={"enabled": True})
    info = db.command("listCollections", filter={"name": "c"})["cursor"]["firstBatch"][0]
    assert info["options"]["changeStreamPreAndPostImages"] == {"enabled": True}
    assert info["options"]["validationLevel"] == "strict"


def test_validation_inside_transactions(db):
    db.create_collection("c", validator={"a": {"$gte": 0}})
    db.c.insert_one({"_id": 1, "a": 1})
    with db.client.start_session() as s:
        s.start_transaction()
        db.c.insert_one({"_id": 2, "a": 2}, session=s)
        for bad in (lambda: db.c.insert_one({"_id": 3, "a": -1}, session=s),
                    lambda: db.c.update_one({"_id": 1}, {"$set": {"a": -1}}, session=s)):
            with pytest.raises(WriteError) as e:
                bad()
            assert e.value.code == 121
            assert e.value.details["errInfo"]["details"]["operatorName"] == "$gte"
            # As MongoDB, a write error aborts the transaction.
            with pytest.raises(OperationFailure) as e:
                s.commit_transaction()
            assert e.value.code == 251
            s.start_transaction()
        with pytest.raises(OperationFailure) as e:
            db.c.find_one_and_update({"_id": 1}, {"$set": {"a": -5}}, session=s)
        assert e.value.code == 121
        s.abort_transaction()
        # Valid writes, and bypassDocumentValidation, commit.
        s.start_transaction()
        db.c.insert_one({"_id": 4, "a": 4}, session=s)
        db.c.insert_one({"_id": 5, "a": -5}, session=s, bypass_document_validation=True)
        db.c.update_one({"_id": 1}, {"$set": {"a": -1}}, session=s,
                        bypass_document_validation=True)
        s.commit_transaction()
    assert sorted((d["_id"], d["a"]) for d in db.c.find()) == [(1, -1), (4, 4), (5, -5)]


def test_bypass_needs_its_action_under_auth(make_server):
    from test_auth import authed, create_first_user
    mech = "SCRAM-SHA-256"
    srv = make_server("--auth")
    create_first_user(srv)
    root = authed(srv, "root", "s3cret", mech)
    root.app.create_collection("c", validator={"a": {"$type": "int"}})
    root.app.command("createUser", "rw", pwd="pw", roles=["readWrite"], mechanisms=[mech])
    root.app.command("createUser", "own", pwd="pw", roles=["dbOwner"], mechanisms=[mech])
    rw = authed(srv, "rw", "pw", mech, source="app")
    rw.app.c.insert_one({"_id": 1, "a": 1})
    for bypassing in (
            lambda: rw.app.c.insert_one({"_id": 2, "a": "x"}, bypass_document_validation=True),
            lambda: rw.app.c.update_one({"_id": 1}, {"$set": {"a": "x"}},
                                        bypass_document_validation=True),
            lambda: rw.app.command("findAndModify", "c", query={"_id": 1},
                                   update={"$set": {"a": "x"}}, bypassDocumentValidation=True)):
        with pytest.raises(OperationFailure) as e:
            bypassing()
        assert e.value.code == 13
    # bypassDocumentValidation: false asks for nothing more.
    rw.app.c.insert_one({"_id": 3, "a": 3}, bypass_document_validation=False)
    # dbOwner includes dbAdmin, which has the action (as MongoDB).
    own = authed(srv, "own", "pw", mech, source="app")
    own.app.c.insert_one({"_id": 2, "a": "x"}, bypass_document_validation=True)
    assert root.app.c.count_documents({}) == 3
    for c in (rw, own, root):
        c.close()
