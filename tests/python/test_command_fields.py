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
        # aggregate's cursor has its own deserializer (parseAggregateCursorFromBSON).
        ({"aggregate": "c", "pipeline": [], "cursor": 1},
         "cursor field must be missing or an object"),
        ({"aggregate": "c", "pipeline": [], "cursor": None},
         "cursor field must be missing or an object"),
        ({"listCollections": 1, "cursor": 1},
         "BSON field 'listCollections.cursor' is the wrong type 'int', expected type 'object'"),
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
    `$project` names the stage (code kept; where a projection value may be
    an expression, MongoDB's projection parser answers 31325), a rename of a
    missing source collection says MongoDB's words."""
    setup(db)
    with pytest.raises(OperationFailure) as e:
        list(db.c.aggregate([{"$project": {"x": {"$add": [{"$foo": 1}]}}}]))
    assert (e.value.code, e.value.details["errmsg"]) == (
        168, "Invalid $project :: caused by :: Unrecognized expression '$foo'")
    with pytest.raises(OperationFailure) as e:
        list(db.c.aggregate([{"$project": {"x": {"$foo": 1}}}]))
    assert (e.value.code, e.value.details["errmsg"]) == (
        31325, "Invalid $project :: caused by :: Unknown expression $foo")
    with pytest.raises(OperationFailure) as e:
        client.admin.command({"renameCollection": f"{db.name}.nope", "to": f"{db.name}.x"})
    assert (e.value.code, e.value.details["errmsg"]) == (
        26, f"Source collection {db.name}.nope does not exist")


# ---------------------------------------------------------------- repeated fields

def raw(*pairs):
    """A document with its fields as given: repeated names kept (BSON allows them)."""
    import struct
    import bson
    from bson.raw_bson import RawBSONDocument
    body = b"".join(bson.encode({k: v})[4:-1] for k, v in pairs)
    return RawBSONDocument(struct.pack("<i", len(body) + 5) + body + b"\x00")


def send(server, db, *pairs):
    """Send the command `pairs` (with `$db`) byte for byte; the reply."""
    import wire
    s = wire.connect(server.port)
    try:
        return wire.command(s, raw(*pairs, ("$db", db.name)))
    finally:
        s.close()


def refused(reply, code, msg):
    assert (reply["ok"], reply["code"], reply["errmsg"]) == (0.0, code, msg), reply


def test_a_command_field_sent_twice_is_40413(server, db):
    setup(db)
    r = send(server, db, ("find", "c"), ("filter", {}), ("filter", {"a": 1}))
    refused(r, 40413, "BSON field 'find.filter' is a duplicate field")
    assert r["codeName"] == "Location40413"
    refused(send(server, db, ("aggregate", "c"), ("pipeline", []), ("cursor", {}),
                 ("pipeline", [{"$match": {}}])),
            40413, "BSON field 'aggregate.pipeline' is a duplicate field")
    # Before the command runs: nothing was written.
    refused(send(server, db, ("insert", "c"), ("documents", [{"_id": 9}]), ("ordered", True),
                 ("ordered", False)),
            40413, "BSON field 'insert.ordered' is a duplicate field")
    assert db.c.count_documents({}) == 3
    # Inside explain's command, and in an update statement (body or sequence).
    refused(send(server, db, ("explain", raw(("count", "c"), ("query", {}), ("query", {}))),
                 ("verbosity", "queryPlanner")),
            40413, "BSON field 'count.query' is a duplicate field")
    refused(send(server, db, ("update", "c"),
                 ("updates", [raw(("q", {}), ("u", {"$set": {"b": 1}}), ("multi", True),
                                  ("multi", False))])),
            40413, "BSON field 'update.updates.multi' is a duplicate field")
    assert db.c.count_documents({"b": 1}) == 0


def test_duplicates_follow_mongodb_order_of_checks(server, db):
    setup(db)
    # The first offending field in document order decides.
    refused(send(server, db, ("find", "c"), ("frob", 1), ("limit", 1), ("limit", 2)),
            40415, "BSON field 'find.frob' is an unknown field.")
    refused(send(server, db, ("find", "c"), ("limit", 1), ("limit", 2), ("frob", 1)),
            40413, "BSON field 'find.limit' is a duplicate field")
    # A typed field's type is checked before the repeat; a null one is skipped.
    refused(send(server, db, ("find", "c"), ("limit", 1), ("limit", "x")),
            14, "BSON field 'find.limit' is the wrong type 'string', "
                "expected types '[long, int, decimal, double]'")
    r = send(server, db, ("find", "c"), ("filter", {"a": 1}), ("filter", None))
    assert r["ok"] == 1.0, r
    # Generic arguments are not the command's own: no duplicate check.
    r = send(server, db, ("find", "c"), ("comment", "x"), ("comment", "y"))
    assert r["ok"] == 1.0, r
    # Repeated names inside a filter are conditions, not duplicate fields.
    r = send(server, db, ("find", "c"), ("filter", raw(("a", {"$gte": 1}), ("a", {"$lt": 2}))))
    assert [d["_id"] for d in r["cursor"]["firstBatch"]] == [1]


def test_statement_fields_twice_in_a_document_sequence(server, db):
    import wire
    setup(db)
    s = wire.connect(server.port)
    try:
        r = wire.command(s, {"delete": "c", "$db": db.name},
                         sequences=[("deletes", [raw(("q", {}), ("limit", 0), ("limit", 1))])])
    finally:
        s.close()
    refused(r, 40413, "BSON field 'delete.deletes.limit' is a duplicate field")
    assert db.c.count_documents({}) == 3


# ---------------------------------------------------------------- cursor options

def test_cursor_options_are_parsed_strictly(db):
    setup(db)
    cases = [
        ({"aggregate": "c", "pipeline": [], "cursor": {"batchsize": 1}},
         40415, "BSON field 'cursor.batchsize' is an unknown field."),
        ({"aggregate": "c", "pipeline": [], "cursor": {"batchSize": "1"}},
         14, "BSON field 'cursor.batchSize' is the wrong type 'string', "
             "expected types '[long, int, decimal, double]'"),
        ({"aggregate": "c", "pipeline": [], "cursor": {"batchSize": -1}},
         51024, "BSON field 'cursor.batchSize' value must be >= 0, actual value '-1'"),
        ({"listCollections": 1, "cursor": {"foo": 1}},
         40415, "BSON field 'listCollections.cursor.foo' is an unknown field."),
        ({"listIndexes": "c", "cursor": {"batchSize": -2}},
         51024, "BSON field 'listIndexes.cursor.batchSize' value must be >= 0, "
                "actual value '-2'"),
        ({"listIndexes": "c", "cursor": {"batchSize": True}},
         14, "BSON field 'listIndexes.cursor.batchSize' is the wrong type 'bool', "
             "expected types '[long, int, decimal, double]'"),
        # find has no cursor sub-document at all.
        ({"find": "c", "cursor": {}}, 40415, "BSON field 'find.cursor' is an unknown field."),
    ]
    for cmd, code, msg in cases:
        with pytest.raises(OperationFailure) as e:
            db.command(cmd)
        assert (e.value.code, e.value.details["errmsg"]) == (code, msg), cmd
    # The cursor option is checked where it stands: before a later unknown field.
    with pytest.raises(OperationFailure) as e:
        db.command(SON([("aggregate", "c"), ("pipeline", []), ("cursor", {"x": 1}), ("y", 1)]))
    assert e.value.details["errmsg"] == "BSON field 'cursor.x' is an unknown field."
    # Valid ones work: a number of any numeric type, null as absent.
    for bs in (2, Int64(2), 2.0, None):
        r = db.command({"aggregate": "c", "pipeline": [], "cursor": {"batchSize": bs}})
        assert r["ok"] == 1.0
    assert db.command({"listCollections": 1, "cursor": {"batchSize": 1}})["ok"] == 1.0
    assert db.command({"listIndexes": "c", "cursor": {"batchSize": 0}})["ok"] == 1.0


def test_cursor_option_twice_is_40413(server, db):
    setup(db)
    refused(send(server, db, ("aggregate", "c"), ("pipeline", []),
                 ("cursor", raw(("batchSize", 1), ("batchSize", 2)))),
            40413, "BSON field 'cursor.batchSize' is a duplicate field")
    refused(send(server, db, ("aggregate", "c"), ("pipeline", []), ("cursor", {}), ("cursor", {})),
            40413, "BSON field 'aggregate.cursor' is a duplicate field")
    refused(send(server, db, ("listCollections", 1),
                 ("cursor", raw(("batchSize", 1), ("batchSize", 2)))),
            40413, "BSON field 'listCollections.cursor.batchSize' is a duplicate field")


def test_write_concern_field_twice_is_40413(server, db):
    setup(db)
    refused(send(server, db, ("insert", "c"), ("documents", [{"_id": 9}]),
                 ("writeConcern", raw(("w", 1), ("w", "majority")))),
            40413, "BSON field 'WriteConcernOptions.w' is a duplicate field")
    assert db.c.count_documents({}) == 3
    r = send(server, db, ("insert", "c"), ("documents", [{"_id": 9}]),
             ("writeConcern", raw(("w", 1), ("j", True))))
    assert r["ok"] == 1.0 and r["n"] == 1, r


def test_read_concern_or_collation_field_twice_is_40413(server, db):
    """readConcern and collation are parsed by their own IDL structs: a name
    sent twice inside them is 40413 under their context names, for any command
    and inside an update statement; nothing is written."""
    setup(db)
    refused(send(server, db, ("find", "c"),
                 ("readConcern", raw(("level", "local"), ("level", "snapshot")))),
            40413, "BSON field 'readConcern.level' is a duplicate field")
    refused(send(server, db, ("count", "c"),
                 ("collation", raw(("locale", "en"), ("strength", 1), ("locale", "fr")))),
            40413, "BSON field 'collation.locale' is a duplicate field")
    refused(send(server, db, ("update", "c"),
                 ("updates", [raw(("q", {}), ("u", {"$set": {"z": 1}}), ("multi", True),
                                  ("collation", raw(("locale", "en"), ("locale", "en"))))])),
            40413, "BSON field 'collation.locale' is a duplicate field")
    assert db.c.count_documents({"z": 1}) == 0
    r = send(server, db, ("find", "c"), ("collation", raw(("locale", "en"), ("strength", 2))))
    assert r["ok"] == 1.0, r
