#!/usr/bin/env bash
# Many clients in one process (issue 27): what `udp_client -P N` costs next
# to iperf3's `-P N`, run in the same invocation on loopback; then
# `-P 1000` alone (iperf3 caps -P at 128) against absolute goals.
#
#   bash bench/many-clients.sh            # from the repo root
#
# Knobs (environment):
#   REPS        interleaved runs of the -P 100 pair; medians reported (default 3)
#   SECS        seconds per run                                        (default 4)
#   SERVER_BUF  udp_server --recv-buffer-size for -P 100                (default 8M)
#   SERVER_BUF_1000  ... for -P 1000: 1 Gbit/s of 1000-byte datagrams
#               fill 8 MB in about 60 ms of a starved server thread   (default 32M)
#   IPERF3      iperf3 binary                                          (default iperf3)
#   NETSPEED_BIN_DIR  where udp_server and udp_client are (default: build target/release)
#
# The cases:
#   pair   udp_client -P 100 --rate 10Mbit -b 1000 --duration 4s, against
#          iperf3 -c -u -P 100 -b 10M -l 1000 -t 4 (server: iperf3 -s -1)
#   alone  udp_client -P 1000 --rate 1Mbit -b 1000 --duration 4s
#
# Goals (pass/fail printed): -P 100: loss <= 0.05 %, client max RSS <= 50 MB,
# client CPU <= 1.2 x iperf3's client CPU; -P 1000: every client answered,
# loss <= 0.1 %, RSS <= 200 MB.
#
# CPU and memory are never taken from either tool's own report: every
# process is a child of this script; the kernel's rusage given to wait4
# supplies user + system seconds of the whole process, and its peak RSS is
# /proc/PID/status's VmHWM, read every 10 ms until it exits (ru_maxrss
# would count this script's Python, which a child holds until its exec). Loss is each tool's receiver count against its sender count.
# Only 127.0.0.1 is used; every process is killed after a deadline.
set -euo pipefail

REPS=${REPS:-3}
SECS=${SECS:-4}
SERVER_BUF=${SERVER_BUF:-8M}
SERVER_BUF_1000=${SERVER_BUF_1000:-32M}
IPERF3=${IPERF3:-iperf3}

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
log() { printf '[many-clients] %s\n' "$*" >&2; }

need_iperf3
netspeed_bins
export NETSPEED_BIN_DIR IPERF3 REPS SECS SERVER_BUF SERVER_BUF_1000
log "iperf3: $("$IPERF3" --version | head -1)"

exec python3 - <<'PYEOF'
import json, os, statistics, sys
sys.path.insert(0, "bench")
from lib import HOST, TICK, Proc, free_port, iperf3_version, wait_listening

BIN = os.environ["NETSPEED_BIN_DIR"]
IPERF3 = os.environ["IPERF3"]
REPS = int(os.environ["REPS"])
SECS = int(os.environ["SECS"])
SERVER_BUF = os.environ["SERVER_BUF"]
SERVER_BUF_1000 = os.environ["SERVER_BUF_1000"]

def log(*a):
    print("[many-clients]", *a, file=sys.stderr, flush=True)

def host_busy():
    """CPU-seconds the whole host has been busy (not idle), from /proc/stat."""
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    idle = f[3] + f[4]  # idle, iowait
    return (sum(f[:8]) - idle) / TICK

def run_iperf3(clients, rate):
    port = free_port()
    srv = Proc([IPERF3, "-s", "-1", "-B", HOST, "-p", str(port)], SECS + 30)
    wait_listening(srv, port)
    busy = host_busy()
    cli = Proc([IPERF3, "-c", HOST, "-p", str(port), "-u", "-P", str(clients), "-b", rate,
                "-l", "1000", "-t", str(SECS), "-J"], SECS + 30).finish()
    rc, cpu, rss, scpu = cli.rc, cli.cpu, cli.peak_mb, srv.finish().cpu
    others = max(0.0, host_busy() - busy - cpu - scpu)
    d = json.loads(cli.out)
    if "error" in d:
        raise RuntimeError("iperf3: " + d["error"])
    s = d["end"]["sum"]
    sent = int(s["packets"])
    lost = int(s["lost_packets"])
    answered = sum(1 for st in d["end"]["streams"] if st.get("udp", {}).get("packets") is not None)
    return dict(sent=sent, lost=lost, loss=100.0 * lost / sent if sent else 0.0, cpu=cpu, rss=rss,
                answered=answered, clients=clients, rc=rc, others=others)

def run_netspeed(clients, rate, server_buf=SERVER_BUF):
    srv = Proc([f"{BIN}/udp_server", "--listen", f"{HOST}:0", "--recv-buffer-size", server_buf,
                "--json", "--interval", "0"], SECS + 90)
    addr = json.loads(srv.first_line())["addr"]
    busy = host_busy()
    cli = Proc([f"{BIN}/udp_client", "-s", addr, "-P", str(clients), "--rate", rate, "-b", "1000",
                "--duration", f"{SECS}s", "--json", "--quiet"], SECS + 60).finish()
    rc, cpu, rss, scpu = cli.rc, cli.cpu, cli.peak_mb, srv.finish(stop=True).cpu
    others = max(0.0, host_busy() - busy - cpu - scpu)
    if rc not in (0, 3):
        raise RuntimeError(f"udp_client exit {rc}: {cli.err.strip()[:300]}")
    d = json.loads(cli.out)
    sent = d["sent_packets"]
    lost = (d.get("server") or {}).get("lost_packets", sent)
    behind = max((c.get("pacing") or {}).get("behind_seconds", 0.0) for c in d["clients"])
    drops = ((d.get("server") or {}).get("socket_kernel_drops")
             or (d.get("server") or {}).get("kernel_drops") or 0)
    return dict(sent=sent, lost=lost, loss=100.0 * lost / sent if sent else 0.0, cpu=cpu, rss=rss,
                answered=d["clients_answered"], clients=clients, rc=rc, behind=behind,
                others=others, drops=drops)

