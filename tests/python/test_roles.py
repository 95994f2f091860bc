"""Roles enforced per command (issue #15 item 3) through pymongo: built-in
roles allow or refuse (13 Unauthorized) find/insert/drop/createUser/
serverStatus/listDatabases as MongoDB's do, listDatabases shows only the
databases a user has privileges on, cursors belong to their user, a
connection authenticates as one user, the users collection is out of reach of
ordinary CRUD, and dropping the users logs everyone out."""

import pytest
from bson.int64 import Int64
from pymongo.errors import OperationFailure

from test_auth import authed, create_first_user

MECH = "SCRAM-SHA-256"

# role, the database it is granted on, and what the user may do:
# find, insert, drop (a collection of app), createUser (in app),
# serverStatus, and the databases listDatabases shows (None: all).
MATRIX = [
    ("read", "app", dict(find=True, insert=False, drop=False, createUser=False, serverStatus=False, dbs=["app"])),
    ("readWrite", "app", dict(find=True, insert=True, drop=True, createUser=False, serverStatus=False, dbs=["app"])),
    ("dbAdmin", "app", dict(find=False, insert=False, drop=True, createUser=False, serverStatus=False, dbs=["app"])),
    ("userAdmin", "app", dict(find=False, insert=False, drop=False, createUser=True, serverStatus=False, dbs=["app"])),
    ("dbOwner", "app", dict(find=True, insert=True, drop=True, createUser=True, serverStatus=False, dbs=["app"])),
    ("clusterMonitor", "admin", dict(find=False, insert=False, drop=False, createUser=False, serverStatus=True, dbs=None)),
    ("readAnyDatabase", "admin", dict(find=True, insert=False, drop=False, createUser=False, serverStatus=False, dbs=None)),
    ("readWriteAnyDatabase", "admin", dict(find=True, insert=True, drop=True, createUser=False, serverStatus=False, dbs=None)),
    ("userAdminAnyDatabase", "admin", dict(find=False, insert=False, drop=False, createUser=True, serverStatus=False, dbs=None)),
    ("backup", "admin", dict(find=True, insert=False, drop=False, createUser=False, serverStatus=True, dbs=None)),
    ("root", "admin", dict(find=True, insert=True, drop=True, createUser=True, serverStatus=True, dbs=None)),
]


def allowed(fn):
    """True when fn() runs, False on 13 Unauthorized (anything else fails)."""
    try:
        fn()
        return True
    except OperationFailure as e:
        assert e.code == 13, e
        assert str(e).startswith("not authorized on "), e
        return False


@pytest.fixture
def srv(make_server):
    s = make_server("--auth")
    create_first_user(s)
    root = authed(s, "root", "s3cret", MECH)
    root.app.c.insert_many([{"_id": i} for i in range(5)])
    root.other.c.insert_one({"_id": 1})
    yield s
    root.close()


def test_built_in_roles(srv):
    root = authed(srv, "root", "s3cret", MECH)
    for i, (role, db, _) in enumerate(MATRIX):
        root[db].command("createUser", f"u{i}", pwd="pw", roles=[role], mechanisms=[MECH])
        root.app[f"d{i}"].insert_one({})
    all_dbs = sorted(root.list_database_names())
    assert all_dbs == ["admin", "app", "local", "other"]  # local: the oplog view
    for i, (role, db, want) in enumerate(MATRIX):
        c = authed(srv, f"u{i}", "pw", MECH, source=db)
        got = dict(
            # batch_size 2: the cursor's getMores are the user's own.
            find=allowed(lambda: list(c.app.c.find(batch_size=2))),
            insert=allowed(lambda: c.app.c.insert_one({"by": role})),
            drop=allowed(lambda: c.app.drop_collection(f"d{i}")),
            createUser=allowed(lambda: c.app.command(
                "createUser", f"made{i}", pwd="pw", roles=["read"], mechanisms=[MECH])),
            serverStatus=allowed(lambda: c.admin.command("serverStatus")),
            dbs=sorted(c.list_database_names()),
        )
        want = dict(want, dbs=all_dbs if want["dbs"] is None else want["dbs"])
        assert got == want, f"{role}@{db}"
        if role == "read":
            with pytest.raises(OperationFailure) as e:
                c.app.c.insert_one({})
            assert str(e.value).startswith('not authorized on app to execute command { insert: "c"')
            # Listing every database needs the listDatabases action.
            with pytest.raises(OperationFailure) as e:
                c.admin.command("listDatabases", authorizedDatabases=False)
            assert e.value.code == 13
        c.close()
    root.close()


