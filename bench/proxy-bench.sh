#!/usr/bin/env bash
# tcp_proxy against its targets (issue 4), in one run on this machine:
#   (a) iperf3 TCP throughput: direct, through every mode, through seed
#       004's Go io.Copy proxy (bench/peers/goproxy) and HAProxy (mode tcp);
#       ratios best-mode/Go and best-mode/HAProxy, all on the host's TCP
#       settings, plus one row of tcp_proxy --congestion cubic;
#   (a') the same comparison (fewer modes) in a private network namespace
#       where every sender, iperf3 included, uses cubic: no path pays for
#       BBR's pacing timer (docs/proxy.md); the host is not touched. Where
#       the namespace may not set its own net.ipv4.tcp_congestion_control
#       (some hosts answer EPERM), cubic is set per socket instead (iperf3
#       -C, tcp_proxy --congestion) and the peers that cannot do that (Go,
#       HAProxy) are left out, with a message: the part never aborts;
#   (b) the latency matrix: `tcp_proxy bench` (with the Go proxy, HAProxy
#       and socat as outside peers), plus the --no-nodelay reproduction of
#       seed 004's stall;
#   (c) 1 GiB each way through every mode, sha256 compared at both ends;
#   (d) 1000 concurrent connections through every mode, and the proxy's
#       open-fd count back to its baseline after they close.
#
# Usage: bench/proxy-bench.sh            (as root: installs what it needs)
# Knobs: IPERF_SECONDS=3 IPERF_ROUNDS=5 LAT_DURATION=1s XFER_BYTES=1073741824 CONNS=1000
#        SKIP="a a2 b c d" (parts to skip) MODES="tokio ... splice"
#        CC_PER_SOCKET=1 (a' sets cubic per socket even where the sysctl works,
#        to exercise that path)
# Loopback only; every server is on an ephemeral port and every process is
# reaped on exit.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

IPERF_SECONDS=${IPERF_SECONDS:-3}
IPERF_ROUNDS=${IPERF_ROUNDS:-5}
LAT_DURATION=${LAT_DURATION:-1s}
XFER_BYTES=${XFER_BYTES:-1073741824}
CONNS=${CONNS:-1000}
SKIP=${SKIP:-}
MODES=${MODES:-"tokio tokio-copy copy-bidirectional std std-copy splice"}

bench_tmp proxy-bench

skip() { [[ " $SKIP " == *" $1 "* ]]; }

if [ -z "${THROUGHPUT_ONLY:-}" ]; then
    apt_install_missing iperf3 haproxy socat go:golang-go python3
fi

if [ -z "${THROUGHPUT_ONLY:-}" ]; then
    echo "== machine"
    echo "kernel: $(uname -r); cpus: $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
    echo "rustc: $(rustc --version 2>/dev/null || echo '?'); go: $(go version 2>/dev/null || echo none)"
    echo "haproxy: $(haproxy -v 2>/dev/null | sed -n 1p); iperf3: $(iperf3 --version 2>/dev/null | sed -n 1p)"
    echo "date: $(date -u +%FT%TZ); commit: $(git rev-parse --short HEAD 2>/dev/null || echo ?)"
    echo "tcp congestion control: $(cat /proc/sys/net/ipv4/tcp_congestion_control 2>/dev/null || echo ?); qdisc on lo: $(tc qdisc show dev lo 2>/dev/null | awk '{print $2}' | head -1)"
fi

# The (a') re-invocation is handed the binary the outer run built, so both
# parts measure the same one and nothing is built inside the namespace.
tcp_proxy_bin

GO_PROXY=${GO_PROXY_BIN:-}
if [ -z "$GO_PROXY" ] && command -v go >/dev/null; then
    go_peer goproxy
    GO_PROXY=$TMP/goproxy
fi

# start_proxy UPSTREAM MODE [ARGS...]: sets PROXY_ADDR, PROXY_PID, PROXY_OUT.
start_proxy() {
    local up=$1 mode=$2
    shift 2
    local out=$TMP/proxy-${mode:-default}-$RANDOM.out
    PROXY_OUT=$out
    # An empty MODE runs tcp_proxy's defaults.
    "$BIN" --listen 127.0.0.1:0 --upstream "$up" ${mode:+--mode "$mode"} --json "$@" >"$out" 2>"$out.err" &
    PROXY_PID=$!
    PIDS+=("$PROXY_PID")
    PROXY_ADDR=$(wait_line "$out" '"event":"listening"' | sed -n 's/.*"addr":"\([^"]*\)".*/\1/p')
}

