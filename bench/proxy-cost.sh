#!/usr/bin/env bash
# What tcp_proxy costs, against HAProxy (mode tcp, and again with
# `option splice-auto`), seed 004's Go io.Copy proxy (bench/peers/goproxy)
# and no proxy at all (issue 29). Throughput through a proxy on two cores is
# a scheduler race (iperf3's two ends and the proxy share the CPUs); what a
# proxy costs is not:
#
#   cpu    CPU-seconds per GB forwarded by the proxy process alone (utime +
#          stime from /proc/PID/stat, before and after; bytes from iperf3's
#          own JSON), iperf3 TCP paced with -b at RATES and unpaced (0), for
#          tcp_proxy's default and every other mode;
#   cps    connections per second: wrk -H 'Connection: close' (a new
#          connection per request, ~1 KiB response) against a small Go
#          net/http server (bench/peers/costpeer) behind each proxy, and the
#          proxy's CPU per 1,000 connections; once with each proxy pinned
#          to CPU 0 and the load on the other CPUs, once all sharing them;
#   idle   IDLE_CONNS idle connections through each proxy, every proxy
#          started from a shell whose soft RLIMIT_NOFILE is PROXY_NOFILE
#          (1024), and with PROXY_HARD_NOFILE under that hard limit, which
#          none may raise: how many were served (one echo each; with
#          PROXY_HARD_NOFILE, "served under the hard limit"), the proxy's
#          RSS and open fds per idle connection, and the latency added
#          (p50, p99 of 64-byte ping-pongs over one more connection) before
#          and while they are open; tcp_proxy once more with its soft limit
#          raised to the hard one (what it does once it raises its own);
#   pipes  the measurement that was the ignored test
#          default_splice_with_4000_connections in tests/proxy_resources.rs:
#          tcp_proxy's default with PIPES_CONNS connections (or as many as
#          the hard fd limit allows), RSS and MemAvailable per idle and per
#          busy connection, and the sizes its splice pipes grew to
#          (bench/peers/splice_pipes.py).
#
# Then a markdown table of everything, the ratios of tcp_proxy's default to
# each peer, and a summary against issue 29's goals.
#
# Usage: bench/proxy-cost.sh            (as root: installs what it needs)
#        QUICK=1 bench/proxy-cost.sh    (3.5 minutes here; the full run
#                                        10, on a 2-core VM)
# Knobs (environment; QUICK=1 changes the defaults marked *):
#   RATES="1G 5G 10G 0"   iperf3 -b per cpu run; 0 is unpaced
#   CPU_SECONDS=5*        seconds per iperf3 run (quick: 2)
#   CPU_ROUNDS=2*         interleaved rounds, medians shown (quick: 1)
#   MODES="default tokio tokio-copy copy-bidirectional std std-copy"
#                         tcp_proxy rows of the cpu part ("default": no flags)
#   CPS_SECONDS=5*        seconds per wrk run (quick: 3)
#   CPS_ROUNDS=5*         interleaved rounds, each starting one target later;
#                         medians shown (quick: 1)
#   CPS_CONNS=16          wrk -c (connections kept busy at once)
#   CPS_BYTES=1024        response body bytes
#   CPS_LAYOUTS="pinned shared"  pinned: each proxy on CPU 0 and wrk with its
#                         server on the others (taskset); shared: nobody
#                         pinned (only "shared" on one CPU)
#   IDLE_CONNS=10000      idle connections per proxy
#   PROXY_NOFILE=1024     soft RLIMIT_NOFILE every proxy is started with
#                         (every part)
#   PROXY_HARD_NOFILE=    hard RLIMIT_NOFILE every proxy is started under
#                         (every part; the soft one within it), as root
#                         without CAP_SYS_RESOURCE (setpriv), so that no
#                         proxy may raise it; HAProxy then gets no maxconn
#                         in the idle part and sizes it to the limit, as it
#                         does when none is set (it refuses to start with
#                         one the limit cannot hold). Empty: the hard limit
#                         is left as it is. The descriptor-limit run:
#                         SKIP="cpu cps pipes" IDLE_CONNS=300 PROXY_NOFILE=256
#                         PROXY_HARD_NOFILE=256 bench/proxy-cost.sh
#   IDLE_TCP_PROXY_FLAGS="--max-conns <IDLE_CONNS+64>" tcp_proxy flags in the
#                         idle part (the default --max-conns is 4,096); HAProxy
#                         gets maxconn IDLE_CONNS+64 likewise
#   RTTS=5000* MSG=64     ping-pong round trips and their size (quick: 2000)
#   PIPES_CONNS=4000 PIPES_BUSY=100   the pipes part
#   SKIP="cpu cps idle pipes"          parts to skip
#   PROXY_BIN             a built tcp_proxy (default: cargo build --release)
# Loopback only; every server listens on a free port; every process is
# reaped on exit; every wait and loop is bounded.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