def med(runs, key):
    return statistics.median(r[key] for r in runs)

def verdict(ok):
    return "**pass**" if ok else "**FAIL**"

version = iperf3_version(IPERF3)
print("## Many clients in one process (bench/many-clients.sh)\n")
print(f"iperf3: `{version}`; `udp_server --recv-buffer-size {SERVER_BUF}` ({SERVER_BUF_1000} for -P 1000); {REPS} interleaved runs "
      f"of {SECS} s, medians; CPU = user + system of the client process (rusage at exit), "
      f"RSS = its peak resident set (VmHWM). {os.cpu_count()} CPUs.\n")

pair = {"netspeed": [], "iperf3": []}
for rep in range(REPS):
    order = [("netspeed", run_netspeed), ("iperf3", run_iperf3)]
    if rep % 2:
        order.reverse()
    for name, fn in order:
        log(f"rep {rep + 1}: {name} -P 100 at 10 Mbit/s each")
        r = fn(100, "10M" if name == "iperf3" else "10Mbit")
        pair[name].append(r)
        print(f"<!-- raw {name} P100 rep {rep + 1}: sent {r['sent']} lost {r['lost']} answered "
              f"{r['answered']} cpu {r['cpu']:.2f}s rss {r['rss']:.1f}MB rc {r['rc']} "
              f"other load {r['others']:.1f} CPU-s -->")

ns, ip = pair["netspeed"], pair["iperf3"]
target = 100 * 10e6 / 8000 * SECS
print("\n### -P 100 at 10 Mbit/s each, 1000-byte datagrams\n")
print("| | netspeed | iperf3 | ratio | goal | |")
print("|---|---:|---:|---:|---|---|")
cpu_ratio = med(ns, "cpu") / med(ip, "cpu")
rss_ratio = med(ns, "rss") / med(ip, "rss")
print(f"| client CPU-s | {med(ns, 'cpu'):.2f} | {med(ip, 'cpu'):.2f} | {cpu_ratio:.2f}× | ≤ 1.2× iperf3 | {verdict(cpu_ratio <= 1.2)} |")
print(f"| client max RSS, MB | {med(ns, 'rss'):.1f} | {med(ip, 'rss'):.1f} | {rss_ratio:.2f}× | ≤ 50 MB | {verdict(med(ns, 'rss') <= 50)} |")
print(f"| loss | {med(ns, 'loss'):.4f} % | {med(ip, 'loss'):.4f} % | | ≤ 0.05 % | {verdict(med(ns, 'loss') <= 0.05)} |")
print(f"| datagrams sent (of {target:,.0f}) | {med(ns, 'sent'):,.0f} | {med(ip, 'sent'):,.0f} | | | |")
print(f"| clients answered | {min(r['answered'] for r in ns)}/100 | {min(r['answered'] for r in ip)}/100 | | | |")
print(f"| CPU-s per 10⁶ datagrams | {med(ns, 'cpu') / med(ns, 'sent') * 1e6:.2f} | {med(ip, 'cpu') / med(ip, 'sent') * 1e6:.2f} | | | |")

alone = []
for rep in range(REPS):
    log(f"rep {rep + 1}: netspeed -P 1000 at 1 Mbit/s each")
    r = run_netspeed(1000, "1Mbit", SERVER_BUF_1000)
    alone.append(r)
    print(f"<!-- raw netspeed P1000 rep {rep + 1}: sent {r['sent']} lost {r['lost']} answered "
          f"{r['answered']} cpu {r['cpu']:.2f}s rss {r['rss']:.1f}MB rc {r['rc']} behind {r['behind']:.3f}s "
          f"server socket drops {r['drops']} other load {r['others']:.1f} CPU-s -->")
target = 1000 * 1e6 / 8000 * SECS
print(f"\n### -P 1000 at 1 Mbit/s each (netspeed alone: iperf3 caps -P at 128; server buffer {SERVER_BUF_1000})\n")
print("| | netspeed (median) | worst run | goal | |")
print("|---|---:|---:|---|---|")
every = all(r["answered"] == 1000 for r in alone)
print(f"| clients answered | {med(alone, 'answered'):.0f}/1000 | {min(r['answered'] for r in alone)}/1000 | all | {verdict(every)} |")
print(f"| loss | {med(alone, 'loss'):.4f} % | {max(r['loss'] for r in alone):.4f} % | ≤ 0.1 % | {verdict(med(alone, 'loss') <= 0.1)} |")
print(f"| client max RSS, MB | {med(alone, 'rss'):.1f} | {max(r['rss'] for r in alone):.1f} | ≤ 200 MB | {verdict(med(alone, 'rss') <= 200)} |")
print(f"| client CPU-s | {med(alone, 'cpu'):.2f} | {max(r['cpu'] for r in alone):.2f} | | |")
print(f"| datagrams sent (of {target:,.0f}) | {med(alone, 'sent'):,.0f} | {min(r['sent'] for r in alone):,} | | |")

runs = ns + ip + alone
print(f"\nOther load on the host while the runs ran (busy CPU-s from /proc/stat less both ends' "
      f"rusage, a rough figure: clock ticks against microseconds): "
      f"median {statistics.median(r['others'] for r in runs):.1f}, most {max(r['others'] for r in runs):.1f} "
      f"over runs of about {SECS + 1} s; above about 1 CPU-s, something else competed for the "
      f"{os.cpu_count()} CPUs and the senders fall behind (`datagrams sent`).")
PYEOF
