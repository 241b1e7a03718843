//! One stream of data datagrams, sent to its end: wait for the pacer, plan
//! the call, lay out the headers, send, count.
//!
//! Why one loop for every sender: the client's upload and the server's
//! reverse stream must send exactly the same way (the same volume rules,
//! the same headers, the same back-off and fallbacks, the same timing of
//! the sender-side rate), or the two directions of a run could not be
//! compared. The loop never skips a datagram: the [`Transmitter`] backs off
//! on a full queue and sends the same message again.

use super::pace::{Pacer, Release};
use super::plan::{fill_incompressible, plan, Volume};
use super::send::Transmitter;
use crate::error::Result;
use crate::shutdown::Shutdown;
use crate::stats::{CpuTime, IntervalClock, SendInterval};
use crate::sys;
use crate::wire::{self, Header};
use std::time::{Duration, Instant};

/// Datagrams a paced sender hands over in one sendmmsg call at most: the
/// bursts of a release go out together.
pub const PACED_BATCH: usize = 64;

/// What a stream sends, and how.
#[derive(Debug, Clone, Copy)]
pub struct StreamSpec {
    pub session: u64,
    /// Datagram payload size.
    pub size: usize,
    pub volume: Volume,
    /// Payload bits per second; None for as fast as it goes.
    pub rate_bps: Option<u64>,
    /// Each datagram at its own time, spinning before it.
    pub precise_pacing: bool,
    /// Close a sender-side interval this often.
    pub interval: Option<Duration>,
    /// The largest UDP payload of the destination's address family.
    pub max_payload: usize,
}

impl StreamSpec {
    /// The pacer this stream runs under, if any.
    pub fn pacer(&self) -> Option<Pacer> {
        self.rate_bps.map(|r| Pacer::new(r, self.precise_pacing))
    }

    /// Messages per call for a `batch` the user asked for: a paced sender
    /// on the sendmmsg path hands each release to the kernel as one batch;
    /// one per call (`--batch 1`, `--plain-send`) stays one per call.
    pub fn batch_for(&self, batch: usize) -> usize {
        match self.pacer() {
            Some(p) if !self.precise_pacing && batch > 1 => {
                batch.max(p.burst_bound(self.size).min(PACED_BATCH as u64) as usize)
            }
            _ => batch,
        }
    }
}

/// Where a sender reports the bytes it has sent as they go (a progress
/// bar, a server's live counters). Called from every sending thread.
pub trait SendProgress: Sync {
    fn add(&self, bytes: u64);
    /// Stream `session` closed an interval.
    fn interval(&self, _session: &str, _interval: &SendInterval) {}
}

/// No progress reports.
pub struct NoProgress;

impl SendProgress for NoProgress {
    fn add(&self, _bytes: u64) {}
}

/// When the first and last send calls returned, and what the first took:
/// the sender-side rate counts what was sent after the first call.
#[derive(Debug, Clone, Copy)]
pub struct SendTiming {
    pub first_call: Option<Instant>,
    pub first_packets: u64,
    pub first_bytes: u64,
    pub last_call: Instant,
}

impl SendTiming {
    pub fn new(now: Instant) -> Self {
        SendTiming {
            first_call: None,
            first_packets: 0,
            first_bytes: 0,
            last_call: now,
        }
    }

    /// A send call that returned at `at`, having sent this much.
    pub fn call(&mut self, at: Instant, packets: u64, bytes: u64) {
        if self.first_call.is_none() {
            self.first_call = Some(at);
            self.first_packets = packets;
            self.first_bytes = bytes;
        }
        self.last_call = at;
    }

    /// From the first send call's return to the last one's.
    pub fn span(&self) -> Duration {
        self.first_call.map_or(Duration::ZERO, |f| {
            self.last_call.saturating_duration_since(f)
        })
    }
}

/// How a paced stream held its rate.
#[derive(Debug, Clone, Copy)]
pub struct Paced {
    /// The most datagrams one release sends back to back.
    pub burst_bound: u64,
    /// Time the schedule moved later because the sender fell behind.
    pub behind: Duration,
}

/// What a stream sent.
#[derive(Debug, Clone)]
pub struct Sent {
    pub packets: u64,
    pub bytes: u64,
    /// Datagrams too short to carry a header.
    pub untagged: u64,
    pub timing: SendTiming,
    /// When the loop started: the sender's time base.
    pub started: Instant,
    /// From the start to the return of the last send call.
    pub loop_time: Duration,
    /// Per `interval`, sender side.
    pub intervals: Vec<SendInterval>,
    /// The sending thread's CPU over the loop, where the platform tells.
    pub cpu: Option<CpuTime>,
    pub paced: Option<Paced>,
}

