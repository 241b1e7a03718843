#!/usr/bin/env python3
"""The tables of bench/proxy-cost.sh, in markdown, from its results file.

  cost_report.py RESULTS IDLE_CONNS PROXY_NOFILE IDLE_FLAGS SECONDS HAPROXY_MAXCONN HARD_NOFILE [PROXY_HARD_NOFILE]

PROXY_HARD_NOFILE, when not empty, is the hard limit every proxy was
started under and could not raise: the idle part is then "served under the
hard limit", and its goal is to serve at least as many as HAProxy.

RESULTS has one tab-separated row per measurement: part, target, key, value
(see bench/proxy-cost.sh for what each part writes).
"""
import json
import statistics
import sys

OURS = "tcp_proxy:default"
PEERS = [("haproxy", "HAProxy default"), ("haproxy-splice", "HAProxy splice-auto"), ("go", "Go")]
LABEL = {
    "direct": "direct (no proxy)",
    "haproxy": "HAProxy (mode tcp)",
    "haproxy-splice": "HAProxy (mode tcp, splice-auto)",
    "go": "Go io.Copy proxy (seed 004)",
}


def label(t):
    if t == OURS + "+hard":
        return "tcp_proxy default, started with soft = hard limit"
    if t in LABEL:
        return LABEL[t]
    mode = t.split(":", 1)[1]
    return "**tcp_proxy default** (splice)" if mode == "default" else f"tcp_proxy --mode {mode}"


def rate_name(r):
    return "unpaced" if r in ("0", "0G") else f"{r[:-1]} {r[-1]}bit/s" if r[-1] in "KMG" else f"{r} bit/s"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return "n/a"
    return f"{a / b:.2f}×"


