#!/usr/bin/env python3
"""tcp_proxy's default (splice, pipes growing to 1 MiB, --pipe-budget
256 MiB) with many connections open, for bench/proxy-cost.sh (part
"pipes"; it was the ignored test default_splice_with_4000_connections in
tests/proxy_resources.rs):

  splice_pipes.py TCP_PROXY N BUSY

- N connections (or as many as the hard RLIMIT_NOFILE allows: six fds
  each in the proxy) opened through the proxy to an upstream here that
  holds them: the proxy's RSS and the machine's MemAvailable per idle
  connection;
- then BUSY of them stalled both ways after a burst (each end writes until
  its socket would block, nobody reads): the same per busy connection;
- then all closed: the sizes the splice pipes reached, from the proxy's
  conn_closed events, and whether a growth was refused.

The proxy gets soft = hard RLIMIT_NOFILE and --max-conns 8192. MemAvailable
is the whole machine's: it moves with everything else running. Exits 1 if a
pipe grew above 1 MiB or the pipes held more than N x 128 KiB + 256 MiB.
"""
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time

WAIT = 30


def kib_field(text, key):
    for line in text.splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    raise KeyError(key)


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        return kib_field(f.read(), "VmRSS:") * 1024


def mem_available():
    with open("/proc/meminfo") as f:
        return kib_field(f.read(), "MemAvailable:") * 1024


def stall_both_ways(socks):
    """Fills every socket until a write would block, a few times over (the
    proxy may not have moved the bytes on yet when the first pass stops)."""
    chunk = b"b" * 65536
    for s in socks:
        s.setblocking(False)
    for _ in range(4):
        for s in socks:
            for _ in range(512):
                try:
                    s.send(chunk)
                except (BlockingIOError, OSError):
                    break
        time.sleep(0.1)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    binary, want, busy = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    n = min(want, (hard - 256) // 6) if hard != resource.RLIM_INFINITY else want
    busy = min(busy, n)
    if n < want:
        print(f"RLIMIT_NOFILE hard {hard}: {n} connections, not {want:,} (6 fds each in the proxy)")

    # The upstream: accepts and holds every connection.
    up = socket.socket()
    up.bind(("127.0.0.1", 0))
    up.listen(4096)
    held, lock = [], threading.Lock()

    def accept():
        while True:
            try:
                c, _ = up.accept()
            except OSError:
                return
            with lock:
                held.append(c)

    threading.Thread(target=accept, daemon=True).start()

    events = tempfile.TemporaryFile(mode="w+")
    proxy = subprocess.Popen(
        [binary, "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:%d" % up.getsockname()[1],
         "--json", "--max-conns", "8192"],
        stdout=events, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        addr = None
        deadline = time.time() + WAIT
        while addr is None and time.time() < deadline:
            events.seek(0)
            for line in events:
                if '"listening"' in line:
                    host, port = json.loads(line)["addr"].rsplit(":", 1)
                    addr = (host, int(port))
            time.sleep(0.05)
        if addr is None:
            sys.exit("tcp_proxy did not say it was listening")
        time.sleep(0.3)
        rss0, avail0 = rss(proxy.pid), mem_available()

        clients = [socket.create_connection(addr, WAIT) for _ in range(n)]
        deadline = time.time() + WAIT
        while len(held) < n and time.time() < deadline:
            time.sleep(0.05)
        if len(held) < n:
            print(f"only {len(held)} of {n} connections reached the upstream in {WAIT} s")
        time.sleep(0.3)
        rss1, avail1 = rss(proxy.pid), mem_available()

        stall_both_ways(clients[:busy])
        with lock:
            stall_both_ways(held[:busy])
        time.sleep(0.3)
        rss2, avail2 = rss(proxy.pid), mem_available()

        # Close everything and read the pipe sizes the connections reached.
        # Which upstream socket belongs to which client does not matter.
        for s in clients:
            s.close()
        with lock:
            for s in held:
                s.close()
        sizes, closed, refused = [], 0, False
        deadline = time.time() + WAIT
        while closed < n and time.time() < deadline:
            time.sleep(0.2)
            events.seek(0)
            sizes, closed = [], 0
            for line in events:
                try:
                    v = json.loads(line)
                except ValueError:
                    continue
                if v.get("event") == "conn_closed":
                    closed += 1
                    for key in ("pipe_client_to_upstream", "pipe_upstream_to_client"):
                        sizes.append(v.get(key) or 0)
                elif v.get("event") == "pipe_growth_refused":
                    refused = True
    finally:
        proxy.terminate()
        try:
            proxy.wait(10)
        except subprocess.TimeoutExpired:
            proxy.kill()
            proxy.wait()

    def kib(b, k):
        return b / k / 1024 if k else 0.0

    grown = sum(1 for s in sizes if s > 64 << 10)
    biggest = max(sizes, default=0)
    total = sum(sizes)
    print(f"{n} idle connections: proxy RSS +{kib(max(rss1 - rss0, 0), n):.1f} KiB each, "
          f"MemAvailable -{kib(max(avail0 - avail1, 0), n):.1f} KiB each")
    print(f"{busy} of them stalled both ways after a burst: proxy RSS +{kib(max(rss2 - rss1, 0), busy):.1f} KiB each, "
          f"MemAvailable -{kib(max(avail1 - avail2, 0), busy):.1f} KiB each")
    print(f"pipes: {grown} of {len(sizes)} grew past 64 KiB, the largest {biggest} B, "
          f"{total / (1 << 20):.1f} MiB in all; a refused growth: {str(refused).lower()}; "
          f"{closed} of {n} conn_closed events seen")
    ok = biggest <= 1 << 20 and total <= n * (128 << 10) + (256 << 20)
    if not ok:
        print(f"BAD: a pipe above 1 MiB ({biggest}) or pipes above N x 128 KiB + --pipe-budget ({total})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
