//! One stream of data datagrams, sent to its end: wait for the pacer, plan
//! the call, lay out the headers, send, count.
//!
//! Why one loop for every sender: the client's upload and the server's
//! reverse stream must send exactly the same way (the same volume rules,
//! the same headers, the same back-off and fallbacks, the same timing of
//! the sender-side rate), or the two directions of a run could not be
//! compared. The loop never skips a datagram: the [`Transmitter`] backs off
//! on a full queue and sends the same message again.
//!
//! Why the loop is a [`StreamSender`] taken one turn at a time: `udp_client
//! -P 1000` runs a thousand streams on a few threads, each thread waking
//! once for every stream then due ([`super::pace::Schedule`]) and laying
//! them all out in one staging buffer. A thread per stream cost a stack, a
//! 2 MB staging buffer and 2000 wakes a second each. [`send_stream`] is the
//! same sender with one stream on its thread, so a single stream (the
//! client's `-P 1`, each of the server's reverse streams) and a fleet send
//! through one code path.

use super::pace::{sleep_until, Next, Pacer, Release, Schedule};
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
    /// The rate a paced stream should hold from now on, when whoever runs
    /// it has changed it (a reverse stream's circuit breaker); None to
    /// keep the rate it has.
    fn rate_bps(&self) -> Option<u64> {
        None
    }
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

/// Nothing sent yet, as of now.
impl Default for SendTiming {
    fn default() -> Self {
        SendTiming::new(Instant::now())
    }
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
    /// Wall time in this stream's send turns (laying the datagrams out and
    /// the send calls), back-off sleeps excluded.
    pub send_time: Duration,
    /// Of `send_time`, what the thread spent blocked in the send calls (a
    /// full socket send buffer: the qdisc or the device holds the data), at
    /// least: [`blocked_in_send`]. None where the platform cannot tell.
    pub send_blocked: Option<Duration>,
}

/// The least time a thread can have spent blocked in send calls: its wall
/// time in send turns, less all its time on a CPU and waiting on a run
/// queue over the loop (a turn's time is one of the three, or stolen by a
/// hypervisor, which neither counter sees). A thread that ran or was
/// descheduled for all of it was blocked for none of it.
pub fn blocked_in_send(turns: Duration, on_cpu: Duration, run_queue: Duration) -> Duration {
    turns.saturating_sub(on_cpu + run_queue)
}

/// What a [`StreamSender`] says after its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Unpaced: it sent one call's worth and has more. Come back once the
    /// other streams of the thread have had their turn.
    Ready,
    /// Paced: nothing is due before then.
    Wait(Instant),
    /// Its volume is sent, `shutdown` is set, the destination is gone, or
    /// a back-off was interrupted: nothing more to send.
    Done,
}

/// One stream's send loop, taken one turn at a time, so that one thread
/// can drive many streams: a turn sends what is due (paced) or one call's
/// worth (unpaced) and says when to come back. It owns the stream's
/// counts, pacer and intervals; the caller lends the transmitter and the
/// staging buffer the datagrams are laid out in, which several streams of
/// one thread may share (a turn rewrites every header it sends).
#[derive(Debug)]
pub struct StreamSender {
    spec: StreamSpec,
    pacer: Option<Pacer>,
    /// Staging bytes per message: room for a full GSO buffer.
    region: usize,
    message_ends: Vec<usize>,
    packets: u64,
    bytes: u64,
    untagged: u64,
    start: Instant,
    timing: SendTiming,
    session_text: String,
    clock: Option<IntervalClock>,
    intervals: Vec<SendInterval>,
    done: bool,
    /// Wall time in send turns, back-offs excluded.
    send_time: Duration,
}

impl StreamSender {
    /// The staging bytes a stream `spec` needs on `tx`: one region per
    /// message of a call, each room for a full GSO buffer.
    pub fn staging_len(spec: &StreamSpec, tx: &Transmitter) -> usize {
        Self::region(spec, tx) * tx.batch()
    }

    fn region(spec: &StreamSpec, tx: &Transmitter) -> usize {
        spec.size.max(1) * tx.segments_per_message(spec.max_payload)
    }

    /// A stream that starts now (its time base, and `--duration`'s).
    pub fn new(spec: &StreamSpec, tx: &Transmitter) -> Self {
        let start = Instant::now();
        StreamSender {
            spec: *spec,
            pacer: spec.pacer(),
            region: Self::region(spec, tx),
            message_ends: Vec::new(),
            packets: 0,
            bytes: 0,
            untagged: 0,
            start,
            timing: SendTiming::new(start),
            session_text: format!("{:016x}", spec.session),
            clock: spec.interval.map(IntervalClock::new),
            intervals: Vec::new(),
            done: false,
            send_time: Duration::ZERO,
        }
    }

