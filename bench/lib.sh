# The set-up the scripts in bench/ share: sourced, never run.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# Sourcing it moves to the repository root and sets ROOT. Everything else
# is a function or a variable a script calls or sets:
#
#   need_iperf3                 apt-get install iperf3 when "$IPERF3" is missing
#   apt_install_missing CMD[:PACKAGE]...   as root with apt-get, installs
#                               the packages of the commands not on PATH
#   netspeed_bins               builds udp_server and udp_client unless
#                               NETSPEED_BIN_DIR names a build; sets it
#   tcp_proxy_bin               builds tcp_proxy unless PROXY_BIN names
#                               one; sets BIN
#   go_peer NAME                builds bench/peers/NAME into $TMP/NAME with
#                               the standard library only
#   bench_tmp NAME              a scratch folder in TMP, and an EXIT trap
#                               that stops every pid in PIDS and removes it
#   free_port, wait_port PORT, wait_line FILE PATTERN, stop PID
#   haproxy_cfg FILE PORT UPSTREAM MAXCONN TIMEOUT [LINE]
#
# Python helpers for the scripts that measure in Python are in lib.py
# beside this file (`import lib` after putting bench/ on sys.path).

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

# Progress through the script's own log(), where it has one.
say() {
    if declare -F log >/dev/null; then log "$@"; fi
}

need_iperf3() {
    if ! command -v "$IPERF3" >/dev/null; then
        say "installing iperf3"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iperf3 >/dev/null
    fi
}

# apt_install_missing CMD[:PACKAGE]...: as root, where apt-get exists,
# installs the PACKAGE (default: CMD) of every CMD not on PATH; elsewhere
# does nothing.
apt_install_missing() {
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        return 0
    fi
    local spec missing=()
    for spec in "$@"; do
        command -v "${spec%%:*}" >/dev/null || missing+=("${spec#*:}")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        say "installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

netspeed_bins() {
    if [[ -z ${NETSPEED_BIN_DIR:-} ]]; then
        say "building netspeed (cargo build --release)"
        cargo build --release --bins -q
        NETSPEED_BIN_DIR=${CARGO_TARGET_DIR:-target}/release
    fi
}

tcp_proxy_bin() {
    BIN=${PROXY_BIN:-}
    if [ -z "$BIN" ]; then
        say "building tcp_proxy (cargo build --release)"
        cargo build --release --quiet --bin tcp_proxy
        BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/tcp_proxy
    fi
}

# go_peer NAME: builds bench/peers/NAME into $TMP/NAME. The standard
# library only: no module downloads, ever.
go_peer() {
    (cd "bench/peers/$1" && GOPROXY=off GOTOOLCHAIN=local GOFLAGS=-mod=mod \
        GOCACHE="$TMP/gocache" go build -o "$TMP/$1" .)
}

# bench_tmp NAME: TMP, a fresh folder /tmp/NAME.XXXXXX; PIDS, the pids to
# stop on exit; cleanup, the EXIT trap that stops them and removes TMP.
bench_tmp() {
    TMP=$(mktemp -d "/tmp/$1.XXXXXX")
    PIDS=()
    trap cleanup EXIT
}

cleanup() {
    local p
    for p in ${PIDS[@]+"${PIDS[@]}"}; do
        kill "$p" 2>/dev/null || true
    done
    for p in ${PIDS[@]+"${PIDS[@]}"}; do
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$TMP"
}

# A free loopback port, for a server that cannot report one it picked.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits (at most 10 s) until 127.0.0.1:$1 accepts connections.
wait_port() {
    for _ in $(seq 200); do
        if python3 -c "import socket; socket.create_connection(('127.0.0.1', $1), 0.2).close()" 2>/dev/null; then
            return 0
        fi
        sleep 0.05
    done
    echo "nothing listening on port $1 after 10 s" >&2
    return 1
}

# Waits (at most 10 s) for the first line of file $1 matching $2; prints it.
wait_line() {
    for _ in $(seq 200); do
        if grep -m1 -- "$2" "$1" 2>/dev/null; then
            return 0
        fi
        sleep 0.05
    done
    echo "no '$2' in $1 after 10 s:" >&2
    cat "$1" >&2
    return 1
}

stop() {
    kill "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}

# haproxy_cfg FILE PORT UPSTREAM MAXCONN TIMEOUT [LINE]: a `mode tcp`
# HAProxy listening on 127.0.0.1:PORT in front of UPSTREAM, with client and
# server time-outs of TIMEOUT and LINE (e.g. "option splice-auto") added
# to its listen section. An empty MAXCONN sets none: HAProxy then sizes
# it to its descriptor limit.
haproxy_cfg() {
    cat >"$1" <<EOF
global
${4:+    maxconn $4}

defaults
    mode tcp
    timeout connect 5s
    timeout client $5
    timeout server $5

listen bench
    bind 127.0.0.1:$2
${6:+    $6}
    server upstream $3
EOF
}
