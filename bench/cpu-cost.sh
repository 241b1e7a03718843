#!/usr/bin/env bash
# What the meter costs: CPU of netspeed and iperf3, both ends, at the same
# paced rates on loopback; and many paced clients against one server, with
# the loss each saw.
#
#   bash bench/cpu-cost.sh            # from the repo root
#
# Knobs (environment):
#   CASES    "SIZE:RATE ..."  paced single-stream runs   (default "1400:10M 1400:100M 1400:1G 8972:1G")
#   MANY     "N:RATE ..."     N clients at RATE each, 1400 B (default "3:200M 8:100M"; "" for none)
#   REPS     interleaved runs per case; medians reported    (default 3)
#   SECS     seconds per run                                 (default 3)
#   IPERF3   iperf3 binary                                   (default iperf3)
#   BASELINE_BIN_DIR  udp_server and udp_client of an earlier build: each
#            single-stream case also runs them, interleaved, and a table
#            prints this build's CPU per GB against theirs (what a change
#            costs). Build one with `git worktree add /tmp/base REV` and
#            `cargo build --release` there.
#
# CPU is never taken from either tool's own report. Every process is a child
# of this script: when it has exited, its user and system time are read from
# /proc/PID/stat (before it is reaped, so all threads are included; clock
# ticks) and from the kernel's rusage given to wait4 (microseconds); the
# table uses rusage and the /proc figure is kept in the raw rows as a cross
# check. CPU-seconds per GB are over the payload the receiver got.
# Only 127.0.0.1 is used; every process is killed after a deadline.
set -euo pipefail

CASES=${CASES:-"1400:10M 1400:100M 1400:1G 8972:1G"}
MANY=${MANY-"3:200M 8:100M"}
REPS=${REPS:-3}
SECS=${SECS:-3}
IPERF3=${IPERF3:-iperf3}

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
log() { printf '[cpu-cost] %s\n' "$*" >&2; }

need_iperf3
netspeed_bins
BASELINE_BIN_DIR=${BASELINE_BIN_DIR:-}
export NETSPEED_BIN_DIR IPERF3 CASES MANY REPS SECS BASELINE_BIN_DIR
log "iperf3: $("$IPERF3" --version | head -1)"

exec python3 - <<'PYEOF'
import json, os, statistics, sys, time
sys.path.insert(0, "bench")
from lib import HOST, Proc, free_port, iperf3_version, wait_listening

BIN = os.environ["NETSPEED_BIN_DIR"]
BASE = os.environ.get("BASELINE_BIN_DIR", "")
IPERF3 = os.environ["IPERF3"]
REPS = int(os.environ["REPS"])
SECS = int(os.environ["SECS"])

def log(*a):
    print("[cpu-cost]", *a, file=sys.stderr, flush=True)

def run_iperf3(size, rate, streams=1):
    port = free_port()
    srv = Proc([IPERF3, "-s", "-1", "-B", HOST, "-p", str(port)], SECS + 30)
    wait_listening(srv, port)
    cli = Proc([IPERF3, "-c", HOST, "-p", str(port), "-u", "-b", rate, "-l", str(size),
                "-t", str(SECS), "-P", str(streams), "-J"], SECS + 30).finish()
    srv = srv.finish()
    ccpu, cproc, scpu, sproc = cli.cpu, cli.proc_cpu, srv.cpu, srv.proc_cpu
    d = json.loads(cli.out)
    if "error" in d:
        raise RuntimeError("iperf3: " + d["error"])
    r = d["end"]["sum_received"]
    return dict(bytes=int(r["bytes"]), loss=float(r.get("lost_percent", 0.0)),
                ccpu=ccpu, scpu=scpu, cproc=cproc, sproc=sproc, losses=None)

def run_netspeed(size, rate, clients=1, bin_dir=None):
    bin_dir = bin_dir or BIN
    srv = Proc([f"{bin_dir}/udp_server", "--listen", f"{HOST}:0", "--json", "--interval", "0"], SECS + 60)
    addr = json.loads(srv.first_line())["addr"]
    procs = [Proc([f"{bin_dir}/udp_client", "-s", addr, "-b", str(size), "--rate", rate,
                   "--duration", f"{SECS}s", "--json", "--quiet"], SECS + 30)
             for _ in range(clients)]
    reports, ccpu, cproc = [], 0.0, 0.0
    for p in procs:
        c = p.finish()
        if c.rc != 0:
            raise RuntimeError(f"udp_client exit {c.rc}: {c.err.strip()[:200]}")
        reports.append(json.loads(c.out))
        ccpu += c.cpu; cproc += c.proc_cpu
    time.sleep(0.3)
    srv = srv.finish(stop=True)
    scpu, sproc = srv.cpu, srv.proc_cpu
    got = sum(r["server"]["received_bytes"] for r in reports)
    losses = [r["server"]["loss_percent"] for r in reports]
    sent = sum(r["sent_packets"] for r in reports)
    lost = sum(r["server"]["lost_packets"] for r in reports)
    return dict(bytes=got, loss=100.0 * lost / sent if sent else 0.0, ccpu=ccpu, scpu=scpu,
                cproc=cproc, sproc=sproc, losses=losses)

