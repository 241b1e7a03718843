//! A run's totals from its clients' reports: the receiver side over
//! several sessions of one server (sums, and rates and drops over the
//! union of their spans), the server's CPU, the notes and the verdict.

use super::*;

/// The receiver side of one or more sessions of one server, from its
/// answers and what each session sent: sums, and rates and drops over the
/// union of their spans (the answers' times share the server's clock).
/// `sender_span` is the senders' own (first to last send call), over
/// which the receive rate is taken when the arrivals' span is shorter
/// (`stats::receive_span`).
pub(super) fn server_view(answers: &[(&EndAck, u64)], sender_span: Option<Duration>) -> ServerView {
    let mut v = ServerView {
        kernel_times: !answers.is_empty(),
        ..ServerView::default()
    };
    let mut sent = 0;
    for &(a, sent_packets) in answers {
        sent += sent_packets;
        v.received_packets += a.received_packets;
        v.received_bytes += a.received_bytes;
        v.lost_packets += a.lost;
        v.duplicates += a.duplicates;
        v.reordered += a.reordered;
        v.uncertain += a.uncertain;
        v.late += a.late;
        v.unexpected += a.unexpected;
        v.jitter_ms = v.jitter_ms.max(a.jitter_ns as f64 / 1e6);
        v.kernel_times &= a.flags & wire::ACK_KERNEL_TIMES != 0;
        if let Some(q) = queue_figures(a) {
            v.queue = Some(v.queue.map_or(q, |w| QueueFigures::worst(w, q)));
        }
        v.gro_buffers += a.gro_buffers;
        v.truncated += a.truncated;
        v.idle_finished |= a.flags & wire::ACK_IDLE_FINISHED != 0;
        v.transit_discarded += a.transit_discarded;
        v.disputed |= a.flags & wire::ACK_CONFLICT != 0;
    }
    let fewest: u64 = answers.iter().map(|(a, _)| a.lost_fewest).sum();
    v.lost_fewest = (fewest != v.lost_packets).then_some(fewest);
    v.loss_percent = percent(v.lost_packets, sent);
    // Rates: what arrived after the earliest first arrival, over the span
    // from it to the latest arrival.
    let with_data: Vec<&EndAck> = answers
        .iter()
        .map(|(a, _)| *a)
        .filter(|a| a.received_packets > 0)
        .collect();
    if let (Some(first), Some(last)) = (
        with_data.iter().map(|a| a.first_arrival_ns).min(),
        with_data.iter().map(|a| a.last_arrival_ns).max(),
    ) {
        let at_first: u64 = with_data
            .iter()
            .filter(|a| a.first_arrival_ns == first)
            .map(|a| a.first_arrival_bytes)
            .sum();
        let arrivals = Duration::from_nanos(last.saturating_sub(first));
        v.seconds = arrivals.as_secs_f64();
        let (span, basis) = stats::receive_span(arrivals, sender_span);
        v.rate_span = basis;
        v.gbps = stats::rate_gbps(v.received_bytes.saturating_sub(at_first), span);
    } else if let (false, Some(sent_over)) = (answers.is_empty(), sender_span) {
        // The server answered and nothing arrived: 0 bit/s over the span
        // the datagrams were sent in (unknown only if that is too short).
        v.rate_span = RateSpan::Sender;
        v.gbps = stats::rate_gbps(0, sent_over);
    }
    // Kernel drops: per receive socket, the counter's growth over the union
    // of the sessions' spans on it, then summed over sockets.
    let mut sockets: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut known = true;
    let mut shared = answers.len() > 1;
    for (a, _) in answers {
        if a.drops_start == wire::UNKNOWN || a.drops_end == wire::UNKNOWN {
            known = false;
            continue;
        }
        shared |= a.flags & wire::ACK_DROPS_SHARED != 0;
        let entry = sockets
            .entry(a.drop_socket)
            .or_insert((a.drops_start, a.drops_end));
        entry.0 = entry.0.min(a.drops_start);
        entry.1 = entry.1.max(a.drops_end);
    }
    v.cpu = server_cpu(answers, v.received_bytes);
    let drops = (known && !sockets.is_empty())
        .then(|| sockets.values().map(|(s, e)| e.saturating_sub(*s)).sum());
    let gro_datagrams: u64 = answers.iter().map(|(a, _)| a.gro_datagrams).sum();
    let arrivals = stats::Arrivals {
        datagrams: v.received_packets,
        coalesced_buffers: v.gro_buffers,
        // An older server leaves it zero: the coalesced buffers alone.
        coalesced_datagrams: (gro_datagrams > 0).then_some(gro_datagrams),
    };
    v.gro_datagrams = arrivals.coalesced_datagrams;
    v.drops = KernelDrops::new(drops, shared, arrivals);
    v.split = stats::split_loss(v.lost_packets, &v.drops);
    v
}