def main():
    path, idle_n, nofile, idle_flags, seconds, hap_maxconn, hard = sys.argv[1:8]
    hard_fixed = sys.argv[8] if len(sys.argv) > 8 else ""
    rows = [line.rstrip("\n").split("\t", 3) for line in open(path) if line.strip()]
    goals = []

    # ---------------------------------------------------------------- cpu
    cpu = {}
    targets, rates = [], []
    for part, t, key, val in rows:
        if part != "cpu":
            continue
        if t not in targets:
            targets.append(t)
        if key not in rates:
            rates.append(key)
        if val == "fail":
            cpu.setdefault((t, key), [])
            continue
        ticks, tick, nbytes, secs = val.split()
        cpu_s, gb = int(ticks) / int(tick), int(nbytes) / 1e9
        cpu.setdefault((t, key), []).append((cpu_s / gb if gb else float("nan"), int(nbytes) * 8 / float(secs) / 1e9))
    if cpu:
        # Tables with a fixed order: ours, then the peers, then direct.
        targets.sort(key=lambda t: (0 if t == OURS else 1 if t.startswith("tcp_proxy") else 3 if t == "direct" else 2))

        def med(t, r, i):
            v = cpu.get((t, r))
            return statistics.median(x[i] for x in v) if v else None

        print("### CPU-seconds per GB forwarded (the proxy process alone)\n")
        print("iperf3 TCP, one stream, `-b` rate; median of the rounds; in brackets the rate iperf3 reached (Gbit/s).\n")
        print("| target | " + " | ".join(rate_name(r) for r in rates) + " |")
        print("|---|" + "---:|" * len(rates))
        for t in targets:
            cells = []
            for r in rates:
                c, g = med(t, r, 0), med(t, r, 1)
                if c is None:
                    cells.append("failed")
                elif t == "direct":
                    cells.append(f"— ({g:.2f})")
                else:
                    cells.append(f"{c:.3f} ({g:.2f})")
            print(f"| {label(t)} | " + " | ".join(cells) + " |")
        for peer, name in PEERS:
            if any((peer, r) in cpu for r in rates):
                print(f"| *tcp_proxy default / {name}* | " + " | ".join(
                    f"**{ratio(med(OURS, r, 0), med(peer, r, 0))}**" for r in rates) + " |")
        print()
        met1 = [r for r in rates if med(OURS, r, 0) is not None and med("haproxy", r, 0)
                and med(OURS, r, 0) <= 0.5 * med("haproxy", r, 0)]
        met2 = [r for r in rates if med(OURS, r, 0) is not None and med("haproxy-splice", r, 0)
                and med(OURS, r, 0) <= med("haproxy-splice", r, 0)]
        names = lambda rs: ", ".join(rate_name(r) for r in rs) or "none"
        goals.append(("CPU per GB at most 0.5× HAProxy's default", len(met1) == len(rates),
                      f"met at {names(met1)} of {len(rates)} rates; ratios "
                      + ", ".join(f"{rate_name(r)} {ratio(med(OURS, r, 0), med('haproxy', r, 0))}" for r in rates)))
        goals.append(("CPU per GB at most HAProxy with splice-auto", len(met2) == len(rates),
                      f"met at {names(met2)}; ratios "
                      + ", ".join(f"{rate_name(r)} {ratio(med(OURS, r, 0), med('haproxy-splice', r, 0))}" for r in rates)))

    # ---------------------------------------------------------------- cps
    layouts = [
        ("cps-pinned", "each proxy pinned to CPU 0, wrk and its server on the other CPUs",
         "with the proxy on its own CPU"),
        ("cps", "nobody pinned: the proxy shares the CPUs with wrk and its server",
         "sharing the CPUs with the load"),
    ]
    for part_name, how, goal_how in layouts:
        cps = {}
        for part, t, key, val in rows:
            if part == part_name:
                cps.setdefault(t, [])
                if val != "fail":
                    n, d, cpu_s, errs = val.split()
                    cps[t].append((int(n) / float(d), float(cpu_s) / (int(n) / 1000) if int(n) else float("nan"), int(errs)))
        if not cps:
            continue

        def cmed(t, i, cps=cps):
            return statistics.median(x[i] for x in cps[t]) if cps.get(t) else None

        print(f"### Connections per second, {how} (wrk, `Connection: close`, a ~1 KiB response each)\n")
        print("| target | connections/s | proxy CPU-ms per 1,000 connections | wrk errors (all rounds) |")
        print("|---|---:|---:|---:|")
        for t in cps:
            if not cps[t]:
                print(f"| {label(t)} | failed | | |")
                continue
            cpu_cell = "—" if t == "direct" else f"{cmed(t, 1) * 1000:.1f}"
            print(f"| {label(t)} | {cmed(t, 0):,.0f} | {cpu_cell} | {sum(x[2] for x in cps[t])} |")
        for peer, name in PEERS:
            if cps.get(peer):
                print(f"| *tcp_proxy default / {name}* | **{ratio(cmed(OURS, 0), cmed(peer, 0))}** | "
                      f"**{ratio(cmed(OURS, 1), cmed(peer, 1))}** | |")
        print()
        if cps.get(OURS) and cps.get("haproxy"):
            goals.append((f"connections per second at least 1.0× HAProxy, {goal_how}",
                          cmed(OURS, 0) >= cmed("haproxy", 0),
                          f"{ratio(cmed(OURS, 0), cmed('haproxy', 0))} (CPU per 1,000 connections: "
                          f"{ratio(cmed(OURS, 1), cmed('haproxy', 1))})"))

    # ---------------------------------------------------------------- idle
    idle = {}
    notes = {}
    for part, t, key, val in rows:
        if part == "idle":
            try:
                idle[t] = json.loads(key)
            except ValueError:
                idle[t] = {}
            notes[t] = val
    if idle:
        if hard_fixed:
            print(f"### Served under a hard limit of {hard_fixed}: {int(idle_n):,} idle connections, every proxy "
                  f"started under `ulimit -Sn {nofile}` and `ulimit -Hn {hard_fixed}`, without CAP_SYS_RESOURCE\n")
        else:
            print(f"### {int(idle_n):,} idle connections, every proxy started under `ulimit -Sn {nofile}`\n")
        print(f"tcp_proxy with `{idle_flags}`; HAProxy's maxconn: {hap_maxconn}; the hard RLIMIT_NOFILE is {hard}"
              + (f", so no proxy with two sockets per connection can hold {int(idle_n):,} here" if hard.isdigit() and int(hard) < 2 * int(idle_n) + 20 else "")
              + ". A connection is served when one 8-byte echo came back through it; latency is a ping-pong "
              "over one more connection, opened first; the time is how long opening them all took.\n")
        print("| target | served | time | not served (why) | RSS per idle connection | fds per idle connection "
              "| RTT p50 / p99, no idle | RTT p50 / p99, idle open | added p50 / p99 vs direct | proxy still running |")
        print("|---|---:|---:|---|---:|---:|---:|---:|---:|---|")
        direct = idle.get("direct", {}).get("rtt_idle_open", {})

        def per(d, a, b):
            s = d.get("served") or 0
            if not s or d.get(a) in (None, 0, -1):
                return None
            return (d[b] - d[a]) / s

        def rtt(r):
            return f"{r['p50_us']:.0f} / {r['p99_us']:.0f} µs" if r and r.get("n") else "failed"

        for t, d in idle.items():
            alive, _, complaints = notes[t].partition("|")
            failed = d.get("failed") or {}
            why = ", ".join(f"{v} {k}" for k, v in sorted(failed.items(), key=lambda kv: -kv[1])) or "—"
            if d.get("served") is not None and d.get("alive_after") is not None and d["alive_after"] < d["served"]:
                why += f"; {d['served'] - d['alive_after']} died later"
            if complaints:
                why += f"; the proxy said: {complaints}"
            rss = per(d, "rss_before_kib", "rss_open_kib")
            fds = per(d, "fds_before", "fds_open")
            r1 = d.get("rtt_idle_open", {})
            added = (f"+{r1['p50_us'] - direct['p50_us']:.0f} / +{r1['p99_us'] - direct['p99_us']:.0f} µs"
                     if t != "direct" and r1.get("n") and direct.get("n") else "—")
            secs = f"{d['open_seconds']:.1f} s" if "open_seconds" in d else "—"
            print(f"| {label(t)} | {d.get('served', 0):,} of {int(d.get('target', idle_n)):,} | {secs} | {why} | "
                  f"{'—' if t == 'direct' else ('%.1f KiB' % rss if rss is not None else 'n/a')} | "
                  f"{'—' if t == 'direct' else ('%.2f' % fds if fds is not None else 'n/a')} | "
                  f"{rtt(d.get('rtt_no_idle'))} | {rtt(r1)} | {added} | {alive.replace('alive=', '')} |")
        ours, hap = idle.get(OURS, {}), idle.get("haproxy", {})
        rows_r = []
        for peer, name in PEERS:
            p = idle.get(peer)
            if p is None:
                continue
            a, b = per(ours, "rss_before_kib", "rss_open_kib"), per(p, "rss_before_kib", "rss_open_kib")
            fa, fb = per(ours, "fds_before", "fds_open"), per(p, "fds_before", "fds_open")
            oa, ob = ours.get("rtt_idle_open", {}), p.get("rtt_idle_open", {})
            rows_r.append(f"| *tcp_proxy default / {name}* | {ratio(ours.get('served'), p.get('served'))} | | | "
                          f"**{ratio(a, b)}** | {ratio(fa, fb)} | | "
                          f"{ratio(oa.get('p50_us'), ob.get('p50_us'))} / {ratio(oa.get('p99_us'), ob.get('p99_us'))} | | |")
        raised = idle.get(OURS + "+hard")
        if raised is not None and hap:
            a = per(raised, "rss_before_kib", "rss_open_kib")
            b = per(hap, "rss_before_kib", "rss_open_kib")
            fa, fb = per(raised, "fds_before", "fds_open"), per(hap, "fds_before", "fds_open")
            oa, ob = raised.get("rtt_idle_open", {}), hap.get("rtt_idle_open", {})
            rows_r.append(f"| *tcp_proxy soft = hard / HAProxy default* | {ratio(raised.get('served'), hap.get('served'))} | | | "
                          f"**{ratio(a, b)}** | {ratio(fa, fb)} | | "
                          f"{ratio(oa.get('p50_us'), ob.get('p50_us'))} / {ratio(oa.get('p99_us'), ob.get('p99_us'))} | | |")
        print("\n".join(rows_r))
        print()
        a, b = per(ours, "rss_before_kib", "rss_open_kib"), per(hap, "rss_before_kib", "rss_open_kib")
        raised = idle.get(OURS + "+hard", {})
        c = per(raised, "rss_before_kib", "rss_open_kib")
        if a is not None and b is not None:
            goals.append(("RSS per idle connection at most HAProxy's", a <= b and (c is None or c <= b),
                          f"{a:.1f} KiB against {b:.1f} KiB ({ratio(a, b)}), over {ours.get('served', 0):,} and "
                          f"{hap.get('served', 0):,} connections served"
                          + (f"; with the soft limit raised to the hard one, {c:.1f} KiB over "
                             f"{raised.get('served', 0):,} ({ratio(c, b)})" if c is not None else "")))
        n = int(idle_n)
        if hard_fixed:
            # Every proxy serves what the limit lets it; the bar is HAProxy's.
            s_ours, s_hap = ours.get("served") or 0, hap.get("served") or 0
            alive = ours.get("alive_after") == s_ours and notes.get(OURS, "").startswith("alive=yes")
            goals.append((f"served under a hard limit of {hard_fixed}: at least as many as HAProxy",
                          bool(hap) and s_ours >= s_hap and alive,
                          f"tcp_proxy {s_ours:,} of {n:,}, HAProxy {s_hap:,} ({ratio(s_ours, s_hap)}); "
                          f"HAProxy with splice-auto {(idle.get('haproxy-splice') or {}).get('served', 0):,}, "
                          f"Go {(idle.get('go') or {}).get('served', 0):,}"))
        else:
            ok = (ours.get("served") == n and not ours.get("failed") and ours.get("alive_after") == n
                  and notes.get(OURS, "").startswith("alive=yes"))
            goals.append((f"{n:,} connections from a shell with soft limit {nofile} served without an error", ok,
                          f"{ours.get('served', 0):,} of {n:,} served"
                          + (f"; not served: {', '.join(f'{v} {k}' for k, v in (ours.get('failed') or {}).items())}"
                             if ours.get("failed") else "")))

    # ---------------------------------------------------------------- pipes
    for part, t, key, val in rows:
        if part == "pipes":
            print("### tcp_proxy default with many connections, idle and busy (was `default_splice_with_4000_connections`)\n")
            print("```")
            print(val.replace("\\n", "\n").rstrip())
            print("```\n")

    if goals:
        print("### Issue 29's goals\n")
        print("| goal | met | figures |")
        print("|---|---|---|")
        for name, ok, detail in goals:
            print(f"| {name} | {'**yes**' if ok else '**no**'} | {detail} |")
        print()
    print(f"Run time: {int(seconds) // 60} min {int(seconds) % 60} s.")


if __name__ == "__main__":
    main()