def per_gb(cpu, nbytes):
    return cpu / (nbytes / 1e9) if nbytes else float("nan")

def med(xs):
    return statistics.median(xs)

print("## CPU cost at paced rates (bench/cpu-cost.sh)\n")
print(f"iperf3: `{iperf3_version(IPERF3)}`; "
      f"{REPS} interleaved runs of {SECS} s per case, medians; CPU = user + system of each process "
      "(rusage at exit; /proc/PID/stat agrees to a clock tick).\n")

cases = [c.split(":") for c in os.environ["CASES"].split()]
results = {}
for rep in range(REPS):
    for size, rate in cases:
        order = [("iperf3", run_iperf3), ("netspeed", run_netspeed)]
        if BASE:
            order.append(("before", lambda size, rate: run_netspeed(size, rate, bin_dir=BASE)))
        if rep % 2:
            order.reverse()
        for name, fn in order:
            log(f"rep {rep + 1}: {name} {size} B at {rate}")
            r = fn(int(size), rate)
            results.setdefault((size, rate, name), []).append(r)
            print(f"<!-- raw {name} {size} {rate} rep {rep + 1}: bytes {r['bytes']} loss {r['loss']:.3f}% "
                  f"client {r['ccpu']:.3f}s (/proc {r['cproc']:.2f}) server {r['scpu']:.3f}s (/proc {r['sproc']:.2f}) -->")

print("\n| size | rate | side | netspeed CPU-s/GB | iperf3 CPU-s/GB | ratio | netspeed % core | iperf3 % core | loss netspeed / iperf3 |")
print("|---:|---:|---|---:|---:|---:|---:|---:|---|")
for size, rate in cases:
    ns, ip = results[(size, rate, "netspeed")], results[(size, rate, "iperf3")]
    for side, key in (("client", "ccpu"), ("server", "scpu")):
        a = med([per_gb(r[key], r["bytes"]) for r in ns])
        b = med([per_gb(r[key], r["bytes"]) for r in ip])
        pa = med([100 * r[key] / SECS for r in ns])
        pb = med([100 * r[key] / SECS for r in ip])
        loss = f"{med([r['loss'] for r in ns]):.3f}% / {med([r['loss'] for r in ip]):.3f}%"
        print(f"| {size} | {rate} | {side} | {a:.3f} | {b:.3f} | **{a / b:.2f}×** | {pa:.1f} | {pb:.1f} | {loss} |")

if BASE:
    print(f"\n### This build against the one in {BASE} (same cases, interleaved)\n")
    print("| size | rate | side | now CPU-s/GB | before CPU-s/GB | ratio now/before |")
    print("|---:|---:|---|---:|---:|---:|")
    for size, rate in cases:
        ns, old = results[(size, rate, "netspeed")], results[(size, rate, "before")]
        for side, key in (("client", "ccpu"), ("server", "scpu")):
            a = med([per_gb(r[key], r["bytes"]) for r in ns])
            b = med([per_gb(r[key], r["bytes"]) for r in old])
            print(f"| {size} | {rate} | {side} | {a:.3f} | {b:.3f} | **{a / b:.3f}×** |")

print("\n## Many paced clients, one server with defaults\n")
print("| clients × rate | netspeed loss per client (median run) | netspeed total loss | iperf3 `-P N` loss | netspeed client CPU-s / server CPU-s | iperf3 client / server |")
print("|---|---|---:|---:|---|---|")
for spec in os.environ["MANY"].split():
    n, rate = spec.split(":")
    n = int(n)
    runs_ns, runs_ip = [], []
    for rep in range(REPS):
        log(f"rep {rep + 1}: many {n} x {rate}")
        if rep % 2:
            runs_ip.append(run_iperf3(1400, rate, streams=n)); runs_ns.append(run_netspeed(1400, rate, clients=n))
        else:
            runs_ns.append(run_netspeed(1400, rate, clients=n)); runs_ip.append(run_iperf3(1400, rate, streams=n))
    mid = sorted(runs_ns, key=lambda r: r["loss"])[len(runs_ns) // 2]
    per = ", ".join(f"{x:.3f}%" for x in mid["losses"])
    print(f"| {n} × {rate} | {per} | {med([r['loss'] for r in runs_ns]):.3f}% | {med([r['loss'] for r in runs_ip]):.3f}% | "
          f"{med([r['ccpu'] for r in runs_ns]):.2f} / {med([r['scpu'] for r in runs_ns]):.2f} | "
          f"{med([r['ccpu'] for r in runs_ip]):.2f} / {med([r['scpu'] for r in runs_ip]):.2f} |")
    for i, r in enumerate(runs_ns):
        print(f"<!-- raw many {n}x{rate} netspeed rep {i + 1}: losses {r['losses']} -->")
PYEOF
