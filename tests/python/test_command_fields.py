"""Commands parsed strictly, as MongoDB's IDL parsers do (#17 item 7): a
field that is neither the command's own nor a generic argument is 40415
IDLUnknownField, `BSON field '<command>.<field>' is an unknown field.`; a
known field of the wrong type is 14 TypeMismatch; each command with only
known fields (its own and the generic ones drivers add) works.

The field lists are MongoDB 7.0's (find_command.idl, aggregate_command.idl,
write_ops.idl, …); the table lives in crates/duet-server/src/commands/fields.rs.
"""

import pytest
from bson import Int64, SON
from pymongo.errors import OperationFailure


def setup(db):
    db.c.insert_many([{"_id": i, "a": i} for i in range(3)])
    db.c.create_index("a", name="a_1")


# (command document with only known fields, the command's IDL name). Each is
# sent as is (it must work) and with an unknown field (it must be 40415).
CASES = [
    (SON([("find", "c"), ("filter", {"a": 1}), ("projection", {"a": 1}), ("sort", {"a": 1}),
          ("skip", 0), ("limit", 5), ("batchSize", 2), ("singleBatch", False),
          ("allowDiskUse", True), ("hint", {"a": 1}), ("let", {"x": 1})]), "find"),
    (SON([("aggregate", "c"), ("pipeline", [{"$match": {}}]), ("cursor", {}),
          ("allowDiskUse", False), ("let", {})]), "aggregate"),
    (SON([("count", "c"), ("query", {"a": {"$gte": 0}}), ("limit", 2), ("skip", 0)]), "count"),
    (SON([("distinct", "c"), ("key", "a"), ("query", {})]), "distinct"),
    (SON([("insert", "c"), ("documents", [{"_id": 10}]), ("ordered", True),
          ("bypassDocumentValidation", False)]), "insert"),
    (SON([("update", "c"), ("updates", [{"q": {"_id": 1}, "u": {"$set": {"b": 1}},
                                         "upsert": False, "multi": False}]),
          ("ordered", True), ("let", {})]), "update"),
    (SON([("delete", "c"), ("deletes", [{"q": {"_id": 2}, "limit": 1}]),
          ("ordered", False)]), "delete"),
    (SON([("findAndModify", "c"), ("query", {"_id": 0}), ("update", {"$inc": {"a": 1}}),
          ("new", True), ("fields", {"a": 1}), ("sort", {"_id": 1})]), "findAndModify"),
    (SON([("createIndexes", "c"), ("indexes", [{"key": {"b": 1}, "name": "b_1"}]),
          ("commitQuorum", "votingMembers")]), "createIndexes"),
    (SON([("listIndexes", "c"), ("cursor", {})]), "listIndexes"),
    (SON([("dropIndexes", "c"), ("index", "a_1")]), "dropIndexes"),
    (SON([("listCollections", 1), ("filter", {}), ("nameOnly", True),
          ("authorizedCollections", False), ("cursor", {})]), "listCollections"),
    (SON([("create", "made"), ("capped", False)]), "create"),
    (SON([("collMod", "c"), ("validationLevel", "moderate")]), "collMod"),
    (SON([("drop", "c")]), "drop"),
    (SON([("explain", {"find": "c", "filter": {}}), ("verbosity", "queryPlanner")]), "explain"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[1] for c in CASES])
def test_known_fields_work_and_an_unknown_field_is_40415(db, case):
    setup(db)
    cmd, name = case
    bad = SON(list(cmd.items()) + [("frobnicate", 1)])
    with pytest.raises(OperationFailure) as e:
        db.command(bad)
    assert e.value.code == 40415
    assert e.value.details["codeName"] == "IDLUnknownField"
    assert e.value.details["errmsg"] == f"BSON field '{name}.frobnicate' is an unknown field."
    # Nothing ran: the refused command changed nothing.
    assert db.c.count_documents({}) == 3
    # The generic fields drivers add are accepted beside the command's own.
    good = SON(list(cmd.items()) + [("comment", "fields test"), ("maxTimeMS", 10000),
                                    ("$readPreference", {"mode": "primary"})])
    assert db.command(good)["ok"] == 1.0


def test_get_more_and_kill_cursors_fields(db):
    setup(db)
    cid = db.command({"find": "c", "batchSize": 1})["cursor"]["id"]
    with pytest.raises(OperationFailure) as e:
        db.command(SON([("getMore", Int64(cid)), ("collection", "c"), ("frobnicate", 1)]))
    assert (e.value.code, e.value.details["errmsg"]) == (
        40415, "BSON field 'getMore.frobnicate' is an unknown field.")
    r = db.command(SON([("getMore", Int64(cid)), ("collection", "c"), ("batchSize", 1)]))
    assert len(r["cursor"]["nextBatch"]) == 1
    with pytest.raises(OperationFailure) as e:
        db.command(SON([("killCursors", "c"), ("cursors", [Int64(cid)]), ("frobnicate", 1)]))
    assert (e.value.code, e.value.details["errmsg"]) == (
        40415, "BSON field 'killCursors.frobnicate' is an unknown field.")
    r = db.command(SON([("killCursors", "c"), ("cursors", [Int64(cid)])]))
    assert r["cursorsKilled"] == [cid]