QUICK=${QUICK:-}
RATES=${RATES:-"1G 5G 10G 0"}
CPU_SECONDS=${CPU_SECONDS:-$([ -n "$QUICK" ] && echo 2 || echo 5)}
CPU_ROUNDS=${CPU_ROUNDS:-$([ -n "$QUICK" ] && echo 1 || echo 2)}
MODES=${MODES:-"default tokio tokio-copy copy-bidirectional std std-copy"}
CPS_SECONDS=${CPS_SECONDS:-$([ -n "$QUICK" ] && echo 3 || echo 5)}
CPS_ROUNDS=${CPS_ROUNDS:-$([ -n "$QUICK" ] && echo 1 || echo 5)}
CPS_CONNS=${CPS_CONNS:-16}
CPS_BYTES=${CPS_BYTES:-1024}
NCPU=$(nproc)
CPS_LAYOUTS=${CPS_LAYOUTS:-$([ "$NCPU" -ge 2 ] && echo "pinned shared" || echo shared)}
IDLE_CONNS=${IDLE_CONNS:-10000}
PROXY_NOFILE=${PROXY_NOFILE:-1024}
PROXY_HARD_NOFILE=${PROXY_HARD_NOFILE:-}
IDLE_TCP_PROXY_FLAGS=${IDLE_TCP_PROXY_FLAGS:-"--max-conns $((IDLE_CONNS + 64))"}
RTTS=${RTTS:-$([ -n "$QUICK" ] && echo 2000 || echo 5000)}
MSG=${MSG:-64}
PIPES_CONNS=${PIPES_CONNS:-4000}
PIPES_BUSY=${PIPES_BUSY:-100}
SKIP=${SKIP:-}

bench_tmp proxy-cost
RESULTS=$TMP/results.tsv
: >"$RESULTS"
# Commands put before a proxy and before the load (wrk, its server) in the
# cps part's "pinned" layout: empty everywhere else.
PROXY_PREFIX=()
LOAD_PREFIX=()
# Put before every proxy under PROXY_HARD_NOFILE: as root, without
# CAP_SYS_RESOURCE, so that it keeps the hard limit it is given (HAProxy
# and tcp_proxy raise it when they may).
LIMIT_PREFIX=()
if [ -n "$PROXY_HARD_NOFILE" ] && [ "$(id -u)" = 0 ]; then
    command -v setpriv >/dev/null || { echo "proxy-cost: setpriv (util-linux) is needed for PROXY_HARD_NOFILE" >&2; exit 2; }
    LIMIT_PREFIX=(setpriv --inh-caps=-sys_resource --bounding-set=-sys_resource --)
fi
trap 'exit 130' INT TERM
trap 'echo "proxy-cost: failed at line $LINENO" >&2' ERR

skip() { [[ " $SKIP " == *" $1 "* ]]; }
log() { printf '[proxy-cost %s] %s\n' "$(date +%T)" "$*" >&2; }
T0=$(date +%s)

apt_install_missing iperf3 haproxy wrk python3 go:golang-go
for tool in iperf3 haproxy wrk python3 go; do
    command -v "$tool" >/dev/null || { echo "proxy-cost: $tool is needed" >&2; exit 2; }
done

tcp_proxy_bin
go_peer goproxy
go_peer costpeer
GO_PROXY=$TMP/goproxy
PEER=$TMP/costpeer
TICK=$(getconf CLK_TCK)

