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

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
log() { printf '[cpu-cost] %s\n' "$*" >&2; }

if ! command -v "$IPERF3" >/dev/null; then
    log "installing iperf3"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iperf3 >/dev/null
fi
if [[ -z ${NETSPEED_BIN_DIR:-} ]]; then
    log "building netspeed (cargo build --release)"
    cargo build --release --bins -q
    NETSPEED_BIN_DIR=target/release
fi
BASELINE_BIN_DIR=${BASELINE_BIN_DIR:-}
export NETSPEED_BIN_DIR IPERF3 CASES MANY REPS SECS BASELINE_BIN_DIR
log "iperf3: $("$IPERF3" --version | head -1)"

exec python3 - <<'PYEOF'
import json, os, signal, socket, statistics, subprocess, sys, tempfile, time

BIN = os.environ["NETSPEED_BIN_DIR"]
BASE = os.environ.get("BASELINE_BIN_DIR", "")
IPERF3 = os.environ["IPERF3"]
REPS = int(os.environ["REPS"])
SECS = int(os.environ["SECS"])
HOST = "127.0.0.1"
TICK = os.sysconf("SC_CLK_TCK")

def log(*a):
    print("[cpu-cost]", *a, file=sys.stderr, flush=True)

def rate_bps(text):
    units = {"K": 1e3, "M": 1e6, "G": 1e9}
    return float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)

class Proc:
    """A child process whose CPU is read when it has exited."""
    def __init__(self, cmd, deadline):
        self.cmd = cmd
        # Files, not pipes: a child never blocks on a full pipe.
        self.out = tempfile.TemporaryFile(mode="w+")
        self.err = tempfile.TemporaryFile(mode="w+")
        self.p = subprocess.Popen(cmd, stdout=self.out, stderr=self.err,
                                  stdin=subprocess.DEVNULL, text=True)
        self.deadline = time.time() + deadline

    def first_line(self, timeout=10):
        """The child's first line of output, once written."""
        end = time.time() + timeout
        while time.time() < end:
            self.out.seek(0)
            line = self.out.readline()
            if line.endswith("\n"):
                return line
            if self.p.poll() is not None:
                break
            time.sleep(0.01)
        raise RuntimeError(f"{self.cmd[0]} wrote no first line")

    def finish(self, stop=False):
        """Waits for exit (SIGTERM first if `stop`, SIGKILL at the
        deadline); returns (stdout, stderr, rc, cpu_rusage, cpu_proc)."""
        if stop:
            self.p.send_signal(signal.SIGTERM)
        out, err = "", ""
        while True:
            try:
                info = os.waitid(os.P_PID, self.p.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
            except ChildProcessError:
                info = None
            if info is not None:
                break
            if time.time() > self.deadline:
                self.p.kill()
            time.sleep(0.01)
        # Exited, not reaped: /proc still has the totals of every thread.
        try:
            f = open(f"/proc/{self.p.pid}/stat").read().rsplit(")", 1)[1].split()
            proc_cpu = (int(f[11]) + int(f[12])) / TICK
        except OSError:
            proc_cpu = float("nan")
        _, status, ru = os.wait4(self.p.pid, 0)
        self.p.returncode = os.waitstatus_to_exitcode(status)
        self.out.seek(0); self.err.seek(0)
        out, err = self.out.read(), self.err.read()
        return out, err, self.p.returncode, ru.ru_utime + ru.ru_stime, proc_cpu

def free_port():
    for _ in range(100):
        t = socket.socket(); t.bind((HOST, 0)); port = t.getsockname()[1]
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            u.bind((HOST, port)); return port
        except OSError:
            continue
        finally:
            u.close(); t.close()
    sys.exit("no free port")

def wait_listening(proc, port, udp):
    kind = socket.SOCK_DGRAM if udp else socket.SOCK_STREAM
    for _ in range(300):
        s = socket.socket(socket.AF_INET, kind)
        try:
            s.bind((HOST, port))
        except OSError:
            return  # taken: the server has it
        finally:
            s.close()
        if proc.p.poll() is not None:
            raise RuntimeError("server exited early")
        time.sleep(0.01)
    raise RuntimeError("server never bound its port")

def run_iperf3(size, rate, streams=1):
    port = free_port()
    srv = Proc([IPERF3, "-s", "-1", "-B", HOST, "-p", str(port)], SECS + 30)
    wait_listening(srv, port, udp=False)
    cli = Proc([IPERF3, "-c", HOST, "-p", str(port), "-u", "-b", rate, "-l", str(size),
                "-t", str(SECS), "-P", str(streams), "-J"], SECS + 30)
    out, err, rc, ccpu, cproc = cli.finish()
    _, _, _, scpu, sproc = srv.finish()
    d = json.loads(out)
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
        out, err, rc, cpu, pcpu = p.finish()
        if rc != 0:
            raise RuntimeError(f"udp_client exit {rc}: {err.strip()[:200]}")
        reports.append(json.loads(out))
        ccpu += cpu; cproc += pcpu
    time.sleep(0.3)
    _, _, _, scpu, sproc = srv.finish(stop=True)
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
print(f"iperf3: `{subprocess.run([IPERF3, '--version'], capture_output=True, text=True).stdout.splitlines()[0]}`; "
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