def test_statements_are_parsed_strictly(db):
    setup(db)
    with pytest.raises(OperationFailure) as e:
        db.command({"update": "c", "updates": [{"q": {}, "u": {"$set": {"b": 1}}, "mutli": True}]})
    assert (e.value.code, e.value.details["errmsg"]) == (
        40415, "BSON field 'update.updates.mutli' is an unknown field.")
    with pytest.raises(OperationFailure) as e:
        db.command({"delete": "c", "deletes": [{"q": {}, "limit": 0, "justOne": True}]})
    assert (e.value.code, e.value.details["errmsg"]) == (
        40415, "BSON field 'delete.deletes.justOne' is an unknown field.")
    assert db.c.count_documents({"b": 1}) == 0 and db.c.count_documents({}) == 3


def test_wrong_types_of_known_fields_are_14(db):
    setup(db)
    wrong = [
        ({"find": "c", "limit": "x"},
         "BSON field 'find.limit' is the wrong type 'string', "
         "expected types '[long, int, decimal, double]'"),
        ({"find": "c", "filter": 1},
         "BSON field 'find.filter' is the wrong type 'int', expected type 'object'"),
        ({"aggregate": "c", "pipeline": [], "cursor": 1},
         "BSON field 'aggregate.cursor' is the wrong type 'int', expected type 'object'"),
        ({"distinct": "c", "key": 1},
         "BSON field 'distinct.key' is the wrong type 'int', expected type 'string'"),
        ({"count": "c", "skip": "1"},
         "BSON field 'count.skip' is the wrong type 'string', "
         "expected types '[long, int, decimal, double]'"),
        ({"killCursors": "c", "cursors": 5},
         "BSON field 'killCursors.cursors' is the wrong type 'int', expected type 'array'"),
        ({"find": "c", "allowDiskUse": 1},
         "BSON field 'find.allowDiskUse' is the wrong type 'int', expected type 'bool'"),
    ]
    for cmd, msg in wrong:
        with pytest.raises(OperationFailure) as e:
            db.command(cmd)
        assert (e.value.code, e.value.details["codeName"], e.value.details["errmsg"]) == (
            14, "TypeMismatch", msg), cmd
    assert db.c.count_documents({}) == 3


def test_unknown_fields_inside_a_transaction_and_an_alias(client, db):
    setup(db)
    with pytest.raises(OperationFailure) as e:
        db.command({"findandmodify": "c", "query": {}, "remove": True, "frobnicate": 1})
    assert e.value.details["errmsg"] == "BSON field 'findAndModify.frobnicate' is an unknown field."
    with client.start_session() as s:
        s.start_transaction()
        db.c.insert_one({"_id": 50}, session=s)
        with pytest.raises(OperationFailure) as e:
            db.command({"find": "c", "frobnicate": 1}, session=s)
        assert e.value.code == 40415
        s.abort_transaction()
    assert db.c.count_documents({"_id": 50}) == 0


def test_duet_extensions_and_commands_without_lists_are_unaffected(db):
    setup(db)
    r = db.command({"find": "c", "$duet": {"snapshot": "vls"}})
    assert len(r["cursor"]["firstBatch"]) == 3
    assert db.command({"count": "c", "$duet": {"snapshot": "cow"}})["n"] == 3
    # Commands parsed by their handlers alone keep their own rules.
    assert db.command({"ping": 1})["ok"] == 1.0


def test_probe_answers_in_mongodb_words(client, db):
    """Two differences errs_probe.py showed: an unknown expression in
    `$project` names the stage (code kept), a rename of a missing source
    collection says MongoDB's words."""
    setup(db)
    with pytest.raises(OperationFailure) as e:
        list(db.c.aggregate([{"$project": {"x": {"$foo": 1}}}]))
    assert (e.value.code, e.value.details["errmsg"]) == (
        168, "Invalid $project :: caused by :: Unrecognized expression '$foo'")
    with pytest.raises(OperationFailure) as e:
        client.admin.command({"renameCollection": f"{db.name}.nope", "to": f"{db.name}.x"})
    assert (e.value.code, e.value.details["errmsg"]) == (
        26, f"Source collection {db.name}.nope does not exist")