# start_go UPSTREAM: sets PROXY_ADDR and PROXY_PID.
start_go() {
    local out=$TMP/go-$RANDOM.out
    "$GO_PROXY" -listen 127.0.0.1:0 -upstream "$1" >"$out" 2>/dev/null &
    PROXY_PID=$!
    PIDS+=("$PROXY_PID")
    PROXY_ADDR=$(wait_line "$out" 'listening on' | awk '{print $3}')
}

# start_haproxy UPSTREAM: sets PROXY_ADDR and PROXY_PID.
start_haproxy() {
    local port
    port=$(free_port)
    haproxy_cfg "$TMP/haproxy.cfg" "$port" "$1" 4096 60s
    haproxy -db -f "$TMP/haproxy.cfg" >/dev/null 2>&1 &
    PROXY_PID=$!
    PIDS+=("$PROXY_PID")
    wait_port "$port"
    PROXY_ADDR=127.0.0.1:$port
}

# ------------------------------------------------------------ (a) throughput
# throughput_table TITLE TARGET...: one iperf3 server, every target in turn
# for $IPERF_ROUNDS interleaved rounds; prints medians and the ratios of
# the best default-settings tcp_proxy row to the Go proxy and to HAProxy.
# A target is "label|kind|mode|buffer|extra proxy flags".
throughput_table() {
    local title=$1
    shift
    local targets=("$@")
    echo
    echo "== $title"
    echo "   iperf3 TCP, one stream, ${IPERF_SECONDS}s per run, $IPERF_ROUNDS rounds interleaved (median shown);"
    echo "   congestion control of new sockets here: $(cat /proc/sys/net/ipv4/tcp_congestion_control)${PER_SOCKET_CC:+; set per socket: $PER_SOCKET_CC (iperf3 -C, tcp_proxy --congestion)}"
    local iport
    iport=$(free_port)
    iperf3 -s -p "$iport" >/dev/null 2>&1 &
    local ipid=$!
    PIDS+=("$ipid")
    wait_port "$iport"
    local up=127.0.0.1:$iport
    declare -A runs
    local t label kind mode buf extra
    for _ in $(seq "$IPERF_ROUNDS"); do
        for t in "${targets[@]}"; do
            IFS='|' read -r label kind mode buf extra <<<"$t"
            case $kind in
                direct) PROXY_ADDR=$up PROXY_PID="" ;;
                proxy)
                    # shellcheck disable=SC2086 # extra is a list of flags
                    start_proxy "$up" "$mode" ${buf:+--buffer-size "$buf"} $extra ${PER_SOCKET_CC:+--congestion "$PER_SOCKET_CC"}
                    ;;
                go) start_go "$up" ;;
                haproxy) start_haproxy "$up" ;;
            esac
            runs[$label]="${runs[$label]:-} $(iperf_gbps "$PROXY_ADDR")"
            [ -n "$PROXY_PID" ] && stop "$PROXY_PID"
        done
    done
    for t in "${targets[@]}"; do
        label=${t%%|*}
        echo "$label|${runs[$label]}"
    done | python3 -c '
import statistics, sys
rows = []
for line in sys.stdin:
    label, runs = line.rstrip("\n").split("|")
    vals = [float(v) for v in runs.split()]
    rows.append((label, statistics.median(vals), vals))
for label, med, vals in rows:
    print("%-46s %6.2f Gbit/s   runs: %s" % (label, med, " ".join("%.2f" % v for v in vals)))
# The headline compares like with like: rows with default settings only.
ours = [r for r in rows if r[0].startswith("tcp_proxy") and "--" not in r[0]]
best = max(ours, key=lambda r: r[1])
print("best mode (default settings): %s at %.2f Gbit/s (median)" % (best[0], best[1]))
peers = ("Go io.Copy proxy", "HAProxy (mode tcp)")
for peer in peers:
    for label, med, _ in rows:
        if label == peer and med > 0:
            print("best mode / %s: %.2fx" % (peer, best[1] / med))
for label, med, _ in rows:
    if label.startswith("tcp_proxy") and ("--" in label or "default" in label):
        for peer in peers:
            for plabel, pmed, _ in rows:
                if plabel == peer and pmed > 0:
                    print("%s / %s: %.2fx" % (label, peer, med / pmed))
