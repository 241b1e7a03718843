"""netspeed's JSON as pScheduler's throughput result, and the merge of the
two participants' results.

The result's rules (the throughput test's validate.py and result-format):
top-level keys only succeeded, error, diags, intervals, summary (and a few
TCP ones netspeed never has); diags is a string and always there; a stream
or summary entry has only stream-id, start, end, throughput-bits,
throughput-bytes, receiver-throughput-bits, sent, lost, jitter (and TCP
keys, rtt, omitted); no null anywhere here, so a figure that is unknown is
left out. Units: throughput-bits in bit/s, throughput-bytes the bytes of the
span (as iperf3 fills it, not a rate), sent and lost in datagrams, jitter in
milliseconds, start and end in seconds since the stream started.

The stream-id is netspeed's session id (16 hex digits): both participants
know it, so their figures for one stream meet on it, and it is the session
udp_server's own output names.

What each participant's run reports:

- the client (participant 0) sends, or with reverse receives, and its
  udp_client report holds both sides: what it sent and what the server said
  it received, or (reverse) what the server said it sent and what it
  received itself;
- the server (participant 1) receives, or with reverse sends, and reports
  what it measured itself.

The merged result is the sender's: its intervals (as iperf3's, the sender
side), completed with the receiver's figures (lost, jitter, the receiver's
rate).
"""

KEYS = (
    "stream-id",
    "start",
    "end",
    "throughput-bits",
    "throughput-bytes",
    "receiver-throughput-bits",
    "sent",
    "lost",
    "jitter",
)

RECEIVER_KEYS = ("receiver-throughput-bits", "lost", "jitter")


def entry(**fields):
    """A stream or summary entry: the schema's keys whose value is known."""
    out = {}
    for name, value in fields.items():
        key = name.replace("_", "-")
        assert key in KEYS, key
        if value is not None:
            out[key] = value
    return out


def bits(gbps):
    """Gbit/s (netspeed) as bit/s (pScheduler); None stays unknown."""
    return None if gbps is None else float(gbps) * 1e9


def ms(jitter):
    """Jitter in milliseconds, to the nanosecond (netspeed's own figure
    carries binary noise beyond that)."""
    return None if jitter is None else round(float(jitter), 6)


def rate(nbytes, seconds):
    if nbytes is None or not seconds or seconds <= 0:
        return None
    return nbytes * 8.0 / seconds


def failure(error, diags):
    """A failed result that still has the shape of a result."""
    return {
        "succeeded": False,
        "error": error,
        "diags": diags,
        "intervals": [],
        "summary": {"streams": [], "summary": {}},
    }


def combine(streams):
    """One entry for several streams over the same span: bytes and counts
    summed, the rate as the summed bytes over the whole span (never a sum of
    rates), the largest jitter. A count is only given when every stream has
    it."""
    if not streams:
        return {}
    if len(streams) == 1:
        return {k: v for k, v in streams[0].items() if k != "stream-id"}
    start = min(s["start"] for s in streams)
    end = max(s["end"] for s in streams)

    def total(key):
        values = [s.get(key) for s in streams]
        return None if any(v is None for v in values) else sum(values)

    nbytes = total("throughput-bytes")
    throughput = rate(nbytes, end - start)
    if throughput is None:
        throughput = total("throughput-bits")
    jitters = [s["jitter"] for s in streams if "jitter" in s]
    return entry(
        start=start,
        end=end,
        throughput_bits=throughput,
        throughput_bytes=nbytes,
        sent=total("sent"),
        lost=total("lost"),
        jitter=max(jitters) if jitters else None,
    )


def by_ordinal(per_stream):
    """Intervals from each stream's own interval list: the k-th interval of
    every stream together (their intervals tick on one clock)."""
    intervals = []
    longest = max([len(v) for v in per_stream] or [0])
    for k in range(longest):
        streams = [v[k] for v in per_stream if k < len(v)]
        intervals.append({"streams": streams, "summary": combine(streams)})
    return intervals


# --- The client's report ----------------------------------------------------


def client_result(report, reverse, stream_events):
    """The intervals and summary of udp_client's report (--json-stream's
    `end` event). stream_events are its `interval` events of a reverse
    stream (the client's receiver side)."""
    if reverse:
        return _client_reverse(report, stream_events)
    return _client_upload(report)