echo "== machine"
echo "kernel: $(uname -r); cpus: $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)"
echo "tcp_proxy: $("$BIN" --version 2>/dev/null | head -1) at $(git rev-parse --short HEAD 2>/dev/null || echo ?)$(git diff --quiet HEAD 2>/dev/null || echo ' (uncommitted changes)')"
echo "haproxy: $(haproxy -v 2>/dev/null | sed -n 1p)"
echo "go: $(go version); iperf3: $(iperf3 --version 2>/dev/null | sed -n 1p); wrk: $(wrk --version 2>&1 | sed -n 1p | cut -c1-40)"
echo "date: $(date -u +%FT%TZ); tcp congestion control: $(cat /proc/sys/net/ipv4/tcp_congestion_control); RLIMIT_NOFILE here: soft $(ulimit -Sn), hard $(ulimit -Hn)"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg) (the proxy shares $(nproc) cpus with everything else running)"
echo "settings: RATES='$RATES' CPU_SECONDS=$CPU_SECONDS CPU_ROUNDS=$CPU_ROUNDS CPS_SECONDS=$CPS_SECONDS CPS_ROUNDS=$CPS_ROUNDS CPS_CONNS=$CPS_CONNS CPS_LAYOUTS='$CPS_LAYOUTS' IDLE_CONNS=$IDLE_CONNS PROXY_NOFILE=$PROXY_NOFILE PROXY_HARD_NOFILE='$PROXY_HARD_NOFILE' RTTS=$RTTS MSG=$MSG SKIP='$SKIP'"

# The descriptor limits a proxy starts with, set in its subshell: soft
# PROXY_NOFILE and, with PROXY_HARD_NOFILE, that hard limit (the soft one
# lowered to it first: a soft limit above the hard one is refused).
proxy_limits() {
    if [ -z "$PROXY_HARD_NOFILE" ]; then
        ulimit -Sn "$PROXY_NOFILE"
        return
    fi
    local soft=$PROXY_NOFILE
    if [ "$soft" = unlimited ] || [ "$soft" -gt "$PROXY_HARD_NOFILE" ]; then
        soft=$PROXY_HARD_NOFILE
    fi
    ulimit -Sn "$soft" && ulimit -Hn "$PROXY_HARD_NOFILE"
}

# A peer server from bench/peers/costpeer: sets SERVER_ADDR, SERVER_PID.
start_server() {
    local out=$TMP/server-$1-$RANDOM.out
    ${LOAD_PREFIX[@]+"${LOAD_PREFIX[@]}"} "$PEER" "$@" >"$out" 2>&1 &
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
    SERVER_ADDR=$(wait_line "$out" 'listening on' | awk '{print $3}')
}

# start_target KIND UPSTREAM [tcp_proxy flags...]: starts one proxy, from a
# shell whose soft RLIMIT_NOFILE is $PROXY_NOFILE (and hard one
# $PROXY_HARD_NOFILE, if set: proxy_limits), on a free port; sets
# PROXY_ADDR, PROXY_PID (empty for direct) and PROXY_LOG. KIND is direct,
# tcp_proxy:MODE (MODE "default": no --mode), haproxy, haproxy-splice or go.
start_target() {
    local kind=$1 up=$2 port
    shift 2
    PROXY_LOG=$TMP/proxy-$RANDOM.log
    : >"$PROXY_LOG"
    if [ "$kind" = direct ]; then
        PROXY_ADDR=$up PROXY_PID=""
        return 0
    fi
    port=$(free_port)
    case $kind in
        tcp_proxy:*)
            local mode=${kind#tcp_proxy:}
            [ "$mode" = default ] && mode=""
            (proxy_limits && exec ${LIMIT_PREFIX[@]+"${LIMIT_PREFIX[@]}"} ${PROXY_PREFIX[@]+"${PROXY_PREFIX[@]}"} "$BIN" --listen "127.0.0.1:$port" --upstream "$up" \
                ${mode:+--mode "$mode"} "$@") >"$PROXY_LOG" 2>&1 &
            ;;
        haproxy | haproxy-splice)
            local cfg=$TMP/haproxy-$port.cfg maxconn=${HAPROXY_MAXCONN-4096}
            # Under PROXY_HARD_NOFILE, none unless one is given: HAProxy
            # refuses to start with a maxconn the limit cannot hold.
            [ -n "$PROXY_HARD_NOFILE" ] && [ -z "${HAPROXY_MAXCONN+set}" ] && maxconn=""
            haproxy_cfg "$cfg" "$port" "$up" "$maxconn" 300s \
                "$([ "$kind" = haproxy-splice ] && echo "option splice-auto")"
            (proxy_limits && exec ${LIMIT_PREFIX[@]+"${LIMIT_PREFIX[@]}"} ${PROXY_PREFIX[@]+"${PROXY_PREFIX[@]}"} haproxy -db -f "$cfg") >"$PROXY_LOG" 2>&1 &
            ;;
        go)
            (proxy_limits && exec ${LIMIT_PREFIX[@]+"${LIMIT_PREFIX[@]}"} ${PROXY_PREFIX[@]+"${PROXY_PREFIX[@]}"} "$GO_PROXY" -listen "127.0.0.1:$port" -upstream "$up") >"$PROXY_LOG" 2>&1 &
            ;;
        *) echo "unknown target $kind" >&2; return 1 ;;
    esac
    PROXY_PID=$!
    PIDS+=("$PROXY_PID")
    PROXY_ADDR=127.0.0.1:$port
    wait_port "$port" || return 1
}