/// The queue delay an EndAck carries, if any.
fn queue_figures(a: &EndAck) -> Option<QueueFigures> {
    if a.delay_samples == 0 || a.queue_p50_ns == wire::UNKNOWN {
        return None;
    }
    let ms = |ns: u64| ns as f64 / 1e6;
    let skew_ppm =
        (a.clock_skew_ppb != wire::UNKNOWN).then(|| a.clock_skew_ppb as i64 as f64 / 1e3);
    let span_s = a.last_arrival_ns.saturating_sub(a.first_arrival_ns) as f64 / 1e9;
    Some(QueueFigures {
        spread: Spread {
            p50: ms(a.queue_p50_ns),
            p90: ms(a.queue_p90_ns),
            p99: ms(a.queue_p99_ns),
            max: ms(a.queue_max_ns),
        },
        samples: a.delay_samples,
        skew_ppm,
        drift_bound_ms: skew_ppm.map_or(0.0, |s| s.abs() * 1e-6 * span_s * 1e3),
    })
}

/// The server's receive CPU over the answered sessions: one session's own
/// split, or the total from the earliest start to the latest end of
/// several (the counter runs from the server's start, so overlapping
/// sessions are not counted twice). Where the server says whom that CPU
/// also served ([`wire::CpuSharing`]), the figures are these sessions'
/// share of it by datagrams, the whole beside them.
pub(super) fn server_cpu(answers: &[(&EndAck, u64)], bytes: u64) -> Option<CpuCost> {
    let known = |a: &EndAck| {
        [a.cpu_user_ns, a.cpu_system_ns, a.cpu_start_ns]
            .iter()
            .all(|&x| x != wire::UNKNOWN)
    };
    if answers.is_empty() || !answers.iter().all(|(a, _)| known(a)) {
        return None;
    }
    let span =
        |a: &EndAck| Duration::from_nanos(a.last_arrival_ns.saturating_sub(a.first_arrival_ns));
    if let [(a, _)] = answers {
        let cpu = CpuTime {
            user: Duration::from_nanos(a.cpu_user_ns),
            system: Duration::from_nanos(a.cpu_system_ns),
        };
        let whole = CpuCost::of(cpu, span(a), bytes);
        return Some(match wire::CpuSharing::decode(a.cpu_sharing) {
            Some(s) => whole.shared_by(a.received_packets, s.datagrams, s.other_peers),
            None => whole,
        });
    }
    let start = answers.iter().map(|(a, _)| a.cpu_start_ns).min()?;
    let end = answers
        .iter()
        .map(|(a, _)| a.cpu_start_ns + a.cpu_user_ns + a.cpu_system_ns)
        .max()?;
    let first = answers.iter().map(|(a, _)| a.first_arrival_ns).min()?;
    let last = answers.iter().map(|(a, _)| a.last_arrival_ns).max()?;
    let whole = CpuCost::of_total(
        Duration::from_nanos(end.saturating_sub(start)),
        Duration::from_nanos(last.saturating_sub(first)),
        bytes,
    );
    // Each session's share of what the threads spent meanwhile, summed:
    // shares never overlap, as the wholes do.
    let sharing: Option<Vec<_>> = answers
        .iter()
        .map(|(a, _)| wire::CpuSharing::decode(a.cpu_sharing).map(|s| (*a, s)))
        .collect();
    let Some(sharing) = sharing else {
        return Some(whole);
    };
    let mut own_ns = 0.0;
    let mut others = 0;
    for (a, s) in sharing {
        let handled = s.datagrams.max(a.received_packets).max(1);
        own_ns +=
            (a.cpu_user_ns + a.cpu_system_ns) as f64 * a.received_packets as f64 / handled as f64;
        others = others.max(s.other_peers);
    }
    // The sessions of this run are each other's "other peers".
    let others = others.saturating_sub(answers.len() as u64 - 1);
    let whole_ns = whole.seconds * 1e9;
    if whole_ns <= 0.0 {
        return Some(whole);
    }
    Some(whole.with_share(own_ns / whole_ns, others))
}

