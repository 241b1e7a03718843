//! What arrived of an upload per interval, as the server counted it
//! (`--plot`): asked for in the Hello, fetched a page at a time after the
//! End ([`wire::intervals`]), and matched to the client's own intervals.
//!
//! Why the server's figures, not the client's guess: only the receiver
//! knows what arrived and how long it queued. The client's probes show
//! the round trip, not the data's one-way queue, and its own counts say
//! nothing of what was lost on the way.
//!
//! Why matched by sequence number: the server cuts the datagrams into
//! intervals of their send time, the client into intervals that close
//! before the first send call that starts past each boundary (a call's
//! datagrams carry the time it started), so each of the server's lies in
//! exactly one of the client's: the same one, or, when the sender paused
//! across boundaries, the one that spans them. A datagram's sequence
//! number is what both know for certain, so each server interval goes to
//! the client interval that sent its lowest sequence number. Sent minus
//! arrived is then the interval's loss, exactly.

use super::*;

/// What the server kept of one upload per interval of send time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerIntervals {
    pub every: Duration,
    /// From the interval that starts at send time 0, one per interval.
    pub intervals: Vec<wire::IntervalFigures>,
    /// Every datagram is in them: an interval beyond the last one kept
    /// is one where nothing arrived, not one the server left out.
    pub complete: bool,
}

/// What arrived of the datagrams one of the client's intervals sent.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Received {
    /// Distinct datagrams, and their bytes.
    pub packets: u64,
    pub bytes: u64,
    /// Their queue delay's median and 99th percentile (ms); the larger
    /// of two when the server's intervals were two; None when none
    /// arrived.
    pub queue_p50_ms: Option<f64>,
    pub queue_p99_ms: Option<f64>,
}

/// The interval (ns) a run asks the server to keep its figures at: the
/// run's `--interval`, when it draws the run (`--plot`); else 0, none.
pub(super) fn keep_ns(cfg: &ClientConfig) -> u64 {
    match (&cfg.timeline_plot, cfg.interval) {
        (Some(_), Some(every)) => every.as_nanos().min(u64::MAX as u128) as u64,
        _ => 0,
    }
}

/// What arrived of each of `sent` (a client's intervals, in order), from
/// `server`'s intervals: None for an interval the server did not cover
/// (it left datagrams out, and this one ends past what it kept).
pub fn received_per_interval(
    sent: &[SendInterval],
    server: &ServerIntervals,
) -> Vec<Option<Received>> {
    // Interval i sent sequence numbers [ends[i - 1], ends[i]).
    let ends: Vec<u64> = sent
        .iter()
        .scan(0u64, |total, s| {
            *total += s.packets;
            Some(*total)
        })
        .collect();
    let mut received = vec![Received::default(); sent.len()];
    let ms = |ns: u64| (ns != wire::UNKNOWN).then(|| ns as f64 / 1e6);
    let worst = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    for f in &server.intervals {
        if f.lowest_seq == wire::UNKNOWN || f.packets == 0 {
            continue;
        }
        let i = ends.partition_point(|&end| end <= f.lowest_seq);
        let Some(r) = received.get_mut(i) else {
            // A sequence number this client never sent: not its data.
            continue;
        };
        r.packets += f.packets;
        r.bytes += f.bytes;
        r.queue_p50_ms = worst(r.queue_p50_ms, ms(f.queue_p50_ns));
        r.queue_p99_ms = worst(r.queue_p99_ms, ms(f.queue_p99_ns));
    }
    let covered = server.every.as_secs_f64() * server.intervals.len() as f64;
    received
        .into_iter()
        .zip(sent)
        .map(|(r, s)| (server.complete || s.end <= covered).then_some(r))
        .collect()
}

/// One client's socket and session, and whether its EndAck said the
/// server kept its intervals (`ACK_INTERVALS`).
pub(super) struct Asked<'s> {
    pub(super) socket: &'s UdpSocket,
    pub(super) session: u64,
    pub(super) kept: bool,
}

/// Fetches, for every client whose server kept them, its intervals: a
/// page at a time, every client's next page at once. A client whose
/// pages stop coming keeps the ones that came (not complete).
pub(super) fn fetch_all(
    cfg: &ClientConfig,
    asked: &[Asked],
    txs: &mut [Transmitter],
    shutdown: &Shutdown,
) -> Vec<Option<ServerIntervals>> {
    let every = Duration::from_nanos(keep_ns(cfg));
    let mut kept: Vec<Option<ServerIntervals>> = vec![None; asked.len()];
    // The next page each client asks for; None: done (or never asked).
    let mut next: Vec<Option<u64>> = asked.iter().map(|a| a.kept.then_some(0)).collect();
    // A signal ends the run: its figures are printed without them.
    while !shutdown.is_triggered() {
        let mut who = Vec::new();
        let mut questions = Vec::new();
        for (i, tx) in txs.iter_mut().enumerate() {
            if let Some(first) = next[i] {
                let a = &asked[i];
                questions.push(page_question(a.socket, tx, cfg, a.session, first));
                who.push(i);
            }
        }
        if questions.is_empty() {
            break;
        }
        for (i, outcome) in who
            .into_iter()
            .zip(exchange_all(questions, cfg.server, shutdown))
        {
            next[i] = None;
            let Exchange::Answered((page, figures)) = outcome else {
                if let Some(k) = kept[i].as_mut() {
                    k.complete = false;
                }
                continue;
            };
            if page.every_ns != every.as_nanos() as u64 {
                // Not the intervals asked for: of no use.
                continue;
            }
            let k = kept[i].get_or_insert_with(|| ServerIntervals {
                every,
                intervals: Vec::new(),
                complete: page.complete,
            });
            k.intervals.extend(figures);
            let end = page.first + page.count;
            if page.count > 0 && end < page.total {
                next[i] = Some(end);
            }
        }
    }
    kept
}

