#!/usr/bin/env bash
# Compare netspeed (udp_server/udp_client) with iperf3 over UDP on loopback.
#
#   bash bench/compare-iperf3.sh            # from the repo root
#
# Knobs (environment):
#   SIZES              UDP payload sizes in bytes      (default "64 1460 8972 65500")
#   REPS               runs per cell; median reported (default 3)
#   SECS               seconds per run                 (default 3)
#   IPERF3             iperf3 binary                   (default iperf3; installed with apt-get if missing)
#   NETSPEED_VARIANTS  "name[@size,size]:client flags[|server flags];..."
#                      (default "default: ;plain:--plain-send;mmsg:--no-gso")
#                      "default" is the row labelled plain `netspeed`: no flags,
#                      the fastest exact path; --plain-send is seed 001's.
#                      a variant with @sizes runs only at those sizes; each
#                      variant is its own row, e.g. netspeed[gso]; flags
#                      after "|" go to udp_server, e.g.
#                      "epoll: |--method epoll;threads2: |--threads 2"
#   REVERSE            1 (default) adds the download direction: "iperf3 -R"
#                      (iperf3 -u -b 0 -R) and "netspeed -R" (udp_client
#                      -R) rows, the server sending; ratios of -R rows are
#                      against "iperf3 -R". 0: upload rows only.
#   GSRO_SIZES         sizes for the extra "iperf3 --gsro" rows, only if this
#                      iperf3 knows --gsro             (default "64 1460")
#   CEILING            1 (default) adds a "ceiling" row per size: `sockbench
#                      ceiling`, the same path as netspeed's default with no
#                      accounting, and one core's memcpy rate; every row then
#                      also reads as a percentage of the ceiling. 0: no ceiling.
#
# Everything is measured on the RECEIVER: bytes/packets the server actually got,
# divided by the receiver's own measurement interval. Progress goes to stderr;
# stdout is a markdown report that can be pasted into docs/benchmarks.md.
# Only 127.0.0.1 is ever used. Every process started is bounded by `timeout`
# and killed on exit.
set -euo pipefail

SIZES=${SIZES:-"64 1460 8972 65500"}
REPS=${REPS:-3}
SECS=${SECS:-3}
IPERF3=${IPERF3:-iperf3}
NETSPEED_VARIANTS=${NETSPEED_VARIANTS:-"default: ;plain:--plain-send;mmsg:--no-gso"}
CEILING=${CEILING:-1}
GSRO_SIZES=${GSRO_SIZES:-"64 1460"}
REVERSE=${REVERSE:-1}
HOST=127.0.0.1

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# Overridable only to test this script against stand-ins (then no cargo build).
SERVER_BIN=${NETSPEED_SERVER_BIN:-target/release/udp_server}
CLIENT_BIN=${NETSPEED_CLIENT_BIN:-target/release/udp_client}
SOCKBENCH_BIN=${NETSPEED_SOCKBENCH_BIN:-target/release/sockbench}