/// How a run means to send, before it has: GSO as the settings allow it
/// (the send path may still refuse it).
pub(super) fn send_shape(cfg: &ClientConfig) -> egress::SendShape {
    let most = sys::max_udp_payload(&cfg.server) / cfg.buffer_size.max(1);
    let gso = cfg.gso != GsoRequest::Off && !cfg.precise_pacing && sys::LINUX_SOCKETS;
    egress::SendShape {
        size: cfg.buffer_size,
        gso_datagrams: (gso && most >= 2).then(|| most.min(crate::meter::send::GSO_SEGMENTS_NEW)),
        paced: cfg.rate_bps.is_some(),
        ipv6: cfg.server.is_ipv6(),
    }
}

pub(super) fn summarise(
    cfg: &ClientConfig,
    clients: Vec<ClientReport>,
    started: SystemTime,
    interrupted: Option<Interrupted>,
    queue: std::result::Result<(egress::Snapshot, egress::Snapshot), String>,
    gso_off: Option<String>,
) -> RunReport {
    let sent_packets = clients.iter().map(|c| c.sent_packets).sum();
    let sent_bytes: u64 = clients.iter().map(|c| c.sent_bytes).sum();
    // Sender side: what the calls after the earliest first call sent, from
    // it to the latest last call.
    let first = clients.iter().filter_map(|c| c.timing.first_call).min();
    let last = clients
        .iter()
        .filter(|c| c.timing.first_call.is_some())
        .map(|c| c.timing.last_call)
        .max();
    let (span, at_first) = match (first, last) {
        (Some(a), Some(b)) => (
            b.saturating_duration_since(a),
            clients
                .iter()
                .filter(|c| c.timing.first_call == Some(a))
                .map(|c| c.timing.first_bytes)
                .sum(),
        ),
        _ => (Duration::ZERO, 0),
    };
    let answered: Vec<(&EndAck, u64)> = clients
        .iter()
        .filter_map(|c| c.ack.as_ref().map(|a| (a, c.sent_packets)))
        .collect();
    let sender_span = first.is_some().then_some(span);
    let server = (!answered.is_empty()).then(|| server_view(&answered, sender_span));
    let mut notes: Vec<String> = interrupted.iter().map(Interrupted::note).collect();
    let untagged: u64 = clients.iter().map(|c| c.untagged_packets).sum();
    if untagged > 0 {
        notes.push(format!(
            "{untagged} datagrams were shorter than the {}-byte header: the server counts them, but cannot check them for duplication or reordering",
            wire::HEADER_LEN
        ));
    }
    let count = |answer: Answer| clients.iter().filter(|c| c.answer == answer).count();
    let n = clients.len();
    let gone = count(Answer::ServerGone);
    if gone > 0 {
        notes.push(format!(
            "{} answered 'port unreachable' while {gone} of {n} clients were sending: the server went away (or never listened); only sender-side figures are known for them, up to that point",
            cfg.server
        ));
    }
    let silent = count(Answer::NoAnswer);
    if silent > 0 {
        let key = if cfg.psk.is_some() {
            "; with --psk, also a server with another key, which ignores the End"
        } else {
            ""
        };
        notes.push(format!(
            "no end-of-test answer from {} for {silent} of {n} clients within {:.1} s: only sender-side figures are known for them (the server stopped, a firewall, or every answer lost; raise --end-timeout on a lossy path{key})",
            cfg.server,
            cfg.end_timeout.as_secs_f64()
        ));
    }
    let forgotten = count(Answer::NoRecord);
    if forgotten > 0 {
        notes.push(format!(
            "the server had no record of {forgotten} of {n} sessions when their End came (it restarted, or forgot them under a flood of sessions): their receiver side is unknown"
        ));
    }
    if count(Answer::NotAsked) > 0 {
        notes.push(
            "--no-server: the receiver was not asked what arrived; these are sender-side figures only".into(),
        );
    }
    if let Some(v) = &server {
        notes.extend(server_notes(v));
        if cfg.local && v.lost_packets > 0 {
            notes.push(local_loss_note(v));
        }
    }
    let send_blocked_seconds: Option<f64> = clients.iter().map(|c| c.send_blocked_seconds).sum();
    // The watch of the sender's queue turned GSO off: only if a sender
    // really had it on to turn off.
    let fell_back = gso_off.filter(|why| {
        let said = format!("gso: off ({why})");
        clients.iter().any(|c| c.send_path.notes.contains(&said))
    });
    if let Some(why) = &fell_back {
        notes.push(format!("GSO fell back during the run: {why}"));
    }
    let shape = egress::SendShape {
        gso_datagrams: clients
            .iter()
            .filter_map(|c| c.send_path.gso_segments)
            .max()
            .map(|most| (sys::max_udp_payload(&cfg.server) / cfg.buffer_size.max(1)).clamp(1, most))
            // Sent in GSO buffers until it fell back: the drops then were
            // the buffers' datagrams.
            .or(fell_back.as_ref().and(send_shape(cfg).gso_datagrams)),
        ..send_shape(cfg)
    };
    let sender_queue = match queue {
        Ok((before, after)) => {
            let mut q = egress::growth(&before, &after, &shape);
            if let Some(v) = &server {
                let drops = q.drops_in_datagrams_at_most(shape.gso_datagrams);
                if v.lost_packets > 0 && drops > 0 {
                    let rest = v.lost_packets - v.split.lost_in_socket.unwrap_or(0);
                    q.lost_in_sender_queue_at_most = Some(drops.min(rest));
                }
            }
            Some(q)
        }
        Err(why) => {
            // Only where the platform could tell is its silence news.
            if sys::LINUX_SOCKETS {
                notes.push(format!("the sender's own queue was not read: {why}"));
            }
            None
        }
    };
    let answered_count = count(Answer::Answered);
    let limited_by = verdict::judge(&verdict::Facts {
        offered_bps: cfg.rate_bps.map(|r| r.saturating_mul(n as u64)),
        // Paced, each client holds its share from its own start.
        sent_bps: if cfg.rate_bps.is_some() {
            verdict::summed_client_bps(&clients)
        } else {
            stats::rate_gbps(sent_bytes.saturating_sub(at_first), span).map(|g| g * 1e9)
        },
        seconds: span.as_secs_f64(),
        sender_cpu_percent: verdict::busiest_sender_percent(&clients),
        enobufs_retries: clients.iter().map(|c| c.enobufs_retries).sum(),
        backoff_seconds: clients.iter().map(|c| c.backoff_seconds).sum(),
        clients: n,
        gso: clients.iter().any(|c| c.send_path.gso_segments.is_some()),
        gso_datagrams: shape.gso_datagrams,
        gso_fell_back: fell_back.is_some(),
        send_blocked_seconds,
        sender_queue: sender_queue.clone(),
        local: cfg.local,
        receiver: server.as_ref().map(|v| verdict::ReceiverFacts {
            recv_buffer: clients.iter().filter_map(|c| c.server_recv_buffer).max(),
            ..verdict::ReceiverFacts::of(v)
        }),
        reverse: false,
    });
    RunReport {
        version: env!("CARGO_PKG_VERSION"),
        start: humantime::format_rfc3339_millis(started).to_string(),
        host: Host::this(),
        settings: Settings::of(cfg),
        server_addr: cfg.server.to_string(),
        buffer_size: cfg.buffer_size,
        connected: cfg.connected,
        rate_bps: cfg.rate_bps,
        sent_packets,
        sent_bytes,
        seconds: span.as_secs_f64(),
        gbps: stats::rate_gbps(sent_bytes.saturating_sub(at_first), span),
        enobufs_retries: clients.iter().map(|c| c.enobufs_retries).sum(),
        backoff_seconds: clients.iter().map(|c| c.backoff_seconds).sum(),
        send_blocked_seconds,
        sender_queue,
        cpu: clients
            .iter()
            .map(|c| c.cpu_used)
            .collect::<Option<Vec<CpuTime>>>()
            .map(|all| {
                let total = all.iter().fold(CpuTime::default(), |a, b| a.plus(*b));
                let wall = clients
                    .iter()
                    .map(|c| c.loop_time)
                    .max()
                    .unwrap_or_default();
                CpuCost::of(total, wall, sent_bytes)
            }),
        server,
        clients_answered: answered_count,
        complete: answered_count + count(Answer::NotAsked) == n,
        clients,
        interrupted,
        notes,
        limited_by,
        rtt: None,
    }
}