def test_get_more_of_another_users_cursor_is_refused(srv):
    root = authed(srv, "root", "s3cret", MECH)
    for name in ("ann", "bob"):
        root.app.command("createUser", name, pwd="pw", roles=["read"], mechanisms=[MECH])
    ann = authed(srv, "ann", "pw", MECH, source="app")
    bob = authed(srv, "bob", "pw", MECH, source="app")
    with ann.start_session() as s:
        cursor_id = ann.app.command("find", "c", batchSize=1, session=s)["cursor"]["id"]
        assert cursor_id != 0
        with pytest.raises(OperationFailure) as e:
            bob.app.command("getMore", Int64(cursor_id), collection="c")
        assert e.value.code == 13
        assert "not created by the authenticated user" in str(e.value)
        killed = bob.app.command("killCursors", "c", cursors=[Int64(cursor_id)])
        assert killed["cursorsNotFound"] == [cursor_id]
        # The owner's cursor lives on: bob's attempts touched nothing.
        more = ann.app.command("getMore", Int64(cursor_id), collection="c", session=s)
        assert [d["_id"] for d in more["cursor"]["nextBatch"]] == [1, 2, 3, 4]
    ann.close()
    bob.close()
    root.close()


def test_one_user_per_connection(srv):
    root = authed(srv, "root", "s3cret", MECH)
    root.app.command("createUser", "ann", pwd="pw", roles=["read"], mechanisms=[MECH])
    root.close()
    ann = authed(srv, "ann", "pw", MECH, source="app", maxPoolSize=1)
    first = b"n,,n=root,r=abcdefghijklmnopqrstuvwx"
    with pytest.raises(OperationFailure) as e:
        ann.admin.command("saslStart", mechanism=MECH, payload=first)
    assert e.value.code == 5626701
    assert "Previously authenticated as: ann@app" in str(e.value)
    with pytest.raises(OperationFailure) as e:
        ann.app.command("saslStart", mechanism=MECH, payload=b"n,,n=bob,r=abcdefghijklmnopqrstuvwx")
    assert e.value.code == 5626702
    # Still ann.
    st = ann.admin.command("connectionStatus", showPrivileges=True)["authInfo"]
    assert st["authenticatedUsers"] == [{"user": "ann", "db": "app"}]
    assert st["authenticatedUserPrivileges"][0]["resource"] == {"db": "app", "collection": ""}
    assert "find" in st["authenticatedUserPrivileges"][0]["actions"]
    ann.close()


def test_users_collection_is_out_of_reach_of_crud(srv):
    root = authed(srv, "root", "s3cret", MECH)
    root.admin.command("createUser", "rw", pwd="pw", roles=["readWriteAnyDatabase"], mechanisms=[MECH])
    root.admin.command("createUser", "ua", pwd="pw", roles=["userAdminAnyDatabase"], mechanisms=[MECH])
    rw = authed(srv, "rw", "pw", MECH)
    users = rw.admin["duet.users"]
    for op in (lambda: users.find_one(), lambda: users.insert_one({"_id": "admin.evil"}),
               lambda: users.update_one({}, {"$set": {"roles": []}}), lambda: users.drop()):
        with pytest.raises(OperationFailure) as e:
            op()
        assert e.value.code == 13
    # rw can use other collections of admin.
    rw.admin.notes.insert_one({"x": 1})
    ua = authed(srv, "ua", "pw", MECH)
    assert ua.admin["duet.users"].count_documents({}) == 3
    with pytest.raises(OperationFailure) as e:
        ua.admin["duet.users"].insert_one({"_id": "admin.evil"})
    assert e.value.code == 13
    assert root.admin["duet.users"].find_one({"_id": "admin.rw"})["user"] == "rw"
    for c in (rw, ua, root):
        c.close()


def test_dropping_admin_logs_everyone_out(srv):
    root = authed(srv, "root", "s3cret", MECH)
    root.admin.command("createUser", "dba", pwd="pw", roles=["dbAdminAnyDatabase"], mechanisms=[MECH])
    dba = authed(srv, "dba", "pw", MECH, maxPoolSize=1)
    with pytest.raises(OperationFailure) as e:
        dba.drop_database("admin")
    assert e.value.code == 13
    dba.drop_database("other")
    root.drop_database("admin")
    with pytest.raises(OperationFailure) as e:
        dba.app.command("dbStats")
    assert e.value.code == 13 and "requires authentication" in str(e.value)
    # No user is left: the localhost exception applies again.
    anon = srv.client()
    anon.admin.command("createUser", "root2", pwd="pw", roles=["root"], mechanisms=[MECH])
    anon.close()
    dba.close()
    root.close()


def test_transactions_are_checked_per_command(srv):
    root = authed(srv, "root", "s3cret", MECH)
    root.app.command("createUser", "ann", pwd="pw", roles=["readWrite"], mechanisms=[MECH])
    root.app.command("createUser", "reader", pwd="pw", roles=["read"], mechanisms=[MECH])
    ann = authed(srv, "ann", "pw", MECH, source="app")
    with ann.start_session() as s:
        s.with_transaction(lambda s: ann.app.c.insert_one({"_id": 100}, session=s))
    assert root.app.c.find_one({"_id": 100}) == {"_id": 100}
    reader = authed(srv, "reader", "pw", MECH, source="app")
    with reader.start_session() as s:
        s.start_transaction()
        assert reader.app.c.find_one({"_id": 100}, session=s) == {"_id": 100}
        with pytest.raises(OperationFailure) as e:
            reader.app.c.insert_one({"_id": 101}, session=s)
        assert e.value.code == 13
    assert root.app.c.find_one({"_id": 101}) is None
    for c in (ann, reader, root):
        c.close()