'
    stop "$ipid"
}

iperf_gbps() {
    local host=${1%:*} port=${1##*:}
    iperf3 -c "$host" -p "$port" -t "$IPERF_SECONDS" ${PER_SOCKET_CC:+-C "$PER_SOCKET_CC"} -J |
        python3 -c 'import json,sys; print("%.2f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e9))'
}

# The peers present on this machine, as targets.
peer_targets() {
    [ -n "$GO_PROXY" ] && echo "Go io.Copy proxy|go|||"
    command -v haproxy >/dev/null && echo "HAProxy (mode tcp)|haproxy|||"
    true
}

if [ -n "${THROUGHPUT_ONLY:-}" ]; then
    # The re-invocation of (a') inside its namespace: every process here,
    # iperf3 at both ends, the proxies and the peers, sends with cubic.
    # Never on the host's own network namespace: that sysctl is not ours.
    if [ -z "${BENCH_NETNS:-}" ] || [ "$(ip netns identify $$ 2>/dev/null)" != "$BENCH_NETNS" ]; then
        echo "THROUGHPUT_ONLY is for the private namespace of (a'); refusing to change the host's congestion control" >&2
        exit 2
    fi
    ip link set lo up
    PER_SOCKET_CC=
    if [ -n "${CC_PER_SOCKET:-}" ]; then
        PER_SOCKET_CC=$THROUGHPUT_ONLY
        echo "   CC_PER_SOCKET is set: $THROUGHPUT_ONLY per socket, the namespace's sysctl left alone"
    elif ! err=$(sysctl -qw net.ipv4.tcp_congestion_control="$THROUGHPUT_ONLY" 2>&1); then
        # Some hosts do not let a namespace choose its own default
        # (EPERM). Set it per socket instead; never abort the part.
        PER_SOCKET_CC=$THROUGHPUT_ONLY
        echo "   this namespace may not set net.ipv4.tcp_congestion_control ($err);"
        echo "   setting $THROUGHPUT_ONLY per socket instead (TCP_CONGESTION: iperf3 -C, tcp_proxy --congestion)"
    fi
    targets=("direct|direct|||")
    [[ " $MODES " == *" splice "* ]] && targets+=("tcp_proxy default (no flags)|proxy|||")
    for mode in splice std tokio; do
        [[ " $MODES " == *" $mode "* ]] && targets+=("tcp_proxy $mode (1MiB)|proxy|$mode|1MiB|")
    done
    if [ -z "$PER_SOCKET_CC" ]; then
        mapfile -t -O ${#targets[@]} targets < <(peer_targets)
    else
        echo "   SKIPPED rows: the Go io.Copy proxy and HAProxy, which cannot set a congestion control per socket"
        echo "   (they would send with the namespace's default, $(cat /proc/sys/net/ipv4/tcp_congestion_control), and compare nothing)"
    fi
    throughput_table "(a') the same, inside a private network namespace where every sender uses $THROUGHPUT_ONLY" "${targets[@]}"
    exit 0
fi

if ! skip a; then
    targets=("direct|direct|||" "tcp_proxy default (no flags)|proxy|||")
    for mode in $MODES; do
        case $mode in
            tokio | std | splice) for buf in 64KiB 1MiB; do targets+=("tcp_proxy $mode ($buf)|proxy|$mode|$buf|"); done ;;
            *) targets+=("tcp_proxy $mode|proxy|$mode||") ;;
        esac
    done
    # One row with the proxy's own legs on cubic (--congestion): with BBR
    # as the host default, BBR's timer pacing (no fq qdisc on loopback) is
    # the proxy's largest cost on a VM; see docs/proxy.md.
    if [[ " $MODES " == *" splice "* ]] && grep -qw cubic /proc/sys/net/ipv4/tcp_available_congestion_control 2>/dev/null; then
        targets+=("tcp_proxy splice (1MiB) --congestion cubic|proxy|splice|1MiB|--congestion cubic")
    fi
    mapfile -t -O ${#targets[@]} targets < <(peer_targets)
    throughput_table "(a) throughput through each proxy, host settings" "${targets[@]}"
fi

# (a') The comparison again with every sender on cubic, so that no path pays
# for BBR's pacing timer: in a private network namespace, whose
# net.ipv4.tcp_congestion_control is its own (the host's is not touched).
if ! skip a2; then
    if [ "$(id -u)" = 0 ] && command -v ip >/dev/null && grep -qw cubic /proc/sys/net/ipv4/tcp_available_congestion_control 2>/dev/null; then
        NS=proxybench$$
        ip netns add "$NS"
        # Deleting a namespace only drops its name: its processes must be
        # gone first, so the inner run is reaped by cleanup like the rest.
        trap 'cleanup; ip netns del "$NS" 2>/dev/null || true' EXIT
        ip netns exec "$NS" env THROUGHPUT_ONLY=cubic BENCH_NETNS="$NS" GO_PROXY_BIN="$GO_PROXY" PROXY_BIN="$BIN" \
            MODES="$MODES" IPERF_SECONDS="$IPERF_SECONDS" IPERF_ROUNDS="$IPERF_ROUNDS" \
            bash "$ROOT/bench/proxy-bench.sh" &
        INNER=$!
        PIDS+=("$INNER")
        # A failure here is reported; (b), (c) and (d) still run.
        wait "$INNER" || echo "== (a') FAILED (exit $?); see the lines above"
        ip netns del "$NS"
    else
        echo
        echo "== (a') SKIPPED: needs root, ip(8) and the cubic module for a private network namespace"
    fi
fi

# ------------------------------------------------------------ (b) latency
if ! skip b; then
    echo
    echo "== (b) latency: tcp_proxy bench --duration $LAT_DURATION ${GO_PROXY:+--go-proxy <built>}"
    "$BIN" bench --duration "$LAT_DURATION" ${GO_PROXY:+--go-proxy "$GO_PROXY"} 2>/dev/null
    echo
    echo "== (b') seed 004's stall: the same with --no-nodelay (tokio 8K and 32K, splice 64K)"
    "$BIN" bench --duration 2s --no-nodelay --modes tokio --buffer-sizes 8KiB,32KiB 2>/dev/null | grep -v -E 'Go|HAProxy|socat'
    "$BIN" bench --duration 2s --no-nodelay --no-peers --modes splice,std --buffer-sizes 64KiB 2>/dev/null | tail -n +3
fi

# ------------------------------------------------------------ (c) 1 GiB sha256
if ! skip c; then
    echo
    echo "== (c) $XFER_BYTES bytes each way at once, sha256 at both ends"
    for mode in $MODES; do
        srv=$TMP/sha-$mode.out
        python3 bench/peers/sha_xfer.py server "$XFER_BYTES" >"$srv" &
        SPID=$!
        PIDS+=("$SPID")
        port=$(wait_line "$srv" '^port ' | awk '{print $2}')
        start_proxy "127.0.0.1:$port" "$mode"
        client=$(timeout 300 python3 bench/peers/sha_xfer.py client "$PROXY_ADDR" "$XFER_BYTES")
        wait "$SPID"
        server=$(tail -1 "$srv")
        python3 - "$mode" "$client" "$server" "$XFER_BYTES" <<'EOF'
import json, sys
mode, c, s, n = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
ok = (c["sent_sha256"] == s["recv_sha256"] and s["sent_sha256"] == c["recv_sha256"]
      and c["recv_bytes"] == n and s["recv_bytes"] == n)
print("%-20s %s  client->upstream %s  upstream->client %s  %.1f s" % (
    mode, "OK " if ok else "BAD", s["recv_sha256"][:16], c["recv_sha256"][:16], c["seconds"]))
sys.exit(0 if ok else 1)
EOF
        echo "  $(wait_line "$PROXY_OUT" '"conn_closed"')"
        stop "$PROXY_PID"
    done
fi

# ------------------------------------------------------------ (d) 1000 conns
if ! skip d; then
    echo
    echo "== (d) $CONNS concurrent connections, proxy fds before / peak / after"
    ulimit -n 65536 2>/dev/null || true
    echo_out=$TMP/echo.out
    python3 bench/peers/many_conns.py echo >"$echo_out" &
    EPID=$!
    PIDS+=("$EPID")
    eport=$(wait_line "$echo_out" '^port ' | awk '{print $2}')
    for mode in $MODES; do
        start_proxy "127.0.0.1:$eport" "$mode"
        printf '%-20s ' "$mode"
        timeout 120 python3 bench/peers/many_conns.py clients "$PROXY_ADDR" "$CONNS" "$PROXY_PID"
        stop "$PROXY_PID"
    done
    stop "$EPID"
fi