/// `--local` with loss: no network lay between the ends, so the loss is
/// what this host could not take in, and the rate received is what it can.
fn local_loss_note(v: &ServerView) -> String {
    let rate = v
        .gbps
        .map_or_else(|| "an unknown rate".into(), crate::units::gbps_text);
    format!(
        "--local: no network lies between the two ends, so the {} datagrams lost ({:.3}%) were not lost on a path: this host's in-process server could not take them in (its socket buffer overflowed) while it received {rate} with the sender beside it on the same cores; that is what this host can receive; pace with --rate below it to measure without loss",
        v.lost_packets, v.loss_percent
    )
}

/// What the server's answer says about its own figures: where they stop
/// short, what they leave out, and whether they can be trusted.
pub(super) fn server_notes(v: &ServerView) -> impl Iterator<Item = String> {
    let ServerView {
        idle_finished,
        late,
        unexpected,
        disputed,
        truncated,
        ..
    } = *v;
    [
        (idle_finished, "the server had already finished a session as idle (no datagram for its --idle-timeout) when the End arrived: its figures stop there; raise the server's --idle-timeout for slow senders".to_string()),
        (late > 0, format!("{late} datagrams reached the server after it had finished the session: they are not in its figures (raise the server's --end-grace on a path that delays datagrams this much)")),
        (unexpected > 0, format!("the server received {unexpected} datagrams for this session with sequence numbers it never sent: forged, or from another sender")),
        (disputed, "DISPUTED: the server received another End for this session (with other totals), or data after the End that its total does not cover: a forged End, or a confused sender; these figures cannot be trusted (--psk on both ends makes Ends unforgeable)".to_string()),
        (truncated > 0, format!("the server's kernel cut {truncated} buffers short (MSG_TRUNC): their datagrams count as lost")),
    ]
    .into_iter()
    .filter_map(|(due, note)| due.then_some(note))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(received: u64, cpu_ms: u64, sharing: u64) -> EndAck {
        EndAck {
            received_packets: received,
            received_bytes: received * 1000,
            first_arrival_ns: 1_000_000,
            last_arrival_ns: 1_001_000_000,
            cpu_user_ns: cpu_ms * 1_000_000,
            cpu_system_ns: 0,
            cpu_start_ns: 5_000_000,
            cpu_sharing: sharing,
            ..EndAck::default()
        }
    }

    #[test]
    fn nothing_received_over_a_known_span_is_zero_not_unknown() {
        let a = ack(0, 1, 0);
        let v = server_view(&[(&a, 5_000)], Some(Duration::from_millis(35)));
        assert_eq!((v.gbps, v.rate_span), (Some(0.0), RateSpan::Sender));
        // No span known (or one too short to time): unknown.
        assert_eq!(server_view(&[(&a, 5_000)], None).gbps, None);
        let short = server_view(&[(&a, 5_000)], Some(Duration::from_micros(10)));
        assert_eq!(short.gbps, None);
    }

    #[test]
    fn a_shared_receive_cpu_is_this_sessions_share_and_says_so() {
        // 1,000 of the 16,000 datagrams the threads read, among 15 others.
        let sharing = wire::CpuSharing {
            other_peers: 15,
            datagrams: 16_000,
        };
        let a = ack(1_000, 800, sharing.encode());
        let cpu = server_cpu(&[(&a, 1_000)], a.received_bytes).expect("known");
        assert!((cpu.seconds - 0.05).abs() < 1e-9, "{cpu:?}");
        let s = cpu.shared.expect("said as shared");
        assert_eq!((s.whole_seconds, s.other_peers), (0.8, 15));
        // An older server says nothing: the whole, as before.
        let old = ack(1_000, 800, 0);
        let cpu = server_cpu(&[(&old, 1_000)], old.received_bytes).unwrap();
        assert_eq!((cpu.seconds, cpu.shared), (0.8, None));
    }

    #[test]
    fn several_sessions_of_one_run_add_their_shares_not_their_wholes() {
        // Two sessions of this run, and two peers of someone else's, each
        // a quarter of the datagrams over the same second and the same
        // 0.8 s of CPU.
        let sharing = wire::CpuSharing {
            other_peers: 3,
            datagrams: 4_000,
        }
        .encode();
        let (a, b) = (ack(1_000, 800, sharing), ack(1_000, 800, sharing));
        let cpu = server_cpu(&[(&a, 1_000), (&b, 1_000)], 2_000_000).unwrap();
        assert!((cpu.seconds - 0.4).abs() < 1e-6, "{cpu:?}");
        let s = cpu.shared.expect("shared with the other two");
        assert_eq!(s.other_peers, 2);
        // This run alone: its sessions share with each other only, and
        // the whole is theirs.
        let alone = wire::CpuSharing {
            other_peers: 1,
            datagrams: 2_000,
        }
        .encode();
        let (a, b) = (ack(1_000, 800, alone), ack(1_000, 800, alone));
        let cpu = server_cpu(&[(&a, 1_000), (&b, 1_000)], 2_000_000).unwrap();
        assert_eq!((cpu.seconds, cpu.shared), (0.8, None));
    }
}