def _client_upload(report):
    per_stream = []
    streams = []
    for client in report.get("clients") or []:
        sid = client["session"]
        intervals = []
        for i in client.get("intervals") or []:
            intervals.append(
                entry(
                    stream_id=sid,
                    start=i["start"],
                    end=i["end"],
                    throughput_bits=bits(i.get("gbps"))
                    if i.get("gbps") is not None
                    else rate(i["bytes"], i["end"] - i["start"]) or 0.0,
                    throughput_bytes=i["bytes"],
                    sent=i["packets"],
                )
            )
        per_stream.append(intervals)
        server = client.get("server") or {}
        streams.append(
            entry(
                stream_id=sid,
                start=0.0,
                end=client["seconds"],
                throughput_bits=_sender_bits(client),
                throughput_bytes=client["sent_bytes"],
                sent=client["sent_packets"],
                lost=server.get("lost_packets"),
                jitter=ms(server.get("jitter_ms")),
                receiver_throughput_bits=bits(server.get("gbps")),
            )
        )
    # The top level's server figures cover only the clients that were
    # answered: given only when every client was.
    server = (report.get("server") or {}) if report.get("complete") else {}
    total = entry(
        start=0.0,
        end=report["seconds"],
        throughput_bits=_sender_bits(report),
        throughput_bytes=report["sent_bytes"],
        sent=report["sent_packets"],
        lost=server.get("lost_packets"),
        jitter=ms(server.get("jitter_ms")),
        receiver_throughput_bits=bits(server.get("gbps")),
    )
    return by_ordinal(per_stream), {"streams": streams, "summary": total}


def _sender_bits(figures):
    """The sender's rate; from the bytes over the send span when netspeed
    could not give one (a span under 1 ms)."""
    value = bits(figures.get("gbps"))
    if value is None:
        value = rate(figures.get("sent_bytes"), figures.get("seconds")) or 0.0
    return value


def _client_reverse(report, stream_events):
    intervals = receiver_intervals(stream_events)
    streams = []
    for download in report.get("downloads") or []:
        got = download.get("received") or {}
        streams.append(
            entry(
                stream_id=download["session"],
                start=0.0,
                end=got.get("seconds", 0.0),
                throughput_bits=bits(got.get("gbps"))
                or rate(got.get("bytes"), got.get("seconds"))
                or 0.0,
                throughput_bytes=got.get("bytes"),
                receiver_throughput_bits=bits(got.get("gbps")),
                sent=got.get("sent_packets") if download.get("answered") else None,
                lost=got.get("lost") if download.get("answered") else None,
                jitter=ms(got.get("jitter_ms")),
            )
        )
    total = {}
    for stream in report.get("streams") or []:
        if stream.get("direction") != "server_to_client":
            continue
        sender = stream.get("sender") or {}
        receiver = stream.get("receiver") or {}
        answered = all(d.get("answered") for d in report.get("downloads") or [])
        total = entry(
            start=0.0,
            # A sender whose count never came has nulls (not 0): its span
            # is then the receiver's.
            end=sender.get("seconds") or receiver.get("seconds") or 0.0,
            throughput_bits=bits(sender.get("gbps"))
            or rate(sender.get("bytes"), sender.get("seconds"))
            or 0.0,
            throughput_bytes=sender.get("bytes"),
            sent=sender.get("packets"),
            lost=receiver.get("lost_packets") if answered else None,
            jitter=ms(receiver.get("jitter_ms")),
            receiver_throughput_bits=bits(receiver.get("gbps")),
        )
    return intervals, {"streams": streams, "summary": total}


def receiver_intervals(events):
    """Intervals from a receiver's `interval` events (udp_server's for its
    peers, udp_client's for a reverse stream): per session, in order, each
    starting where the previous ended. Their `lost` is cumulative; an
    interval gets its own part."""
    sessions = []
    lines = {}
    for event in events:
        sid = event.get("session")
        if sid is None:
            continue
        if sid not in lines:
            sessions.append(sid)
            lines[sid] = []
        lines[sid].append(event)
    per_stream = []
    for sid in sessions:
        at = 0.0
        lost_before = 0
        intervals = []
        for e in lines[sid]:
            span = e.get("seconds") or 0.0
            lost = e.get("lost")
            intervals.append(
                entry(
                    stream_id=sid,
                    start=at,
                    end=at + span,
                    throughput_bits=bits(e.get("gbps")) or rate(e.get("bytes"), span) or 0.0,
                    throughput_bytes=e.get("bytes"),
                    lost=None if lost is None else max(lost - lost_before, 0),
                    jitter=ms(e.get("jitter_ms")),
                )
            )
            at += span
            if lost is not None:
                lost_before = lost
        per_stream.append(intervals)
    return by_ordinal(per_stream)


# --- The server's events ----------------------------------------------------


def server_result(events, reverse):
    """The intervals and summary of udp_server's NDJSON events: the
    sessions it received (interval, peer_done), or with reverse the streams
    it sent (interval with a direction, stream_done). (None, None) when no
    session of a client ran."""
    if reverse:
        return _server_streams(events)
    return _server_peers(events)


