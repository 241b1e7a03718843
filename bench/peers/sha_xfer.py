#!/usr/bin/env python3
"""Moves BYTES each way over one TCP connection at once and reports the
sha256 of what each side sent and received, for bench/proxy-bench.sh.

  sha_xfer.py server BYTES        listens on 127.0.0.1:0, prints "port N",
                                  serves one connection, prints JSON
  sha_xfer.py client ADDR BYTES   connects to HOST:PORT, prints JSON

Each side sends its own pseudo-random stream, then shuts down writing
(half-close) while it keeps reading to EOF, so a proxy must pass the EOF
on in both directions for both sides to finish.
"""
import hashlib
import json
import random
import socket
import struct
import sys
import threading
import time

CHUNK = 1 << 20


def sender(sock, seed, total, out):
    block = bytearray(random.Random(seed).randbytes(CHUNK))
    h = hashlib.sha256()
    sent, i = 0, 0
    while sent < total:
        struct.pack_into("<Q", block, 0, i)
        n = min(CHUNK, total - sent)
        view = memoryview(block)[:n]
        h.update(view)
        sock.sendall(view)
        sent += n
        i += 1
    sock.shutdown(socket.SHUT_WR)
    out["sent_bytes"] = sent
    out["sent_sha256"] = h.hexdigest()


def receiver(sock, out):
    h = hashlib.sha256()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    total = 0
    while True:
        n = sock.recv_into(buf)
        if n == 0:
            break
        h.update(view[:n])
        total += n
    out["recv_bytes"] = total
    out["recv_sha256"] = h.hexdigest()


def both_ways(sock, seed, total):
    sock.settimeout(120)
    out = {}
    start = time.monotonic()
    r = threading.Thread(target=receiver, args=(sock, out))
    r.start()
    sender(sock, seed, total, out)
    r.join()
    out["seconds"] = round(time.monotonic() - start, 3)
    return out


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "server":
        total = int(sys.argv[2])
        ls = socket.socket()
        ls.bind(("127.0.0.1", 0))
        ls.listen(1)
        ls.settimeout(60)
        print("port", ls.getsockname()[1], flush=True)
        conn, _ = ls.accept()
        print(json.dumps(both_ways(conn, 2, total)), flush=True)
    elif len(sys.argv) == 4 and sys.argv[1] == "client":
        host, port = sys.argv[2].rsplit(":", 1)
        total = int(sys.argv[3])
        sock = socket.create_connection((host, int(port)), timeout=10)
        print(json.dumps(both_ways(sock, 1, total)), flush=True)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
