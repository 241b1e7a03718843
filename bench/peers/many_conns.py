#!/usr/bin/env python3
"""1000 concurrent connections through a proxy, and the proxy's open-fd
count before, at the peak and after they close, for bench/proxy-bench.sh.

  many_conns.py echo                   echo server on 127.0.0.1:0, prints "port N"
  many_conns.py clients ADDR N PID     N connections to HOST:PORT at once;
                                       counts /proc/PID/fd; prints JSON
"""
import asyncio
import json
import os
import sys
import time


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


async def echo_server():
    async def handle(reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            writer.write_eof()
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096)
    print("port", server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


async def clients(addr, n, pid):
    host, port = addr.rsplit(":", 1)
    baseline = fds(pid)
    start = time.monotonic()

    async def one(i):
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 30)
        msg = f"conn {i}\n".encode()
        writer.write(msg)
        await writer.drain()
        got = await asyncio.wait_for(reader.readexactly(len(msg)), 30)
        assert got == msg, (got, msg)
        return reader, writer

    conns = await asyncio.gather(*(one(i) for i in range(n)))
    opened = time.monotonic() - start
    peak = fds(pid)
    for reader, writer in conns:
        writer.close()
    for reader, writer in conns:
        try:
            await writer.wait_closed()
        except OSError:
            pass
    deadline = time.monotonic() + 30
    after = fds(pid)
    while after > baseline and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        after = fds(pid)
    print(json.dumps({
        "connections": n,
        "all_open_and_echoed_seconds": round(opened, 3),
        "fds_baseline": baseline,
        "fds_peak": peak,
        "fds_after": after,
        "back_to_baseline": after == baseline,
    }), flush=True)
    return after == baseline


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "echo":
        asyncio.run(echo_server())
    elif len(sys.argv) == 5 and sys.argv[1] == "clients":
        ok = asyncio.run(clients(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
        sys.exit(0 if ok else 1)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