def _server_peers(events):
    lines = [
        e
        for e in events
        if e.get("event") == "interval" and e.get("tagged") and "direction" not in e
    ]
    streams = []
    for e in events:
        if e.get("event") != "peer_done" or not e.get("tagged") or "session" not in e:
            continue
        streams.append(
            entry(
                stream_id=e["session"],
                start=0.0,
                end=e.get("seconds", 0.0),
                throughput_bits=bits(e.get("gbps")) or rate(e.get("bytes"), e.get("seconds")) or 0.0,
                throughput_bytes=e.get("bytes"),
                receiver_throughput_bits=bits(e.get("gbps")),
                sent=e.get("sent_packets"),
                lost=e.get("lost"),
                jitter=ms(e.get("jitter_ms")),
            )
        )
    if not streams:
        return None, None
    total = combine(streams)
    total["receiver-throughput-bits"] = total["throughput-bits"]
    return receiver_intervals(lines), {"streams": streams, "summary": total}


def _server_streams(events):
    lines = {}
    order = []
    for e in events:
        if e.get("event") == "interval" and e.get("direction") == "server_to_client":
            sid = e.get("session")
            if sid not in lines:
                order.append(sid)
                lines[sid] = []
            lines[sid].append(
                entry(
                    stream_id=sid,
                    start=e["start"],
                    end=e["end"],
                    throughput_bits=bits(e.get("gbps"))
                    or rate(e.get("sent_bytes"), e["end"] - e["start"])
                    or 0.0,
                    throughput_bytes=e.get("sent_bytes"),
                )
            )
    streams = []
    for e in events:
        if e.get("event") != "stream_done" or e.get("sent_packets", 0) == 0:
            continue
        got = e.get("received") or {}
        streams.append(
            entry(
                stream_id=e["session"],
                start=0.0,
                end=e.get("seconds", 0.0),
                throughput_bits=bits(e.get("gbps")) or rate(e.get("sent_bytes"), e.get("seconds")) or 0.0,
                throughput_bytes=e.get("sent_bytes"),
                sent=e.get("sent_packets"),
                lost=got.get("lost_packets"),
                jitter=ms(got.get("jitter_ms")),
            )
        )
    if not streams:
        return None, None
    return by_ordinal([lines[s] for s in order]), {
        "streams": streams,
        "summary": combine(streams),
    }


# --- Merging ------------------------------------------------------------------


def _ok(result):
    return isinstance(result, dict) and result.get("succeeded") is True


def _error(result):
    if not isinstance(result, dict):
        return "no result"
    return result.get("error") or "failed without saying why"


def merge(test, results):
    """The test's result from the participants' [client, server] results.
    Raises ValueError for input that is not what pScheduler sends."""
    if not isinstance(results, list) or len(results) != 2:
        raise ValueError(
            "Expected 2 results in merged-results, got %s"
            % (len(results) if isinstance(results, list) else type(results).__name__)
        )
    spec = (test or {}).get("spec") or {}
    reverse = bool(spec.get("reverse"))
    client, server = results
    sender, receiver = (server, client) if reverse else (client, server)
    if reverse:
        receiver_role = "participant 0 (udp_client, receiving)"
    else:
        receiver_role = "participant 1 (udp_server, receiving)"

    diags = ""
    for n, r in enumerate(results):
        text = r.get("diags") if isinstance(r, dict) else None
        diags += "Participant %d:\n%s\n" % (n, text if text else "(no result)")

    if not _ok(sender):
        errors = [
            "Participant %d: %s" % (n, _error(r)) for n, r in enumerate(results) if not _ok(r)
        ]
        return failure("; ".join(errors), diags)

    notes = []
    intervals = sender.get("intervals") or []
    summary = sender.get("summary") or {}
    streams = [dict(s) for s in summary.get("streams") or []]
    total = dict(summary.get("summary") or {})

    if _ok(receiver):
        theirs = {
            s.get("stream-id"): s for s in (receiver.get("summary") or {}).get("streams") or []
        }
        for s in streams:
            other = theirs.get(s.get("stream-id"))
            if other is None:
                continue
            for key in RECEIVER_KEYS:
                if key not in s and key in other:
                    s[key] = other[key]
                    # In a reverse test the receiver's rate always comes
                    # from the client; anything else filled in is news.
                    if not (reverse and key == "receiver-throughput-bits"):
                        notes.append(
                            "stream %s: %s from %s" % (s["stream-id"], key, receiver_role)
                        )
        other_total = (receiver.get("summary") or {}).get("summary") or {}
        if reverse and "throughput-bits" in other_total:
            # The client's report has the run's totals of both sides: the
            # server's send figures (its End) over the union of the streams,
            # and its own receive figures.
            total = dict(other_total)
        else:
            for key in RECEIVER_KEYS:
                if key not in total and key in other_total:
                    total[key] = other_total[key]
                    notes.append("summary: %s from %s" % (key, receiver_role))
    elif reverse:
        notes.append(
            "%s has no result (%s): the receiver's rate is unknown and the totals "
            "are the sums of the streams" % (receiver_role, _error(receiver))
        )
    else:
        notes.append("%s has no result (%s)" % (receiver_role, _error(receiver)))

    if notes:
        diags += "Merged:\n%s\n" % "\n".join(notes)
    return {
        "succeeded": True,
        "diags": diags,
        "intervals": intervals,
        "summary": {"streams": streams, "summary": total},
    }
