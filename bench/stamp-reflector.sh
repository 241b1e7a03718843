#!/usr/bin/env bash
# What a STAMP reflector costs: `udp_server --stamp` against stamp-suite's
# reflector (`--is-reflector --stateful-reflector`: both number each
# session's answers), under the same load in the same run, interleaved
# round by round, on loopback only.
#
# The load is bench/stamp-load.c (built here with cc): STAMP test packets
# from SOCKETS sockets, each its own session, either at a steady offered
# rate (open loop) or with a window of packets in flight per socket
# (closed loop: as fast as the reflector answers). Each case runs SECS
# seconds against a freshly started reflector; the reflector is pinned to
# one CPU and the load to the other (taskset), so neither steals the
# other's core.
#
# Printed per case and reflector: answers per second (the median of the
# rounds) and CPU seconds per million answers, CPU being utime + stime of
# the whole reflector process from /proc/PID/stat over the case (all its
# threads; netspeed's includes its idle UDP listener). Then the ratio
# netspeed / stamp-suite. The raw rows are kept as HTML comments.
#
#   bash bench/stamp-reflector.sh
#   ROUNDS=5 SECS=5 CASES='open:20000 open:50000 closed:64' bash bench/stamp-reflector.sh
#
# stamp-suite is found at STAMP_SUITE, on PATH, or in
# STAMP_SUITE_ROOT/bin (default /opt/stamp-suite), and installed there the
# way CI does when missing:
#   cargo install stamp-suite --version 1.0.0 --locked --root STAMP_SUITE_ROOT
# Its code is never copied into this repository.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ROUNDS=${ROUNDS:-3}
SECS=${SECS:-5}
SOCKETS=${SOCKETS:-4}
SIZE=${SIZE:-44}
CASES=${CASES:-open:20000 open:50000 closed:64}
REFLECTOR_CPU=${REFLECTOR_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
STAMP_SUITE_ROOT=${STAMP_SUITE_ROOT:-/opt/stamp-suite}

log() { echo "# $*" >&2; }

bench_tmp stamp-reflector
netspeed_bins

if [[ -z ${STAMP_SUITE:-} ]]; then
    STAMP_SUITE=$(command -v stamp-suite || true)
fi
if [[ -z $STAMP_SUITE ]]; then
    STAMP_SUITE=$STAMP_SUITE_ROOT/bin/stamp-suite
    if [[ ! -x $STAMP_SUITE ]]; then
        log "installing stamp-suite 1.0.0 into $STAMP_SUITE_ROOT"
        cargo install stamp-suite --version 1.0.0 --locked --root "$STAMP_SUITE_ROOT" -q
    fi
fi
log "stamp-suite: $STAMP_SUITE ($("$STAMP_SUITE" --version 2>/dev/null || echo unknown version))"

cc -O2 -o "$TMP/stamp-load" bench/stamp-load.c
PIN_R=() PIN_L=()
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
    PIN_R=(taskset -c "$REFLECTOR_CPU")
    PIN_L=(taskset -c "$LOAD_CPU")
fi

# utime + stime of a process, in clock ticks.
ticks() {
    awk '{ print $14 + $15 }' "/proc/$1/stat"
}
HZ=$(getconf CLK_TCK)

# start_reflector NAME PORT: starts it pinned, waits until it listens; sets RPID.
start_reflector() {
    local out=$TMP/$1.$2.log
    case $1 in
    netspeed)
        "${PIN_R[@]}" "$NETSPEED_BIN_DIR/udp_server" --listen 127.0.0.1:0 --interval 0 \
            --stamp "127.0.0.1:$2" --stamp-max-per-source 4000000000 \
            --stamp-max-per-prefix 4000000000 --stamp-max-total 4000000000 >"$out" 2>&1 &
        RPID=$!
        PIDS+=("$RPID")
        wait_line "$out" "STAMP reflector on 127.0.0.1:$2" >/dev/null
        ;;
    stamp-suite)
        NO_COLOR=1 "${PIN_R[@]}" "$STAMP_SUITE" --is-reflector --stateful-reflector \
            --local-addr 127.0.0.1 --local-port "$2" >"$out" 2>&1 &
        RPID=$!
        PIDS+=("$RPID")
        wait_line "$out" "STAMP Reflector listening on 127.0.0.1:$2" >/dev/null
        ;;
    esac
}

ROWS=$TMP/rows
: >"$ROWS"
log "$ROUNDS rounds of: $CASES; ${SECS}s each, $SOCKETS sockets, $SIZE-byte packets"
for round in $(seq "$ROUNDS"); do
    # Interleaved, and each round starts with the other one.
    if ((round % 2)); then order="netspeed stamp-suite"; else order="stamp-suite netspeed"; fi
    for case in $CASES; do
        mode=${case%%:*} param=${case#*:}
        for who in $order; do
            port=$(free_port)
            start_reflector "$who" "$port"
            before=$(ticks "$RPID")
            load=$("${PIN_L[@]}" "$TMP/stamp-load" 127.0.0.1 "$port" "$mode" "$param" "$SECS" "$SOCKETS" "$SIZE")
            after=$(ticks "$RPID")
            stop "$RPID"
            echo "$round $case $who $((after - before)) $load" >>"$ROWS"
            log "round $round $case $who: cpu $((after - before)) ticks, $load"
        done
    done
done

python3 - "$ROWS" "$HZ" <<'EOF'
import json, statistics, sys
rows, hz = sys.argv[1], int(sys.argv[2])
by = {}
order = []
for line in open(rows):
    rnd, case, who, ticks, load = line.split(" ", 4)
    load = json.loads(load)
    cpu = int(ticks) / hz
    answered = load["answered"]
    by.setdefault((case, who), []).append(
        (answered / load["seconds"], cpu * 1e6 / answered if answered else float("inf"), load["sent"] / load["seconds"]))
    if case not in order:
        order.append(case)
def med(xs):
    return statistics.median(xs)
print("| load | reflector | offered/s | answers/s | CPU-s per million answers |")
print("|---|---|---:|---:|---:|")
for case in order:
    for who in ("netspeed", "stamp-suite"):
        r = by[(case, who)]
        print(f"| {case} | {who} | {med([x[2] for x in r]):,.0f} | {med([x[0] for x in r]):,.0f} | {med([x[1] for x in r]):.2f} |")
print()
print("| load | answers/s netspeed / stamp-suite | CPU per answer netspeed / stamp-suite |")
print("|---|---:|---:|")
for case in order:
    n, s = by[(case, "netspeed")], by[(case, "stamp-suite")]
    print(f"| {case} | {med([x[0] for x in n]) / med([x[0] for x in s]):.2f}x | {med([x[1] for x in n]) / med([x[1] for x in s]):.2f}x |")
print()
for line in open(rows):
    print(f"<!-- {line.strip()} -->")
EOF