# utime + stime of process $1 (all its threads, living and dead), in ticks.
cpu_ticks() {
    [ -z "$1" ] && { echo 0; return; }
    local s
    s=$(cat "/proc/$1/stat")
    s=${s##*) }
    # shellcheck disable=SC2086 # split on purpose: the fields of stat
    set -- $s
    echo $((${12} + ${13}))
}

# The label of a target in the tables.
label() {
    case $1 in
        direct) echo "direct (no proxy)" ;;
        tcp_proxy:default) echo "tcp_proxy default" ;;
        tcp_proxy:*) echo "tcp_proxy ${1#tcp_proxy:}" ;;
        haproxy) echo "HAProxy (mode tcp)" ;;
        haproxy-splice) echo "HAProxy splice-auto" ;;
        go) echo "Go io.Copy proxy" ;;
    esac
}

record() { printf '%s\t%s\t%s\t%s\n' "$@" >>"$RESULTS"; }

PEERS=(haproxy haproxy-splice go)

# ------------------------------------------------------------------ cpu
if ! skip cpu; then
    targets=()
    for m in $MODES; do targets+=("tcp_proxy:$m"); done
    targets+=("${PEERS[@]}" direct)
    iport=$(free_port)
    iperf3 -s -p "$iport" >/dev/null 2>&1 &
    IPID=$!
    PIDS+=("$IPID")
    wait_port "$iport"
    log "cpu: ${#targets[@]} targets x rates '$RATES' x $CPU_ROUNDS rounds of ${CPU_SECONDS}s"
    for round in $(seq "$CPU_ROUNDS"); do
        # Interleaved, and every other round in reverse: no target always
        # runs first or last.
        order=("${targets[@]}")
        if [ $((round % 2)) = 0 ]; then
            order=()
            for ((i = ${#targets[@]} - 1; i >= 0; i--)); do order+=("${targets[$i]}"); done
        fi
        for t in "${order[@]}"; do
            if ! start_target "$t" "127.0.0.1:$iport"; then
                log "cpu: $t did not start: $(head -c 300 "$PROXY_LOG")"
                record cpu "$t" "${RATES%% *}" fail
                continue
            fi
            for rate in $RATES; do
                c0=$(cpu_ticks "$PROXY_PID")
                json=$TMP/iperf.json
                if ! timeout $((CPU_SECONDS + 20)) iperf3 -c 127.0.0.1 -p "${PROXY_ADDR##*:}" -t "$CPU_SECONDS" -b "$rate" -J >"$json" 2>/dev/null; then
                    log "cpu: iperf3 through $t at $rate failed"
                    record cpu "$t" "$rate" "fail"
                    continue
                fi
                c1=$(cpu_ticks "$PROXY_PID")
                bytes=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["end"]["sum_received"]["bytes"])' "$json")
                record cpu "$t" "$rate" "$(python3 -c "print($c1 - $c0, $TICK, $bytes, $CPU_SECONDS)")"
            done
            [ -n "$PROXY_PID" ] && stop "$PROXY_PID"
        done
    done
    stop "$IPID"
fi

# ------------------------------------------------------------------ cps
# Two layouts: "pinned", every proxy on CPU 0 and wrk with its server on
# the other CPUs (taskset), so that what the proxy costs is not a race
# with the load for the same cores; and "shared", nobody pinned, what a
# user sees who runs everything on one small machine.
if ! skip cps; then
  for layout in $CPS_LAYOUTS; do
    part=cps
    PROXY_PREFIX=() LOAD_PREFIX=()
    if [ "$layout" = pinned ]; then
        part=cps-pinned
        PROXY_PREFIX=(taskset -c 0) LOAD_PREFIX=(taskset -c "1-$((NCPU - 1))")
    fi
    start_server http -size "$CPS_BYTES"
    HTTP_PID=$SERVER_PID HTTP_ADDR=$SERVER_ADDR
    log "cps ($layout): wrk -t1 -c$CPS_CONNS -d${CPS_SECONDS}s -H 'Connection: close', $CPS_ROUNDS rounds"
    targets=(tcp_proxy:default "${PEERS[@]}" direct)
    for round in $(seq "$CPS_ROUNDS"); do
        # Each round starts one target later, so that no target always
        # runs first, or always right after the same one.
        off=$(((round - 1) % ${#targets[@]}))
        for t in "${targets[@]:off}" "${targets[@]:0:off}"; do
            if ! start_target "$t" "$HTTP_ADDR"; then
                log "cps: $t did not start: $(head -c 300 "$PROXY_LOG")"
                record "$part" "$t" "$round" fail
                continue
            fi
            c0=$(cpu_ticks "$PROXY_PID")
            out=$TMP/wrk.out
            timeout $((CPS_SECONDS + 30)) ${LOAD_PREFIX[@]+"${LOAD_PREFIX[@]}"} wrk -t1 -c"$CPS_CONNS" -d"${CPS_SECONDS}s" --timeout 5s \
                -H 'Connection: close' "http://$PROXY_ADDR/" >"$out" 2>&1 || true
            c1=$(cpu_ticks "$PROXY_PID")
            record "$part" "$t" "$round" "$(python3 - "$out" $((c1 - c0)) "$TICK" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"(\d+) requests in ([\d.]+)(m?s)", text)
if not m:
    print("fail"); sys.exit()
n, d = int(m.group(1)), float(m.group(2)) / (1000 if m.group(3) == "ms" else 1)
errs = sum(int(x) for x in re.findall(r"(?:connect|read|write|timeout) (\d+)", text))
non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
errs += int(non2xx.group(1)) if non2xx else 0
print(n, d, int(sys.argv[2]) / int(sys.argv[3]), errs)
EOF
)"
            if [ -n "$PROXY_PID" ]; then
                stop "$PROXY_PID"
                # Let the TIME_WAITs of one target not slow the next one's
                # connects.
                sleep 1
            fi
        done
    done
    stop "$HTTP_PID"
  done
fi

# ------------------------------------------------------------------ idle
if ! skip idle; then
    start_server echo
    ECHO_PID=$SERVER_PID ECHO_ADDR=$SERVER_ADDR
    log "idle: $IDLE_CONNS idle connections per target, proxies under soft RLIMIT_NOFILE $PROXY_NOFILE${PROXY_HARD_NOFILE:+ and hard $PROXY_HARD_NOFILE}"
    # HAProxy refuses to start when the fds its maxconn needs (2 per
    # connection and a few) are above the hard limit, which it cannot
    # raise: there, it gets the largest maxconn that fits, and serves fewer.
    # With splice-auto it counts a pipe (two fds) for every fourth
    # connection too (maxpipes = maxconn / 4).
    HAPROXY_IDLE_MAXCONN=$((IDLE_CONNS + 64))
    HAPROXY_SPLICE_IDLE_MAXCONN=$HAPROXY_IDLE_MAXCONN
    hard=${PROXY_HARD_NOFILE:-$(ulimit -Hn)}
    if [ -n "$PROXY_HARD_NOFILE" ]; then
        # A hard limit no proxy may raise: HAProxy sizes its maxconn to it
        # (and its maxpipes to a quarter of that with splice-auto), as it
        # does for a user who sets none.
        HAPROXY_IDLE_MAXCONN="" HAPROXY_SPLICE_IDLE_MAXCONN=""
        log "idle: hard RLIMIT_NOFILE $hard for every proxy: HAProxy gets no maxconn and sizes it to the limit"
    elif [ "$hard" != unlimited ]; then
        if [ $((2 * HAPROXY_IDLE_MAXCONN + 100)) -gt "$hard" ]; then
            HAPROXY_IDLE_MAXCONN=$(((hard - 100) / 2))
        fi
        if [ $((5 * HAPROXY_SPLICE_IDLE_MAXCONN / 2 + 100)) -gt "$hard" ]; then
            HAPROXY_SPLICE_IDLE_MAXCONN=$(((hard - 100) * 2 / 5))
        fi
        if [ "$HAPROXY_SPLICE_IDLE_MAXCONN" -le "$IDLE_CONNS" ]; then
            log "idle: hard RLIMIT_NOFILE $hard: HAProxy gets maxconn $HAPROXY_IDLE_MAXCONN, with splice-auto $HAPROXY_SPLICE_IDLE_MAXCONN"
        fi
    fi
    # tcp_proxy twice: under the soft limit like the others, and (the row
    # "+hard") from a shell that raised it to the hard limit, what it does
    # once it raises its own limit.
    for t in direct tcp_proxy:default tcp_proxy:default+hard "${PEERS[@]}"; do
        # Soft = hard already: the row would repeat the one before.
        [ "$t" = tcp_proxy:default+hard ] && [ "$PROXY_NOFILE" = "$hard" ] && continue
        started=yes
        # shellcheck disable=SC2086 # a list of flags
        case $t in
            *+hard) PROXY_NOFILE=$hard start_target "${t%+hard}" "$ECHO_ADDR" $IDLE_TCP_PROXY_FLAGS || started=no ;;
            tcp_proxy:*) start_target "$t" "$ECHO_ADDR" $IDLE_TCP_PROXY_FLAGS || started=no ;;
            haproxy-splice) HAPROXY_MAXCONN=$HAPROXY_SPLICE_IDLE_MAXCONN start_target "$t" "$ECHO_ADDR" || started=no ;;
            *) HAPROXY_MAXCONN=$HAPROXY_IDLE_MAXCONN start_target "$t" "$ECHO_ADDR" || started=no ;;
        esac
        if [ $started = no ]; then
            log "idle: $t did not start: $(head -c 300 "$PROXY_LOG")"
            record idle "$t" '{}' "alive=did not start|$(grep -v NOTICE "$PROXY_LOG" | head -2 | tr '\n' ' ' | cut -c1-200)"
            [ -n "$PROXY_PID" ] && stop "$PROXY_PID"
            continue
        fi
        hold=$TMP/hold.json
        timeout 240 "$PEER" hold -addr "$PROXY_ADDR" -n "$IDLE_CONNS" -pid "${PROXY_PID:-0}" \
            -msg "$MSG" -rtts "$RTTS" >"$hold" 2>"$hold.err" || log "idle: hold through $t exited $?"
        alive=yes
        [ -n "$PROXY_PID" ] && ! kill -0 "$PROXY_PID" 2>/dev/null && alive=no
        # What the proxy said about connections it could not serve: lines
        # counted by kind, so that a flood of them stays one line here.
        complaints=$(sed -E 's/^tcp_proxy: //; s/^[0-9/]+ [0-9:]+ //; s/conn [0-9]+ from [0-9.:]+:? //; s/ \(os error [0-9]+\)//;
                s/ after [0-9.]+ s.*//; s/; closed the client//; s/[0-9]+([.][0-9]+){3}:[0-9]+/ADDR/g' "$PROXY_LOG" |
            grep -v -E '^(closed|listening|tcp_proxy listening|\[NOTICE\])' | cut -c1-70 | sort | uniq -c | sort -rn | head -4 |
            awk '{n = $1; $1 = ""; printf "%s%dx%s", (NR > 1 ? "; " : ""), n, $0}' || true)
        record idle "$t" "$(cat "$hold" 2>/dev/null || echo '{}')" "alive=$alive|$complaints"
        [ -n "$PROXY_PID" ] && stop "$PROXY_PID"
    done
    stop "$ECHO_PID"