log() { printf '[compare-iperf3] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The exact command line, with every knob spelled out, for the report.
shq() { printf "'%s'" "${1//\'/\'\\\'\'}"; }
CMDLINE="SIZES=$(shq "$SIZES") REPS=$REPS SECS=$SECS IPERF3=$(shq "$IPERF3")"
CMDLINE+=" NETSPEED_VARIANTS=$(shq "$NETSPEED_VARIANTS") CEILING=$CEILING REVERSE=$REVERSE bash bench/compare-iperf3.sh"

[[ $REPS =~ ^[1-9][0-9]*$ ]] || die "REPS must be a positive integer, got '$REPS'"
[[ $SECS =~ ^[1-9][0-9]*$ ]] || die "SECS must be a positive integer, got '$SECS'"
[[ $CEILING == 0 || $CEILING == 1 ]] || die "CEILING must be 0 or 1, got '$CEILING'"
[[ $REVERSE == 0 || $REVERSE == 1 ]] || die "REVERSE must be 0 or 1, got '$REVERSE'"
read -r -a SIZE_LIST <<<"$SIZES"
((${#SIZE_LIST[@]} > 0)) || die "SIZES is empty"
for s in "${SIZE_LIST[@]}"; do
    if ! [[ $s =~ ^[1-9][0-9]*$ ]] || ((s > 65507)); then die "bad size '$s' (1..65507)"; fi
done
command -v python3 >/dev/null || die "python3 is required"
command -v timeout >/dev/null || die "timeout (coreutils) is required"

# ---------------------------------------------------------------- processes --
WORK=$(mktemp -d "${TMPDIR:-/tmp}/compare-iperf3.XXXXXX")
PIDS=()

# Background servers are started as `timeout ... server &`. GNU timeout makes
# itself a process-group leader, so signalling -PID reaches it and the server.
stop_proc() {
    local pid=$1 i
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 30; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
    forget_pid "$pid"
}

forget_pid() {
    local keep=() p
    for p in ${PIDS[@]+"${PIDS[@]}"}; do [[ $p == "$1" ]] || keep+=("$p"); done
    PIDS=(${keep[@]+"${keep[@]}"})
}

# run_bounded OUT ERR CMD... : run a client under timeout, exit status in RC.
# Waited on in the background so that INT/TERM reach our trap at once.
RC=0
run_bounded() {
    local out=$1 err=$2 pid
    shift 2
    timeout -k 5 "$LIMIT" "$@" </dev/null >"$out" 2>"$err" &
    pid=$!
    PIDS+=("$pid")
    RC=0
    wait "$pid" || RC=$?
    forget_pid "$pid"
}

cleanup() {
    local rc=$? p
    trap - EXIT INT TERM
    for p in ${PIDS[@]+"${PIDS[@]}"}; do stop_proc "$p"; done
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ------------------------------------------------------------- python helper --
# JSON parsing, medians and the markdown table. Subcommands:
#   freeport | port FILE | iperf ... | netspeed ... | table TSV SIZES REPS
PY=$(
    cat <<'PYEOF'
import json, socket, statistics, sys

def load_json(path):
    try:
        txt = open(path, errors="replace").read().strip()
    except OSError:
        return None
    if not txt:
        return None
    try:
        return json.loads(txt)
    except ValueError:
        pass
    for line in reversed(txt.splitlines()):  # last JSON object line wins
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None

def first_line(path):
    try:
        for line in open(path, errors="replace"):
            if line.strip():
                return line.strip()[:120]
    except OSError:
        pass
    return ""

def row(size, label, rep, ok, gbps=None, mpps=None, loss=None, note=""):
    f = lambda v: "" if v is None else repr(float(v))
    note = " ".join(str(note).replace("\t", " ").split())
    print("\t".join([size, label, rep, "ok" if ok else "fail", f(gbps), f(mpps), f(loss), note]))

def freeport():
    # A port free for both TCP (iperf3 control) and UDP (data) on loopback.
    for _ in range(100):
        t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        t.bind((sys_host, 0))
        port = t.getsockname()[1]
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            u.bind((sys_host, port))
        except OSError:
            continue
        finally:
            u.close()
            t.close()
        print(port)
        return
    sys.exit("no free port found")

def port(path):
    # First stdout line of udp_server: {"event":"listening","addr":"127.0.0.1:PORT"}
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        sys.exit(1)
    for line in lines:
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and d.get("event") == "listening" and d.get("addr"):
            print(str(d["addr"]).rsplit(":", 1)[1])
            return
    sys.exit(1)

def iperf(path, errpath, size, label, rep, rc):
    size_i, rc = int(size), int(rc)
    d = load_json(path)
    err = (d or {}).get("error") if isinstance(d, dict) else None
    if rc != 0 or not isinstance(d, dict) or err:
        why = err or first_line(errpath) or "no JSON output"
        if rc in (124, 137):
            why = "timeout"
        return row(size, label, rep, False, note="iperf3 exit %d: %s" % (rc, why))
    end = d.get("end") or {}
    r = end.get("sum_received")
    if isinstance(r, dict) and r.get("seconds") and "packets" in r:
        # Client JSON, UDP, iperf3 3.12 (Debian bookworm) and later: end.sum_received
        # is built from the server's report. bytes = payload bytes the server
        # received, seconds = the server's interval, packets = datagrams the
        # sender numbered (highest sequence number seen), lost_packets = sequence
        # gaps seen by the server. bytes == (packets - lost_packets) * SIZE.
        secs = float(r["seconds"])
        rx_pkts = int(r["packets"]) - int(r.get("lost_packets", 0))
        gbps = float(r["bytes"]) * 8 / secs / 1e9
        pk = int(r["packets"])
        loss = float(r["lost_percent"]) if "lost_percent" in r else (100.0 * (pk - rx_pkts) / pk if pk else 0.0)
        note = ""
    elif isinstance(end.get("sum"), dict) and end["sum"].get("seconds"):
        # Older iperf3 (no sum_received): end.sum on the client carries the
        # server-reported packets/lost_packets, but its bytes/bits_per_second
        # are SENDER figures. Receive rate is therefore reconstructed as
        # (packets - lost_packets) * SIZE * 8 / seconds.
        s = end["sum"]
        secs = float(s["seconds"])
        pk = int(s["packets"])
        rx_pkts = pk - int(s.get("lost_packets", 0))
        gbps = rx_pkts * size_i * 8 / secs / 1e9
        loss = float(s.get("lost_percent", 100.0 * (pk - rx_pkts) / pk if pk else 0.0))
        note = "rate derived from end.sum packets-lost"
    else:
        return row(size, label, rep, False, note="iperf3 JSON has no end.sum_received/end.sum")
    row(size, label, rep, True, gbps, rx_pkts / secs / 1e6, loss, note)

def cpu_per_gb(side):
    c = (side or {}).get("cpu") if isinstance(side, dict) else None
    v = c.get("seconds_per_gb") if isinstance(c, dict) else None
    return "" if v is None else repr(float(v))

def netspeed(path, errpath, size, label, rep, rc, flagged, cpufile):
    rc, flagged = int(rc), flagged == "1"
    if rc == 0:
        # CPU per GB at each end, for the upload-against-reverse table.
        d = load_json(path)
        streams = d.get("streams") if isinstance(d, dict) else None
        if isinstance(streams, list) and streams:
            st = streams[-1]
            with open(cpufile, "a") as f:
                f.write("\t".join([size, label, rep, cpu_per_gb(st.get("sender")),
                                   cpu_per_gb(st.get("receiver"))]) + "\n")
        if isinstance(d, dict) and isinstance(d.get("downloads"), list):
            # -R: the receiver is this client, the sender the server.
            st = next((x for x in streams or [] if x.get("direction") == "server_to_client"), None)
            rcv = (st or {}).get("receiver")
            if not isinstance(rcv, dict) or rcv.get("gbps") is None:
                return row(size, label, rep, False, note="no receiver figures in the -R report")
            secs = float(rcv["seconds"])
            sent = int(st["sender"]["packets"])
            mpps = int(rcv["packets"]) / secs / 1e6 if secs > 0 else None
            loss = 100.0 * int(rcv.get("lost_packets", 0)) / sent if sent > 0 else None
            return row(size, label, rep, True, float(rcv["gbps"]), mpps, loss)
    if rc != 0:
        if rc in (124, 137):
            why = "timeout"
        elif flagged:
            why = "flag unsupported"
        else:
            why = "client exit %d: %s" % (rc, first_line(errpath))
        return row(size, label, rep, False, note=why)
    d = load_json(path)
    if not isinstance(d, dict):
        return row(size, label, rep, False, note="no JSON from udp_client")
    srv = d.get("server")
    if not isinstance(srv, dict):
        return row(size, label, rep, False, note="no server report")
    try:
        gbps = float(srv["gbps"])
        secs = float(srv["seconds"])
        rx_pkts = int(srv["received_packets"])
        rx_bytes = int(srv["received_bytes"])
        lost = int(srv["lost_packets"])
        sent = int(d["sent_packets"])
    except (KeyError, TypeError, ValueError) as e:
        return row(size, label, rep, False, note="unexpected udp_client JSON: %r" % (e,))
    if secs > 0:
        check = rx_bytes * 8 / secs / 1e9
        if gbps > 0 and abs(check - gbps) / gbps > 0.02:
            print("[compare-iperf3] warning: %s size %s: server.gbps=%.4f but "
                  "received_bytes*8/seconds=%.4f Gbit/s" % (label, size, gbps, check), file=sys.stderr)
    mpps = rx_pkts / secs / 1e6 if secs > 0 else None
    loss = 100.0 * lost / sent if sent > 0 else None
    row(size, label, rep, True, gbps, mpps, loss)

def ceiling(path, errpath, size, label, rep, rc, memfile):
    rc = int(rc)
    d = load_json(path)
    if rc != 0 or not isinstance(d, dict) or not d.get("rows"):
        why = "timeout" if rc in (124, 137) else (first_line(errpath) or "no JSON from sockbench")
        return row(size, label, rep, False, note="sockbench ceiling exit %d: %s" % (rc, why))
    r = d["rows"][0]
    with open(memfile, "a") as f:
        f.write("%r\n" % float(d["memcpy_gbps"]))
    row(size, label, rep, True, r["gbps"], r["mpps"], 100.0 * (1.0 - float(r["delivered"])))

def group(path, width):
    # TSV rows of at least `width` fields, grouped by (size, label) in the
    # order first seen; nothing when the file is missing.
    cells, order = {}, []
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return cells, order
    for line in lines:
        p = line.split("\t")
        if len(p) < width:
            continue
        key = (p[0], p[1])
        if key not in cells:
            cells[key] = []
            order.append(key)
        cells[key].append(p)
    return cells, order

def cputable(tsv, sizes):
    cells, order = group(tsv, 5)
    if not cells:
        return
    med = lambda xs: ("%.3f" % statistics.median(xs)) if xs else "n/a"
    print()
    print("CPU-seconds per GB moved, at each end (median; the sending threads and the receive threads, as the reports give them):")
    print()
    print("| size (B) | tool | sender CPU-s/GB | receiver CPU-s/GB |")
    print("|---:|:---|---:|---:|")
    for size in sizes.split():
        for key in [k for k in order if k[0] == size]:
            col = lambda i: [float(r[i]) for r in cells[key] if r[i] != ""]
            print("| %s | %s | %s | %s |" % (size, key[1], med(col(3)), med(col(4))))

def table(tsv, sizes, reps):
    reps = int(reps)
    cells, order = group(tsv, 8)
    med = lambda xs: statistics.median(xs) if xs else None
    def stats(key):
        ok = [r for r in cells[key] if r[3] == "ok"]
        col = lambda i: [float(r[i]) for r in ok if r[i] != ""]
        notes = sorted({r[7] for r in cells[key] if r[7]})
        return med(col(4)), med(col(5)), med(col(6)), len(ok), len(cells[key]), notes
    print("| size (B) | tool | recv Gbit/s | recv Mpps | loss % | ratio netspeed/iperf3 | % of ceiling |")
    print("|---:|:---|---:|---:|---:|---:|---:|")
    raw = []
    for size in sizes.split():
        base_up = stats((size, "iperf3"))[0] if (size, "iperf3") in cells else None
        base_rev = stats((size, "iperf3 -R"))[0] if (size, "iperf3 -R") in cells else None
        top = stats((size, "ceiling"))[0] if (size, "ceiling") in cells else None
        for key in [k for k in order if k[0] == size]:
            g, m, l, nok, n, notes = stats(key)
            label = key[1]
            # A download row is compared with iperf3's download.
            base = base_rev if label.endswith(" -R") else base_up
            cs = "%.0f %%" % (100.0 * g / top) if (g is not None and top) else "n/a"
            if g is None:
                why = "; ".join(notes) or "failed"
                gs, ms, ls, rs = "n/a (%s)" % why, "n/a", "n/a", "n/a"
            else:
                gs = "%.3f" % g + ("" if nok == n else " (%d/%d runs ok)" % (nok, n))
                ms = "%.3f" % m if m is not None else "n/a"
                ls = "%.2f" % l if l is not None else "n/a"
                if label in ("iperf3", "iperf3 -R"):
                    rs = "1.00 (baseline)"
                elif label == "ceiling":
                    rs = "%.2f" % (g / base) if base else "n/a"
                elif base:
                    rs = "%.2f" % (g / base)
                else:
                    rs = "n/a"
            print("| %s | %s | %s | %s | %s | %s | %s |" % (size, label, gs, ms, ls, rs, cs))
            raw.append("%s %s: %s" % (size, label, ", ".join(
                ("%.3f" % float(r[4])) if r[3] == "ok" else "fail" for r in cells[key])))
    print()
    print("Median of %d runs per cell. Per-run recv Gbit/s:" % reps)
    print()
    for r in raw:
        print("- " + r)

sys_host = "127.0.0.1"
cmd, args = sys.argv[1], sys.argv[2:]
{"freeport": freeport, "port": port, "iperf": iperf,
 "netspeed": netspeed, "ceiling": ceiling, "table": table, "cputable": cputable}[cmd](*args)
PYEOF
)
py() { python3 -c "$PY" "$@"; }

# ------------------------------------------------------------------- setup --
if ! command -v "$IPERF3" >/dev/null 2>&1; then
    [[ $IPERF3 == iperf3 ]] || die "IPERF3=$IPERF3 not found"
    SUDO=()
    if ((EUID != 0)); then
        command -v sudo >/dev/null || die "iperf3 missing and not root: install it first"
        SUDO=(sudo)
    fi
    log "installing iperf3"
    export DEBIAN_FRONTEND=noninteractive
    if ! timeout 300 "${SUDO[@]}" apt-get install -y iperf3 >&2; then
        timeout 300 "${SUDO[@]}" apt-get update >&2
        timeout 300 "${SUDO[@]}" apt-get install -y iperf3 >&2
    fi
    command -v "$IPERF3" >/dev/null 2>&1 || die "iperf3 still missing after apt-get"
fi
IPERF3_VERSION=$("$IPERF3" --version 2>&1 | head -n1 || true)
IPERF3_HELP=$("$IPERF3" --help 2>&1 || true)
HAVE_GSRO=0
[[ $IPERF3_HELP == *--gsro* ]] && HAVE_GSRO=1

if [[ -z ${NETSPEED_SERVER_BIN:-}${NETSPEED_CLIENT_BIN:-} ]]; then
    log "building netspeed (release)"
    timeout 900 cargo build --release --bin udp_server --bin udp_client --bin sockbench >&2 ||
        die "cargo build --release failed"
fi
[[ -x $SERVER_BIN && -x $CLIENT_BIN ]] || die "$SERVER_BIN / $CLIENT_BIN not built"
if ((CEILING)) && [[ ! -x $SOCKBENCH_BIN ]]; then die "$SOCKBENCH_BIN not built (or set CEILING=0)"; fi

# NETSPEED_VARIANTS -> parallel arrays of labels and flag strings.
V_LABEL=()
V_FLAGS=()
V_SFLAGS=()
V_SIZES=()
IFS=';' read -r -a _variants <<<"$NETSPEED_VARIANTS"
for v in ${_variants[@]+"${_variants[@]}"}; do
    name=${v%%:*}
    flags=""
    sflags=""
    [[ $v == *:* ]] && flags=${v#*:}
    if [[ $flags == *"|"* ]]; then
        sflags=${flags#*|}
        flags=${flags%%|*}
    fi
    name=$(printf '%s' "$name" | tr -d '[:space:]')
    [[ -n $name ]] || continue
    sizes_only=""
    if [[ $name == *@* ]]; then
        sizes_only=" ${name#*@} "
        sizes_only=${sizes_only//,/ }
        name=${name%%@*}
    fi
    V_SIZES+=("$sizes_only")
    if [[ $name == default ]]; then V_LABEL+=("netspeed"); else V_LABEL+=("netspeed[$name]"); fi
    V_FLAGS+=("$flags")
    V_SFLAGS+=("$sflags")
done
((${#V_LABEL[@]} > 0)) || die "NETSPEED_VARIANTS has no variant"

RESULTS=$WORK/results.tsv
: >"$RESULTS"
CPUS=$WORK/cpu.tsv
: >"$CPUS"
LIMIT=$((SECS + 30)) # hard bound for any single server / client

# Wait until TCP PORT listens (iperf3 control socket) or PID dies; 10 s max.
wait_tcp_listen() {
    local port=$1 pid=$2 i
    for ((i = 0; i < 100; i++)); do
        kill -0 "$pid" 2>/dev/null || return 1
        if command -v ss >/dev/null; then
            [[ -n $(ss -Hltn "sport = :$port" 2>/dev/null) ]] && return 0
        elif ((i >= 5)); then
            return 0 # no ss: assume 0.5 s is enough
        fi
        sleep 0.1
    done
    return 1
}

# run_iperf SIZE LABEL REP CLIENT_ONLY [extra iperf3 flags...]: CLIENT_ONLY
# (e.g. "-R") goes to the client alone, the rest to both ends.
run_iperf() {
    local size=$1 label=$2 rep=$3
    local -a client_only=()
    read -r -a client_only <<<"$4"
    shift 4
    local port spid rc=0 out=$WORK/iperf-c.json err=$WORK/iperf-c.err
    port=$(py freeport)
    timeout -k 5 "$LIMIT" "$IPERF3" -s -1 -B "$HOST" -p "$port" "$@" \
        </dev/null >"$WORK/iperf-s.log" 2>&1 &
    spid=$!
    PIDS+=("$spid")
    if (($# > 0)) && ! wait_tcp_listen "$port" "$spid"; then
        # The server may refuse client-only flags (e.g. --gsro): retry without.
        stop_proc "$spid"
        timeout -k 5 "$LIMIT" "$IPERF3" -s -1 -B "$HOST" -p "$port" \
            </dev/null >"$WORK/iperf-s.log" 2>&1 &
        spid=$!
        PIDS+=("$spid")
    fi
    if ! wait_tcp_listen "$port" "$spid"; then
        stop_proc "$spid"
        printf '%s\t%s\t%s\tfail\t\t\t\t%s\n' "$size" "$label" "$rep" \
            "iperf3 server did not start: $(head -c 100 "$WORK/iperf-s.log" | tr '\n\t' '  ')" >>"$RESULTS"
        return 0
    fi
    run_bounded "$out" "$err" "$IPERF3" -c "$HOST" -p "$port" -u -b 0 -l "$size" -t "$SECS" -J \
        ${client_only[@]+"${client_only[@]}"} "$@"
    rc=$RC
    stop_proc "$spid"
    py iperf "$out" "$err" "$size" "$label" "$rep" "$rc" >>"$RESULTS"
}

# run_netspeed SIZE LABEL REP FLAGS SERVER_FLAGS -> returns 3 if the client exited non-zero
run_netspeed() {
    local size=$1 label=$2 rep=$3 flags=$4 sflags=$5
    local spid port="" rc=0 i flagged=0 out=$WORK/ns-c.json err=$WORK/ns-c.err slog=$WORK/ns-s.out
    local -a extra=() sextra=()
    read -r -a extra <<<"$flags"
    read -r -a sextra <<<"$sflags"
    ((${#extra[@]} + ${#sextra[@]} > 0)) && flagged=1
    : >"$slog"
    timeout -k 5 "$LIMIT" "$SERVER_BIN" --listen "$HOST:0" --json --interval 0 \
        ${sextra[@]+"${sextra[@]}"} </dev/null >"$slog" 2>"$WORK/ns-s.err" &
    spid=$!
    PIDS+=("$spid")
    for ((i = 0; i < 100; i++)); do # 10 s to print {"event":"listening",...}
        if grep -q '"listening"' "$slog" 2>/dev/null; then
            port=$(py port "$slog" || true)
            [[ -n $port ]] && break
        fi
        kill -0 "$spid" 2>/dev/null || break
        sleep 0.1
    done
    if [[ -z $port ]]; then
        stop_proc "$spid"
        printf '%s\t%s\t%s\tfail\t\t\t\t%s\n' "$size" "$label" "$rep" \
            "udp_server did not report a listening address" >>"$RESULTS"
        return 0
    fi
    run_bounded "$out" "$err" "$CLIENT_BIN" -s "$HOST:$port" -b "$size" --duration "${SECS}s" \
        --json --quiet ${extra[@]+"${extra[@]}"}
    rc=$RC
    stop_proc "$spid"
    py netspeed "$out" "$err" "$size" "$label" "$rep" "$rc" "$flagged" "$CPUS" >>"$RESULTS"
    if ((rc != 0)); then return 3; fi
    return 0
}

# run_ceiling SIZE REP: sockbench ceiling, one size, as long as a run.
MEMCPY=$WORK/memcpy.txt
run_ceiling() {
    local size=$1 rep=$2 out=$WORK/ceiling.json err=$WORK/ceiling.err
    run_bounded "$out" "$err" "$SOCKBENCH_BIN" ceiling --size "$size" --duration "${SECS}s" --json --quiet
    py ceiling "$out" "$err" "$size" "ceiling" "$rep" "$RC" "$MEMCPY" >>"$RESULTS"
}

# -------------------------------------------------------------------- runs --
START=$(date +%s)
log "iperf3: $IPERF3_VERSION (--gsro: $([[ $HAVE_GSRO == 1 ]] && echo yes || echo no))"
log "sizes: $SIZES; reps: $REPS; ${SECS}s per run; variants: ${V_LABEL[*]}"
for size in "${SIZE_LIST[@]}"; do
    do_gsro=0
    if ((HAVE_GSRO)); then
        for g in $GSRO_SIZES; do [[ $g == "$size" ]] && do_gsro=1; done
    fi
    declare -A skip=()
    # Reps are interleaved (iperf3, netspeed, iperf3, ...) so drift hits both.
    for ((rep = 1; rep <= REPS; rep++)); do
        log "size $size, run $rep/$REPS: iperf3"
        run_iperf "$size" "iperf3" "$rep" ""
        if ((do_gsro)); then
            log "size $size, run $rep/$REPS: iperf3 --gsro"
            run_iperf "$size" "iperf3 --gsro" "$rep" "" --gsro
        fi
        if ((REVERSE)); then
            log "size $size, run $rep/$REPS: iperf3 -R"
            run_iperf "$size" "iperf3 -R" "$rep" "-R"
            log "size $size, run $rep/$REPS: netspeed -R"
            run_netspeed "$size" "netspeed -R" "$rep" "-R" "" || true
        fi
        if ((CEILING)); then
            log "size $size, run $rep/$REPS: ceiling"
            run_ceiling "$size" "$rep"
        fi
        for ((v = 0; v < ${#V_LABEL[@]}; v++)); do
            label=${V_LABEL[v]}
            [[ -z ${skip[$label]:-} ]] || continue
            [[ -z ${V_SIZES[v]// /} || ${V_SIZES[v]} == *" $size "* ]] || continue
            log "size $size, run $rep/$REPS: $label"
            vrc=0
            run_netspeed "$size" "$label" "$rep" "${V_FLAGS[v]}" "${V_SFLAGS[v]}" || vrc=$?
            # A variant with extra flags that fails is not retried at this size.
            if ((vrc == 3)) && [[ -n ${V_FLAGS[v]// /}${V_SFLAGS[v]// /} ]]; then skip[$label]=1; fi
        done
    done
    unset skip
done
ELAPSED=$(($(date +%s) - START))

# ------------------------------------------------------------------ report --
CPU=$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo 2>/dev/null || true)
NS_REV=$(git rev-parse --short HEAD 2>/dev/null || echo "uncommitted")
NS_VERSION=$(awk -F'"' '/^version *=/ {print $2; exit}' Cargo.toml 2>/dev/null || true)
{
    echo "## netspeed vs iperf3, UDP over loopback (${HOST})"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "- kernel: $(uname -r); nproc: $(nproc); CPU: ${CPU:-unknown}"
    echo "- iperf3: ${IPERF3_VERSION}"
    echo "- netspeed: ${NS_VERSION:-?} (git ${NS_REV}), cargo --release"
    echo "- command: \`${CMDLINE}\`"
    echo "- iperf3 per run: \`iperf3 -s -1 -B ${HOST} -p PORT\` + \`iperf3 -c ${HOST} -p PORT -u -b 0 -l SIZE -t ${SECS} -J\`"
    echo "- netspeed per run: \`udp_server --listen ${HOST}:0 --json --interval 0\` + \`udp_client -s ${HOST}:PORT -b SIZE --duration ${SECS}s --json --quiet [variant flags]\`"
    for ((v = 0; v < ${#V_LABEL[@]}; v++)); do
        flags=${V_FLAGS[v]// /}
        if [[ -n $flags ]]; then flags="\`${V_FLAGS[v]}\`"; else flags="(none)"; fi
        sflags=""
        [[ -n ${V_SFLAGS[v]// /} ]] && sflags="; extra server flags \`${V_SFLAGS[v]}\`"
        echo "  - ${V_LABEL[v]}: extra client flags ${flags}${sflags}"
    done
    if ((HAVE_GSRO)); then
        echo "- iperf3 --gsro rows (sizes ${GSRO_SIZES}): same as iperf3, with \`--gsro\` on the client (and on the server if it accepts it)"
    fi
    echo "- receiver-side figures: iperf3 \`end.sum_received\` (bytes*8/seconds, packets-lost_packets); netspeed \`server.gbps\`, \`server.received_packets/server.seconds\`, loss = \`server.lost_packets/sent_packets\`"
    if ((CEILING)); then
        echo "- ceiling per run: \`sockbench ceiling --size SIZE --duration ${SECS}s --json\`: netspeed's default path (connected socket, sendmmsg 32, UDP GSO where a buffer holds 2+ datagrams; udp_server's recvmmsg loop with GRO) with no header written or read"
        if [[ -s $MEMCPY ]]; then
            echo "- memcpy, one core, 64 KiB blocks (the hard limit: loopback UDP copies each byte twice): median $(sort -g "$MEMCPY" | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}' | xargs printf '%.1f') Gbit/s"
        fi
    fi
    echo "- total bench time: ${ELAPSED}s"
    echo
    if ((REVERSE)); then
        echo "- reverse rows: \`iperf3 -c ... -u -b 0 -l SIZE -t ${SECS} -J -R\` (the iperf3 server sends) and \`udp_client ... -R\` (udp_server sends, the client counts); both receivers are the client, and -R ratios are against iperf3 -R"
    fi
    echo
    py table "$RESULTS" "$SIZES" "$REPS"
    py cputable "$CPUS" "$SIZES"
}
