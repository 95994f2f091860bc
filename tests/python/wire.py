"""Raw wire-protocol helpers for tests that speak to the server byte by byte."""

import contextlib
import socket
import struct

import bson

OP_REPLY, OP_QUERY, OP_MSG = 1, 2004, 2013


def connect(port, timeout=5.0):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    return s


@contextlib.contextmanager
def connected(port, timeout=5.0):
    """A socket to the server on `port`, closed when the block ends."""
    s = connect(port, timeout)
    try:
        yield s
    finally:
        s.close()


def frame(op, payload, request_id=1):
    return struct.pack("<iiii", 16 + len(payload), request_id, 0, op) + payload


def op_msg(doc, flags=0, sequences=()):
    body = struct.pack("<I", flags) + b"\x00" + bson.encode(doc)
    for ident, docs in sequences:
        data = ident.encode() + b"\x00" + b"".join(bson.encode(d) for d in docs)
        body += b"\x01" + struct.pack("<i", 4 + len(data)) + data
    return frame(OP_MSG, body)


def op_query(ns, doc):
    payload = struct.pack("<i", 0) + ns.encode() + b"\x00" + struct.pack("<ii", 0, -1) + bson.encode(doc)
    return frame(OP_QUERY, payload)


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def read_reply(s):
    """Returns (op_code, raw body after the header)."""
    header = recv_exact(s, 16)
    length, _rid, _rto, op = struct.unpack("<iiii", header)
    return op, recv_exact(s, length - 16)


def msg_reply_doc(body):
    """The BSON bytes of an OP_MSG reply's kind-0 section."""
    assert body[4] == 0
    return body[5:]


def command(s, doc, **kw):
    """The reply, without the cluster-time gossip every reply carries
    (`operationTime`, `$clusterTime`), so tests can compare replies whole."""
    s.sendall(op_msg(doc, **kw))
    op, body = read_reply(s)
    assert op == OP_MSG
    reply = bson.decode(msg_reply_doc(body))
    reply.pop("operationTime", None)
    reply.pop("$clusterTime", None)
    return reply


def is_closed(s, timeout=5.0):
    """True when the server closes the connection (EOF or reset) within timeout."""
    s.settimeout(timeout)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def element_types(raw):
    """Top-level field name -> BSON type byte, for checking exact reply types."""
    sizes = {0x01: 8, 0x07: 12, 0x08: 1, 0x09: 8, 0x0A: 0, 0x10: 4, 0x11: 8, 0x12: 8, 0x13: 16}
    out = {}
    i = 4
    while raw[i] != 0:
        t = raw[i]
        end = raw.index(b"\x00", i + 1)
        name = raw[i + 1:end].decode()
        j = end + 1
        if t in sizes:
            j += sizes[t]
        elif t == 0x02:
            j += 4 + struct.unpack_from("<i", raw, j)[0]
        elif t in (0x03, 0x04):
            j += struct.unpack_from("<i", raw, j)[0]
        else:
            raise ValueError(f"type {t:#x} not handled")
        out[name] = t
        i = j
    return out