fi

# ------------------------------------------------------------------ pipes
if ! skip pipes; then
    log "pipes: tcp_proxy default with $PIPES_CONNS connections, $PIPES_BUSY of them busy"
    timeout 300 python3 bench/peers/splice_pipes.py "$BIN" "$PIPES_CONNS" "$PIPES_BUSY" >"$TMP/pipes.out" 2>&1 ||
        log "pipes: exited $?"
    record pipes tcp_proxy:default "-" "$(awk 'BEGIN { ORS = "\\n" } 1' "$TMP/pipes.out")"
fi

log "done in $(($(date +%s) - T0)) s; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "== results (paste into docs/benchmarks.md)"
if [ -n "$PROXY_HARD_NOFILE" ]; then
    HAPROXY_IDLE_MAXCONN_TEXT="none set (it sizes it to the limit)"
else
    HAPROXY_IDLE_MAXCONN_TEXT="${HAPROXY_IDLE_MAXCONN:-}, with splice-auto ${HAPROXY_SPLICE_IDLE_MAXCONN:-}"
fi
python3 bench/peers/cost_report.py "$RESULTS" "$IDLE_CONNS" "$PROXY_NOFILE" "$IDLE_TCP_PROXY_FLAGS" "$(($(date +%s) - T0))" \
    "$HAPROXY_IDLE_MAXCONN_TEXT" "${PROXY_HARD_NOFILE:-$(ulimit -Hn)}" "$PROXY_HARD_NOFILE"