/// The question for the page of `session`'s intervals from `first` on:
/// the ask, tagged under `--psk`; only a page that answers it counts.
fn page_question<'q, 'a>(
    socket: &'q UdpSocket,
    tx: &'q mut Transmitter<'a>,
    cfg: &'q ClientConfig,
    session: u64,
    first: u64,
) -> Question<'q, 'a, (wire::IntervalsPage, Vec<wire::IntervalFigures>)> {
    let psk = cfg.psk.as_ref();
    let ask = move |nonce| {
        let ask = wire::encode_intervals_ask(&wire::IntervalsAsk {
            session,
            nonce,
            first,
        });
        match psk {
            Some(psk) => wire::encode_tagged(ask, psk).to_vec(),
            None => ask.to_vec(),
        }
    };
    let accept = move |message, raw: &[u8], nonces: &[u64]| match message {
        Message::Intervals(page)
            if page.session == session
                && page.first == first
                && nonces.contains(&page.nonce)
                && psk.is_none_or(|psk| wire::verify_tag(raw, psk)) =>
        {
            Some((page, wire::page_intervals(raw, &page)))
        }
        _ => None,
    };
    Question {
        socket,
        tx,
        wait: cfg.end_timeout,
        ask: Box::new(ask),
        accept: Box::new(accept),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Intervals of one second, each of `packets[i]` datagrams of 1000 bytes.
    fn sent(packets: &[u64]) -> Vec<SendInterval> {
        let one = |(i, &p): (usize, &u64)| SendInterval {
            start: i as f64,
            end: i as f64 + 1.0,
            packets: p,
            bytes: p * 1000,
            gbps: None,
        };
        packets.iter().enumerate().map(one).collect()
    }

    fn kept(lowest_seq: u64, packets: u64, p50_ms: u64) -> wire::IntervalFigures {
        wire::IntervalFigures {
            packets,
            bytes: packets * 1000,
            lowest_seq,
            queue_p50_ns: p50_ms * 1_000_000,
            queue_p99_ns: p50_ms * 3_000_000,
        }
    }

    fn server(intervals: Vec<wire::IntervalFigures>, complete: bool) -> ServerIntervals {
        ServerIntervals {
            every: Duration::from_secs(1),
            intervals,
            complete,
        }
    }

    #[test]
    fn each_interval_gets_what_arrived_of_what_it_sent() {
        // 100 datagrams a second; a third of the second's lost, the first
        // of the third's lost too (its lowest arrival is 201).
        let s = sent(&[100, 100, 100]);
        let got = received_per_interval(
            &s,
            &server(
                vec![kept(0, 100, 1), kept(100, 66, 40), kept(201, 99, 90)],
                true,
            ),
        );
        let packets: Vec<u64> = got.iter().map(|r| r.unwrap().packets).collect();
        assert_eq!(packets, [100, 66, 99]);
        let second = got[1].unwrap();
        assert_eq!(
            (second.bytes, second.queue_p50_ms, second.queue_p99_ms),
            (66_000, Some(40.0), Some(120.0))
        );
    }

    #[test]
    fn nothing_arrived_is_zero_and_unknown_delay_not_a_gap_in_the_count() {
        // The second interval lost everything: the server has an empty
        // interval for it (lowest UNKNOWN); the third is missing
        // altogether, and the server said it left nothing out.
        let s = sent(&[10, 10, 10]);
        let got = received_per_interval(
            &s,
            &server(vec![kept(0, 10, 2), wire::IntervalFigures::NONE], true),
        );
        assert_eq!(got[1], Some(Received::default()));
        assert_eq!(got[2], Some(Received::default()));
        // Not complete: what ends past the intervals kept is unknown.
        let got = received_per_interval(&s, &server(vec![kept(0, 10, 2), kept(10, 10, 2)], false));
        assert!(got[0].is_some() && got[1].is_some());
        assert_eq!(got[2], None);
    }

    #[test]
    fn a_pause_across_a_boundary_puts_both_server_intervals_in_one() {
        // The client's first interval ran to 2.3 s (a long pause): the
        // server cut it at 1 s. Both of its intervals are the first's;
        // the delay is the worse of the two.
        let mut s = sent(&[30, 10]);
        (s[0].end, s[1].start, s[1].end) = (2.3, 2.3, 3.0);
        let got = received_per_interval(
            &s,
            &server(vec![kept(0, 20, 1), kept(20, 10, 5), kept(30, 10, 2)], true),
        );
        let first = got[0].unwrap();
        assert_eq!((first.packets, first.queue_p50_ms), (30, Some(5.0)));
        assert_eq!(got[1].unwrap().packets, 10);
        // Sequence numbers this client never sent are not its data.
        let got = received_per_interval(
            &sent(&[5]),
            &server(vec![kept(0, 5, 1), kept(99, 3, 1)], true),
        );
        assert_eq!(got[0].unwrap().packets, 5);
    }
}
