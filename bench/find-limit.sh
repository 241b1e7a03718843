#!/usr/bin/env bash
# `udp_client --find-limit` on loopback and across a namespace pair behind
# an nftables policer, each beside what iperf3 reports when asked to send
# at the rate found (same datagram size, same length).
#
#   bash bench/find-limit.sh               # from the repo root, as root
#
# Knobs (environment):
#   SIZE      datagram payload, bytes                 (default 1460)
#   TRIAL     --trial-duration, whole seconds          (default 2)
#   POLICE    the policer's rate, nft units            (default "2 mbytes")
#   SECS      iperf3's run at the found rate, seconds (default TRIAL: a
#             policer's bucket lets a short run through faster than a long
#             one, see docs/output.md "Policers")
#   IPERF3    iperf3 binary                            (default iperf3)
#
# Only 127.0.0.1 and the 10.68.0.0/24 pair this script creates are used;
# every process is bounded by `timeout`, and the namespaces are deleted on
# exit. Progress goes to stderr; stdout is markdown for docs/benchmarks.md.
set -euo pipefail

SIZE=${SIZE:-1460}
TRIAL=${TRIAL:-2}
POLICE=${POLICE:-"2 mbytes"}
SECS=${SECS:-$TRIAL}
[[ $TRIAL =~ ^[1-9][0-9]*$ ]] || { echo "TRIAL must be whole seconds" >&2; exit 1; }
IPERF3=${IPERF3:-iperf3}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
SERVER_BIN=target/release/udp_server
CLIENT_BIN=target/release/udp_client
SRV=nsfl-srv-$$
CLI=nsfl-cli-$$

log() { printf '[find-limit] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
[[ $(id -u) == 0 ]] || die "needs root (network namespaces)"
command -v "$IPERF3" >/dev/null || die "no $IPERF3: apt-get install iperf3"
command -v nft >/dev/null || die "no nft: apt-get install nftables"

PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    ip netns del "$SRV" 2>/dev/null || true
    ip netns del "$CLI" 2>/dev/null || true
}
trap cleanup EXIT

log "building"
cargo build --release --quiet --bin udp_server --bin udp_client

# rate_bps, first_loss_at_bps, first_loss_cause and trials of a report.
summary() {
    python3 -c '
import json, sys
l = json.load(sys.stdin)["limit"]
print(l["rate_bps"] or 0, l["first_loss_at_bps"] or 0, l["first_loss_cause"], l["trials"], l["unpaced_bps"])'
}

# iperf3 -u at RATE bit/s in namespace NS (or here) to HOST: the receiver's
# Gbit/s and loss %.
iperf_at() {
    local ns=$1 host=$2 rate=$3
    local exec=()
    [[ -n $ns ]] && exec=(ip netns exec "$ns")
    "${exec[@]}" timeout $((SECS + 20)) "$IPERF3" -c "$host" -p 5299 -u -l "$SIZE" \
        -b "$rate" -t "$SECS" -J |
        python3 -c '
import json, sys
s = json.load(sys.stdin)["end"]["sum"]
print("%.4f %.3f" % (s["bits_per_second"] / 1e9, s["lost_percent"]))'
}

row() { # name, limit report summary, iperf3 result
    local name=$1 rate first cause trials unpaced gbps loss
    read -r rate first cause trials unpaced <<<"$2"
    read -r gbps loss <<<"$3"
    awk -v n="$name" -v r="$rate" -v f="$first" -v c="$cause" -v t="$trials" -v u="$unpaced" \
        -v g="$gbps" -v l="$loss" \
        'BEGIN { printf "| %s | %.4f | %.4f | %s | %s | %.3f | %s | %s |\n", n, r / 1e9, f / 1e9, c, t, u / 1e9, g, l }'
}

echo "Command: \`SIZE=$SIZE TRIAL=$TRIAL POLICE='$POLICE' SECS=$SECS bash bench/find-limit.sh\`"
echo "Machine: $(nproc) CPUs, $(uname -sr), $("$IPERF3" --version | head -1)"
echo
echo "| path | no-drop Gbit/s | first loss at | cause | trials | unpaced Gbit/s | iperf3 at the no-drop rate: received Gbit/s | iperf3 loss % |"
echo "|---|---|---|---|---|---|---|---|"

# 1. Loopback.
log "loopback: find-limit"
timeout 30m "$SERVER_BIN" --listen 127.0.0.1:35999 --interval 0 --recv-buffer-size 4M >/dev/null &
PIDS+=($!)
sleep 0.5
loop=$(timeout 30m "$CLIENT_BIN" -s 127.0.0.1:35999 -b "$SIZE" --find-limit \
    --trial-duration "${TRIAL}s" --json | summary)
log "loopback: $loop"
timeout $((SECS + 30)) "$IPERF3" -s -1 -p 5299 -B 127.0.0.1 >/dev/null 2>&1 &
PIDS+=($!)
sleep 0.5
row "loopback" "$loop" "$(iperf_at "" 127.0.0.1 "$(echo "$loop" | cut -d' ' -f1)")"

# 2. A namespace pair, with a policer on the server host's input.
log "namespaces: setting up 10.68.0.1 <-> 10.68.0.2, policer $POLICE/second"
ip netns add "$SRV"
ip netns add "$CLI"
ip -n "$SRV" link set lo up
ip -n "$CLI" link set lo up
ip -n "$SRV" link add fl0 type veth peer name fl1 netns "$CLI"
ip -n "$SRV" addr add 10.68.0.1/24 dev fl0
ip -n "$CLI" addr add 10.68.0.2/24 dev fl1
ip -n "$SRV" link set fl0 up
ip -n "$CLI" link set fl1 up
ip netns exec "$SRV" nft -f - <<EOF
table inet police {
  chain input {
    type filter hook input priority 0; policy accept;
    udp length $((SIZE + 8)) limit rate over $POLICE/second burst 16 kbytes counter drop
  }
}
EOF
ip netns exec "$SRV" timeout 30m "$SERVER_BIN" --listen 10.68.0.1:35999 --interval 0 \
    --recv-buffer-size 4M >/dev/null &
PIDS+=($!)
sleep 0.5
log "namespaces: find-limit"
pair=$(ip netns exec "$CLI" timeout 30m "$CLIENT_BIN" -s 10.68.0.1:35999 -b "$SIZE" \
    --find-limit --trial-duration "${TRIAL}s" --trial-pause 1.2s --no-gso --json | summary)
log "namespaces: $pair"
sleep 1.2
ip netns exec "$SRV" timeout $((SECS + 30)) "$IPERF3" -s -1 -p 5299 -B 10.68.0.1 >/dev/null 2>&1 &
PIDS+=($!)
sleep 0.5
row "veth + nft policer $POLICE/s" "$pair" \
    "$(iperf_at "$CLI" 10.68.0.1 "$(echo "$pair" | cut -d' ' -f1)")"