    /// One turn: sends through `tx` what the pacer says is due (paced), or
    /// one call's worth (unpaced), laid out in `staging` (at least
    /// [`Self::staging_len`] bytes, its payload filled by the caller).
    pub fn poll(
        &mut self,
        tx: &mut Transmitter,
        staging: &mut [u8],
        shutdown: &Shutdown,
        progress: &dyn SendProgress,
    ) -> Result<Step> {
        let size = self.spec.size;
        let region = self.region;
        loop {
            if self.done || shutdown.is_triggered() || tx.gone {
                self.done = true;
                return Ok(Step::Done);
            }
            let per_message = tx.segments_per_message(self.spec.max_payload);
            let mut count = per_message * tx.batch();
            if let Some(rate) = progress.rate_bps() {
                // Told to hold another rate (paced from here on, if it was
                // not), from what it has sent.
                match self.pacer.as_mut() {
                    Some(p) if p.rate_bps() == rate => {}
                    Some(p) => p.set_rate(rate, Instant::now(), self.bytes),
                    None => {
                        let mut p = Pacer::new(rate, self.spec.precise_pacing);
                        p.set_rate(rate, Instant::now(), self.bytes);
                        self.pacer = Some(p);
                    }
                }
            }
            if let Some(p) = self.pacer.as_mut() {
                match p.release(Instant::now(), self.bytes, size) {
                    Release::Send(due) => count = count.min(due as usize),
                    Release::Wait(wake) => {
                        // --duration bounds the run: nothing due after it
                        // is sent.
                        if let Volume::Time(d) = self.spec.volume {
                            if wake >= self.start + d {
                                self.done = true;
                                return Ok(Step::Done);
                            }
                        }
                        return Ok(Step::Wait(wake));
                    }
                }
            }
            let planned = plan(
                self.spec.volume,
                size,
                self.packets,
                self.bytes,
                self.start,
                count,
            );
            if planned.is_empty() {
                self.done = true;
                return Ok(Step::Done);
            }
            // Lay the datagrams out: message m holds datagrams
            // [m * per_message, (m + 1) * per_message), back to back.
            // One clock read before the turn and one after it time the
            // turn (no more per call than the headers and the rate need).
            let turn_start = Instant::now();
            let backoff_before = tx.backoff_time;
            let since_start = turn_start.saturating_duration_since(self.start);
            let now_ns = since_start.as_nanos() as u64;
            // An interval closes before the first call that starts past
            // its end: it holds exactly the datagrams stamped with a send
            // time in it, as the server counts them for `--plot`.
            if let Some(iv) = self
                .clock
                .as_mut()
                .and_then(|c| c.on_call(since_start, self.packets, self.bytes))
            {
                progress.interval(&self.session_text, &iv);
                self.intervals.push(iv);
            }
            self.message_ends.clear();
            let mut tagged_misses = 0;
            for m in 0..planned.len().div_ceil(per_message) {
                let mut offset = m * region;
                let first = m * per_message;
                for i in first..planned.len().min(first + per_message) {
                    let len = planned.get(i);
                    let header = Header {
                        session: self.spec.session,
                        seq: self.packets + i as u64,
                        send_time_ns: now_ns,
                    };
                    if !wire::write_data_header(&mut staging[offset..offset + len], &header) {
                        tagged_misses += 1;
                    }
                    offset += len;
                }
                self.message_ends.push(offset);
            }
            let message_count = self.message_ends.len();
            let sent_messages = if message_count == 1 {
                // The common one-datagram-per-call path: no allocation.
                tx.send_all(&[&staging[..self.message_ends[0]]], shutdown)?
            } else {
                let messages: Vec<&[u8]> = self
                    .message_ends
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
            self.packets += sent as u64;
            self.bytes += sent_bytes;
            self.untagged += if sent == planned.len() {
                tagged_misses
            } else {
                planned.untagged(sent)
            };
            let now = Instant::now();
            self.send_time += now
                .saturating_duration_since(turn_start)
                .saturating_sub(tx.backoff_time.saturating_sub(backoff_before));
            if sent > 0 {
                self.timing.call(now, sent as u64, sent_bytes);
            }
            progress.add(sent_bytes);
            if sent_messages < message_count {
                self.done = true;
                return Ok(Step::Done);
            }
            if self.pacer.is_none() {
                return Ok(Step::Ready);
            }
        }
    }

    /// Payload bytes sent so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// What the stream sent, its last interval closed (and reported to
    /// `progress`). `cpu` is left for the caller, who knows which thread
    /// sent it and what else that thread sent.
    pub fn finish(mut self, progress: &dyn SendProgress) -> Sent {
        let (start, last_call) = (self.start, self.timing.last_call);
        if let Some(iv) = self
            .clock
            .as_mut()
            .and_then(|c| c.finish(last_call - start, self.packets, self.bytes))
        {
            progress.interval(&self.session_text, &iv);
            self.intervals.push(iv);
        }
        Sent {
            packets: self.packets,
            bytes: self.bytes,
            untagged: self.untagged,
            timing: self.timing,
            started: start,
            loop_time: last_call.saturating_duration_since(start),
            intervals: self.intervals,
            cpu: None,
            paced: self.pacer.as_ref().map(|p| Paced {
                burst_bound: p.burst_bound(self.spec.size),
                behind: p.forgiven(),
            }),
            send_time: self.send_time,
            send_blocked: None,
        }
    }
}

/// A staging buffer of `len` bytes whose payload does not compress,
/// seeded by `seed`.
fn staging(len: usize, seed: u64) -> Vec<u8> {
    let mut staging = vec![0u8; len];
    fill_incompressible(&mut staging, seed);
    staging
}

/// Sends the stream `spec` through `tx` until its volume is sent,
/// `shutdown` is set, or the destination keeps answering "port
/// unreachable" ([`Transmitter::gone`]): [`send_streams`] with one stream.
/// Runs on the calling thread, whose CPU it measures.
pub fn send_stream(
    tx: &mut Transmitter,
    spec: &StreamSpec,
    shutdown: &Shutdown,
    progress: &dyn SendProgress,
) -> Result<Sent> {
    let (mut sent, cpu) = send_streams(std::slice::from_mut(tx), &[*spec], shutdown, progress)?;
    let mut sent = sent.pop().expect("one stream, one result");
    sent.cpu = cpu;
    Ok(sent)
}

/// Sends every stream `specs[i]` through `txs[i]` on the calling thread,
/// each to its end as [`send_stream`] sends one: one [`Schedule`] of
/// when each is next due, one sleep for all that are due at once
/// (unpaced streams take turns, a call each), one staging buffer. Returns
/// what each stream sent (`cpu` unset) and the thread's CPU over the
/// loop, which the streams shared.
pub fn send_streams(
    txs: &mut [Transmitter],
    specs: &[StreamSpec],
    shutdown: &Shutdown,
    progress: &dyn SendProgress,
) -> Result<(Vec<Sent>, Option<CpuTime>)> {
    assert_eq!(txs.len(), specs.len(), "a transmitter per stream");
    let len = txs
        .iter()
        .zip(specs)
        .map(|(tx, spec)| StreamSender::staging_len(spec, tx))
        .max()
        .unwrap_or(0);
    let mut staging = staging(len, specs.first().map_or(0, |s| s.session));
    let precise = specs.iter().any(|s| s.precise_pacing);
    let mut senders: Vec<StreamSender> = txs
        .iter()
        .zip(specs)
        .map(|(tx, spec)| StreamSender::new(spec, tx))
        .collect();
    let cpu_at_start = sys::thread_cpu();
    let sched_at_start = sys::thread_sched();
    let mut schedule = Schedule::new(precise);
    let now = Instant::now();
    for i in 0..senders.len() {
        schedule.at(i, now);
    }
    let mut serve = Vec::new();
    loop {
        let now = Instant::now();
        match schedule.next(now, &mut serve) {
            Next::Idle => break,
            Next::Sleep(wake) => {
                // A signal: every stream stops where it is.
                if !sleep_until(wake, precise, shutdown) {
                    break;
                }
            }
            Next::Serve => {
                for &i in &serve {
                    match senders[i].poll(&mut txs[i], &mut staging, shutdown, progress)? {
                        Step::Ready => schedule.at(i, now),
                        Step::Wait(wake) => schedule.at(i, wake),
                        Step::Done => {}
                    }
                }
            }
        }
    }
    let mut sent: Vec<Sent> = senders.into_iter().map(|s| s.finish(progress)).collect();
    // Blocked in send: the thread's, shared by the streams as their turns'
    // time is.
    if let (Some(then), Some(now)) = (sched_at_start, sys::thread_sched()) {
        let turns: Duration = sent.iter().map(|s| s.send_time).sum();
        let blocked = blocked_in_send(
            turns,
            now.0.saturating_sub(then.0),
            now.1.saturating_sub(then.1),
        );
        for s in &mut sent {
            let share = if turns.is_zero() {
                0.0
            } else {
                s.send_time.as_secs_f64() / turns.as_secs_f64()
            };
            s.send_blocked = Some(blocked.mul_f64(share));
        }
    }
    // The sending thread's CPU, over the send loop's wall time.
    let cpu = sys::thread_cpu()
        .zip(cpu_at_start)
        .map(|(now, then)| now.since(then));
    Ok((sent, cpu))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_time_off_the_cpu_and_off_the_run_queue_is_blocked() {
        let ms = Duration::from_millis;
        // Waiting on a shaper: the turns took 900 ms, the thread ran 50.
        assert_eq!(blocked_in_send(ms(900), ms(50), ms(10)), ms(840));
        // CPU-bound: all of the turns' time was on a CPU.
        assert_eq!(blocked_in_send(ms(800), ms(1000), ms(0)), ms(0));
        // Descheduled: the rest of the turns' time was on the run queue.
        assert_eq!(blocked_in_send(ms(800), ms(500), ms(300)), ms(0));
    }
}