/// Sends the stream `spec` through `tx` until its volume is sent,
/// `shutdown` is set, or the destination keeps answering "port
/// unreachable" ([`Transmitter::gone`]). Runs on the calling thread, whose
/// CPU it measures.
pub fn send_stream(
    tx: &mut Transmitter,
    spec: &StreamSpec,
    shutdown: &Shutdown,
    progress: &dyn SendProgress,
) -> Result<Sent> {
    let size = spec.size;
    let mut pacer = spec.pacer();
    // One region per message of a call, each room for a full GSO buffer.
    let region = size.max(1) * tx.segments_per_message(spec.max_payload);
    let mut staging = vec![0u8; region * tx.batch()];
    fill_incompressible(&mut staging, spec.session);
    let mut message_ends: Vec<usize> = Vec::new();
    let (mut packets, mut bytes, mut untagged) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    let cpu_at_start = sys::thread_cpu();
    let mut timing = SendTiming::new(start);
    let session_text = format!("{:016x}", spec.session);
    let mut clock = spec.interval.map(IntervalClock::new);
    let mut intervals = Vec::new();
    'sending: while !shutdown.is_triggered() && !tx.gone {
        let per_message = tx.segments_per_message(spec.max_payload);
        let mut count = per_message * tx.batch();
        if let Some(p) = pacer.as_mut() {
            loop {
                match p.release(Instant::now(), bytes, size) {
                    Release::Send(due) => {
                        count = count.min(due as usize);
                        break;
                    }
                    Release::Wait(wake) => {
                        // --duration bounds the run: nothing due after it
                        // is sent.
                        if let Volume::Time(d) = spec.volume {
                            if wake >= start + d {
                                break 'sending;
                            }
                        }
                        if !p.sleep_until(wake, shutdown) {
                            break 'sending;
                        }
                    }
                }
            }
        }
        let planned = plan(spec.volume, size, packets, bytes, start, count);
        if planned.is_empty() {
            break;
        }
        // Lay the datagrams out: message m holds datagrams
        // [m * per_message, (m + 1) * per_message), back to back.
        let now_ns = start.elapsed().as_nanos() as u64;
        message_ends.clear();
        let mut tagged_misses = 0;
        for m in 0..planned.len().div_ceil(per_message) {
            let mut offset = m * region;
            let first = m * per_message;
            for i in first..planned.len().min(first + per_message) {
                let len = planned.get(i);
                let header = Header {
                    session: spec.session,
                    seq: packets + i as u64,
                    send_time_ns: now_ns,
                };
                if !wire::write_data_header(&mut staging[offset..offset + len], &header) {
                    tagged_misses += 1;
                }
                offset += len;
            }
            message_ends.push(offset);
        }
        let message_count = message_ends.len();
        let sent_messages = if message_count == 1 {
            // The common one-datagram-per-call path: no allocation.
            tx.send_all(&[&staging[..message_ends[0]]], shutdown)?
        } else {
            let messages: Vec<&[u8]> = message_ends
                .iter()
                .enumerate()
                .map(|(m, &end)| &staging[m * region..end])
                .collect();
            tx.send_all(&messages, shutdown)?
        };
        let sent = if sent_messages == message_count {
            planned.len()
        } else {
            (sent_messages * per_message).min(planned.len())
        };
        let sent_bytes = planned.bytes(sent);
        packets += sent as u64;
        bytes += sent_bytes;
        untagged += if sent == planned.len() {
            tagged_misses
        } else {
            planned.untagged(sent)
        };
        if sent > 0 {
            let now = Instant::now();
            timing.call(now, sent as u64, sent_bytes);
            if let Some(iv) = clock
                .as_mut()
                .and_then(|c| c.on_call(now - start, packets, bytes))
            {
                progress.interval(&session_text, &iv);
                intervals.push(iv);
            }
        }
        progress.add(sent_bytes);
        if sent_messages < message_count {
            break;
        }
    }
    if let Some(iv) = clock
        .as_mut()
        .and_then(|c| c.finish(timing.last_call - start, packets, bytes))
    {
        progress.interval(&session_text, &iv);
        intervals.push(iv);
    }
    // The sending thread's CPU, over the send loop's wall time.
    let cpu = sys::thread_cpu()
        .zip(cpu_at_start)
        .map(|(now, then)| now.since(then));
    Ok(Sent {
        packets,
        bytes,
        untagged,
        timing,
        started: start,
        loop_time: timing.last_call.saturating_duration_since(start),
        intervals,
        cpu,
        paced: pacer.as_ref().map(|p| Paced {
            burst_bound: p.burst_bound(size),
            behind: p.forgiven(),
        }),
    })
}
