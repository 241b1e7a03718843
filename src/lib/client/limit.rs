//! `udp_client --find-limit`: the highest offered rate the path carries
//! within a loss tolerance (RFC 2544's "throughput"), and where the first
//! losses above it were counted.
//!
//! Why here and not in a script around the client: each trial needs the
//! two-sided counts of one run (what was offered, what was sent, what the
//! server received, its kernel drops, the sender's ENOBUFS back-offs), and
//! the search is only as good as those counts. A trial is one ordinary
//! paced run of `--trial-duration` through [`super::run`], so every other
//! flag means what it always means.
//!
//! The search ([`Search`]) is pure and tested without sockets:
//! 1. an unpaced trial measures the sender's rate: the upper bound;
//! 2. bracketing: from the lowest failing rate, step down (by half at
//!    first) until a trial passes; or, when the unpaced trial passed (the
//!    sender, or its own queue, set its rate), step up from it until a
//!    paced trial fails, to say what stops it;
//! 3. bisection between the highest pass and the lowest failure, until
//!    they are within `--resolution` of each other;
//! 4. confirmation: the highest pass must pass `--confirm` more times; a
//!    failure makes it the lowest failure, and the search brackets again,
//!    in small steps.
//!
//! A trial passes when the server's loss is within `--loss-tolerance`
//! and the sender really offered the rate (it sent at least
//! `1 - resolution / 2` of it): a rate the sender's own queue refused was
//! not carried, even though back-off keeps the count whole.

use super::verdict::{busiest_sender_percent, summed_client_bps, Cap, ReceiverFacts, BUSY_PERCENT};
use super::RunReport;
use crate::config::{ClientConfig, SearchSettings};
use crate::error::{Error, Result};
use crate::meter::plan::Volume;
use crate::shutdown::Shutdown;
use crate::stats::delay::Spread;
use serde::Serialize;
use std::time::{Duration, Instant};

/// The first bracketing step down from the unpaced rate: half.
const FIRST_STEP: f64 = 0.5;
/// How often a trial that only the sender failed is run again.
pub const SENDER_REPEATS: u32 = 2;
/// No rate below the upper bound over this is tried: the path loses at
/// any rate worth measuring.
const FLOOR_DIVISOR: u64 = 4096;

/// Which part of the search a trial belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Unpaced,
    Bracket,
    Bisect,
    Confirm,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Unpaced => "unpaced",
            Phase::Bracket => "bracket",
            Phase::Bisect => "bisect",
            Phase::Confirm => "confirm",
        }
    }
}

/// What the search wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    Trial { rate_bps: u64, phase: Phase },
    Done(Found),
}

/// Where the search ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// The highest rate that passed (and, if `confirmed`, passed again).
    pub rate_bps: Option<u64>,
    pub confirmed: bool,
    /// The lowest rate that failed.
    pub first_failure_bps: Option<u64>,
    /// Ended by `max_trials`, not by the resolution.
    pub out_of_trials: bool,
}

/// The search: a state machine fed with each trial's pass or fail.
#[derive(Debug, Clone)]
pub struct Search {
    settings: SearchSettings,
    /// The highest rate that passed and has not failed since.
    pass: Option<u64>,
    /// The lowest rate that failed.
    fail: Option<u64>,
    /// The next bracketing step down, as a share of `fail`.
    step: f64,
    floor: u64,
    confirming: bool,
    confirmed: u32,
    trials: u32,
}

impl Search {
    /// A search above an unpaced trial that sent at `upper_bps` and passed
    /// or not. If it passed, the sender is the limit, and its rate only
    /// needs confirming at that pace.
    pub fn new(settings: SearchSettings, upper_bps: u64, upper_passed: bool) -> Search {
        let upper = upper_bps.max(1);
        Search {
            settings,
            pass: upper_passed.then_some(upper),
            fail: (!upper_passed).then_some(upper),
            step: if upper_passed {
                settings.resolution
            } else {
                FIRST_STEP
            },
            floor: (upper / FLOOR_DIVISOR).max(1),
            confirming: false,
            confirmed: 0,
            trials: 1,
        }
    }

    fn found(&self, confirmed: bool, out_of_trials: bool) -> Next {
        Next::Done(Found {
            rate_bps: self.pass,
            confirmed,
            first_failure_bps: self.fail,
            out_of_trials,
        })
    }

    /// The next trial, or the result.
    pub fn next_step(&mut self) -> Next {
        let s = self.settings;
        if self.confirming && self.confirmed >= s.confirmations {
            return self.found(true, false);
        }
        if self.trials >= s.max_trials {
            return self.found(false, true);
        }
        if self.confirming {
            if let Some(rate) = self.pass {
                return Next::Trial {
                    rate_bps: rate,
                    phase: Phase::Confirm,
                };
            }
        }
        match (self.pass, self.fail) {
            (Some(pass), Some(fail)) => {
                if (fail.saturating_sub(pass)) as f64 <= s.resolution * fail as f64 {
                    self.confirming = true;
                    self.confirmed = 0;
                    self.next_step()
                } else {
                    Next::Trial {
                        rate_bps: pass + (fail - pass) / 2,
                        phase: Phase::Bisect,
                    }
                }
            }
            (None, Some(fail)) => {
                let rate = (fail as f64 * (1.0 - self.step)) as u64;
                if rate < self.floor {
                    self.found(false, false)
                } else {
                    Next::Trial {
                        rate_bps: rate,
                        phase: Phase::Bracket,
                    }
                }
            }
            // Only the unpaced trial passed so far: look above it (the
            // paced sender may do better, and the first failure above says
            // what stops it), in steps growing from the resolution.
            (Some(pass), None) => Next::Trial {
                rate_bps: ((pass as f64) * (1.0 + self.step)).ceil() as u64,
                phase: Phase::Bracket,
            },
            (None, None) => self.found(false, false),
        }
    }

    /// Trials run again (see [`SENDER_REPEATS`]) spend the budget too.
    pub fn add_repeats(&mut self, n: u32) {
        self.trials += n;
    }

    /// Where the search stands, for a search stopped early.
    pub fn so_far(&self) -> Found {
        Found {
            rate_bps: self.pass,
            confirmed: false,
            first_failure_bps: self.fail,
            out_of_trials: false,
        }
    }

    /// Feeds the outcome of the trial [`Search::next_step`] asked for.
    pub fn record(&mut self, rate: u64, phase: Phase, passed: bool) {
        self.trials += 1;
        if passed {
            if phase == Phase::Confirm {
                self.confirmed += 1;
            } else {
                if self.fail.is_none() {
                    // Still looking for a failure above: bigger steps.
                    self.step = (self.step * 2.0).min(1.0);
                }
                self.pass = Some(self.pass.map_or(rate, |p| p.max(rate)));
            }
            return;
        }
        self.fail = Some(self.fail.map_or(rate, |f| f.min(rate)));
        if self.pass.is_some_and(|p| p >= rate) {
            // A pass that failed on a repeat (or a lower rate failed): it
            // is no longer a pass; bracket again, gently this time.
            self.pass = None;
            self.step = self.settings.resolution * 2.0;
        } else if phase == Phase::Bracket {
            self.step = (self.step * 2.0).min(FIRST_STEP);
        }
        self.confirming = false;
        self.confirmed = 0;
    }
}

/// Where a trial's shortfall was counted, in datagrams.
#[derive(Debug, Clone, Serialize)]
pub struct LossPlaces {
    pub lost_packets: u64,
    /// Drops on the server's socket (`kernel_drops_unit` says whether
    /// datagrams or GRO buffers).
    pub kernel_drops: Option<u64>,
    pub kernel_drops_unit: Option<&'static str>,
    /// The sender's ENOBUFS/EAGAIN back-offs.
    pub enobufs_retries: u64,
    /// Lost datagrams neither end counted: `lost_packets - kernel_drops`
    /// when the drops count datagrams; null when they count buffers.
    pub network_lost: Option<u64>,
    /// Datagrams the sender did not get out at the offered rate.
    pub not_sent_packets: u64,
    /// A reverse trial (`-R`): the server sent, this client received;
    /// the words name the ends so.
    #[serde(skip)]
    pub reverse: bool,
}

/// One trial of the search.
#[derive(Debug, Clone, Serialize)]
pub struct Trial {
    pub index: usize,
    pub phase: Phase,
    /// The rate asked of the pacer over all clients; null: unpaced.
    pub offered_bps: Option<u64>,
    /// Sender-side and server-side rates, bit/s of payload.
    pub sent_bps: Option<f64>,
    pub received_bps: Option<f64>,
    pub seconds: f64,
    pub sent_packets: u64,
    pub received_packets: u64,
    pub loss_percent: f64,
    pub backoff_seconds: f64,
    /// Lost datagrams, kernel drops, back-offs and the shortfall, at the
    /// trial's top level in JSON.
    #[serde(flatten)]
    pub places: LossPlaces,
    pub sender_cpu_percent: Option<f64>,
    pub receiver_cpu_percent: Option<f64>,
    /// The data's queue delay in this trial (the worst client's).
    pub queue_delay_ms: Option<Spread>,
    pub passed: bool,
    /// Why it failed: `receive_buffer`, `network`, `sender_queue`,
    /// `sender_cpu` or `queue_delay` (over `--max-delay`); null when it
    /// passed.
    pub cause: Option<Cap>,
    /// The sender alone failed this attempt, and it was run again: the
    /// search did not count it.
    pub repeated: bool,
}

impl Trial {
    /// The sender alone failed this trial (`sender_cpu`: it fell behind
    /// its pacing with no loss and no full queue) while its busiest
    /// thread used under [`BUSY_PERCENT`] of a core: it was descheduled
    /// (another busy process, a VM's stolen time). Such a trial measured
    /// this machine's scheduler, not the path.
    pub fn descheduled(&self) -> bool {
        self.cause == Some(Cap::SenderCpu)
            && self.sender_cpu_percent.is_some_and(|c| c < BUSY_PERCENT)
    }
}

/// The result: `limit` in the JSON report.
#[derive(Debug, Clone, Serialize)]
pub struct Limit {
    /// The highest offered rate that passed; null when none did.
    pub rate_bps: Option<u64>,
    /// The highest loss among the trials at that rate.
    pub loss_percent: Option<f64>,
    /// The mean receive rate of the trials at that rate.
    pub received_bps: Option<f64>,
    /// The worst queue delay among the trials at that rate.
    pub queue_delay_ms: Option<Spread>,
    /// `--max-delay`, ms: the bound a trial's p99 queue delay had to stay
    /// under; null without one.
    pub max_delay_ms: Option<f64>,
    /// It passed `confirmations` more trials.
    pub confirmed: bool,
    pub confirmations: u32,
    /// The lowest offered rate that failed, and why.
    pub first_loss_at_bps: Option<u64>,
    pub first_loss_cause: Option<Cap>,
    pub first_loss: Option<LossPlaces>,
    /// The unpaced trial's sender rate: the search's upper bound.
    pub unpaced_bps: f64,
    /// The unpaced trial passed: the sender itself is the limit.
    pub sender_bound: bool,
    pub resolution_percent: f64,
    pub loss_tolerance_percent: f64,
    pub trial_seconds: f64,
    pub pause_seconds: f64,
    pub buffer_size: usize,
    pub clients: usize,
    pub trials: usize,
    /// Ended at `--max-trials` before the resolution was reached.
    pub out_of_trials: bool,
    /// Stopped by a signal: the rate is the highest that passed so far.
    pub interrupted: bool,
    /// The offered rate at which the search stopped because the sender
    /// fell behind its pacing in every try (1 + [`SENDER_REPEATS`]) with
    /// no full queue and a core to spare: it was descheduled, so this
    /// machine, not the path, failed that rate. Nothing at or above it
    /// was measured; `rate_bps` is the highest rate that passed below it,
    /// not confirmed. Null when the search was not stopped so.
    pub descheduled_at_bps: Option<u64>,
}

/// `udp_client --find-limit --json`.
#[derive(Debug, Clone, Serialize)]
pub struct LimitReport {
    pub version: &'static str,
    pub start: String,
    pub server_addr: String,
    pub limit: Limit,
    pub trials: Vec<Trial>,
    /// What the result means, and what a user would trip over.
    pub notes: Vec<String>,
}

/// One trial's figures, whichever way the data flowed: an upload's from
/// its [`RunReport`] ([`TrialRun::of`]), a reverse stream's from what the
/// server said it sent and what this client counted.
#[derive(Debug, Clone, Default)]
pub struct TrialRun {
    pub buffer_size: usize,
    pub sent_packets: u64,
    pub sent_bytes: u64,
    /// The sending span, seconds.
    pub seconds: f64,
    /// The sender-side rate over all streams, bit/s.
    pub sent_bps: Option<f64>,
    pub enobufs_retries: u64,
    pub backoff_seconds: f64,
    /// The busiest sending thread, % of one core.
    pub sender_cpu_percent: Option<f64>,
    /// The receiver's count; None when it never came.
    pub receiver: Option<ReceiverFacts>,
    pub received_bps: Option<f64>,
    /// What the receiver's kernel drops count: `datagrams` or `buffers`.
    pub drops_unit: Option<&'static str>,
    /// A reverse stream: the server sent, this client received.
    pub reverse: bool,
    /// The data's queue delay (the worst stream's).
    pub queue_delay: Option<Spread>,
}

impl TrialRun {
    /// An upload trial's figures; an error when a client got no answer.
    pub fn of(r: &RunReport) -> Result<Self> {
        let Some(v) = r.server.as_ref().filter(|_| r.complete) else {
            return Err(Error::runtime(format!(
                "a trial got no end-of-test answer from {}: the search needs the receiver's counts",
                r.server_addr
            )));
        };
        Ok(TrialRun {
            buffer_size: r.buffer_size,
            sent_packets: r.sent_packets,
            sent_bytes: r.sent_bytes,
            seconds: r.seconds,
            // Each client's own rate, summed; when one client sent too
            // little to time (three unpaced clients backing off from one
            // full shaper: one got almost nothing through in 200 ms),
            // the run's bytes over its sending span instead, which reads
            // a little low for clients started apart, rather than no
            // rate at all.
            sent_bps: summed_client_bps(&r.clients).or_else(|| {
                (r.sent_packets > 1 && r.seconds > 0.0)
                    .then(|| r.sent_bytes as f64 * 8.0 / r.seconds)
            }),
            enobufs_retries: r.enobufs_retries,
            backoff_seconds: r.backoff_seconds,
            sender_cpu_percent: busiest_sender_percent(&r.clients),
            receiver: Some(ReceiverFacts::of(v)),
            received_bps: v.gbps.map(|g| g * 1e9),
            drops_unit: v.drops.kernel_drops_unit,
            reverse: false,
            queue_delay: v.queue.map(|q| q.spread),
        })
    }
}

/// The figures of one trial's run, judged against the settings.
pub fn judge_trial(
    index: usize,
    phase: Phase,
    offered_bps: Option<u64>,
    r: &TrialRun,
    s: &SearchSettings,
) -> Trial {
    let rx = r.receiver.unwrap_or_default();
    let (lost, loss_percent, kernel_drops) = (rx.lost, rx.loss_percent, rx.kernel_drops);
    let unit = r.drops_unit;
    let sent_bps = r.sent_bps;
    // Datagrams the pacer asked for that did not go out.
    let trial_seconds = s.trial.as_secs_f64();
    let size = r.buffer_size.max(1) as f64;
    let not_sent = offered_bps.map_or(0, |o| {
        let due = o as f64 * trial_seconds / 8.0 / size;
        (due - r.sent_packets as f64).max(0.0) as u64
    });
    // Held: the bytes sent are the offered rate over the trial (each
    // client paces its share for the trial's length from its own start, so
    // a rate over the union of their spans would read low).
    let held = offered_bps.is_none_or(|o| {
        r.sent_bytes as f64 * 8.0 >= o as f64 * trial_seconds * (1.0 - s.resolution / 2.0)
    });
    let lossy = loss_percent > s.loss_tolerance;
    let delayed = s.max_delay.is_some_and(|bound| {
        r.queue_delay
            .is_none_or(|q| q.p99 > bound.as_secs_f64() * 1e3)
    });
    let passed = !lossy && held && !delayed;
    let drops = kernel_drops.unwrap_or(0);
    let cause = if passed {
        None
    } else if lossy && rx.drops_are_most_of_the_loss() {
        Some(Cap::ReceiveBuffer)
    } else if lossy {
        Some(Cap::Network)
    } else if delayed && held {
        Some(Cap::QueueDelay)
    } else if r.enobufs_retries > 0 {
        Some(Cap::SenderQueue)
    } else {
        Some(Cap::SenderCpu)
    };
    Trial {
        index,
        phase,
        offered_bps,
        sent_bps,
        received_bps: r.received_bps,
        seconds: r.seconds,
        sent_packets: r.sent_packets,
        received_packets: rx.received,
        loss_percent,
        backoff_seconds: r.backoff_seconds,
        sender_cpu_percent: r.sender_cpu_percent,
        receiver_cpu_percent: rx.cpu_percent,
        queue_delay_ms: r.queue_delay,
        passed,
        cause,
        repeated: false,
        places: LossPlaces {
            lost_packets: lost,
            kernel_drops,
            kernel_drops_unit: unit,
            enobufs_retries: r.enobufs_retries,
            network_lost: match unit {
                Some("buffers") => None,
                _ => Some(lost.saturating_sub(drops)),
            },
            not_sent_packets: not_sent,
            reverse: r.reverse,
        },
    }
}

/// Runs the trials of one search and keeps them.
struct Runner<'a> {
    cfg: &'a ClientConfig,
    s: &'a SearchSettings,
    shutdown: &'a Shutdown,
    on_trial: &'a mut dyn FnMut(&Trial),
    /// Runs one trial: an upload, or a reverse stream (`-R`).
    run: &'a mut dyn FnMut(&ClientConfig) -> Result<TrialRun>,
    trials: Vec<Trial>,
}

/// Why a search stopped early.
enum Stopped {
    /// A signal.
    Signal,
    /// The sender fell behind at this offered rate in every try, while
    /// descheduled ([`Trial::descheduled`]).
    Descheduled(u64),
}

impl Runner<'_> {
    /// One trial at `rate` over all clients (unpaced: None); or,
    /// when a signal stopped it, `Ok(Err(Stopped))` (its partial figures
    /// are dropped).
    fn once(
        &mut self,
        rate: Option<u64>,
        phase: Phase,
    ) -> Result<std::result::Result<Trial, Stopped>> {
        if !self.trials.is_empty() && pause(self.s.pause, self.shutdown) {
            return Ok(Err(Stopped::Signal));
        }
        let clients = self.cfg.clients.max(1) as u64;
        let offered = rate.map(|r| split_evenly(r, clients));
        let mut trial_cfg = self.cfg.clone();
        trial_cfg.volume = Volume::Time(self.s.trial);
        trial_cfg.interval = None;
        trial_cfg.rate_bps = offered.map(|o| o / clients);
        let run = (self.run)(&trial_cfg);
        if self.shutdown.is_triggered() {
            return Ok(Err(Stopped::Signal));
        }
        let run =
            run.map_err(|e| Error::runtime(format!("trial {}: {e}", self.trials.len() + 1)))?;
        let trial = judge_trial(self.trials.len() + 1, phase, offered, &run, self.s);
        (self.on_trial)(&trial);
        self.trials.push(trial.clone());
        Ok(Ok(trial))
    }

    /// A trial that counts. One the sender alone failed (it fell behind
    /// with no full queue) says nothing about the path: it is run again,
    /// up to [`SENDER_REPEATS`] times while `--max-trials` allows, and the
    /// attempts before are marked `repeated`. When the last try still
    /// fell behind while descheduled ([`Trial::descheduled`]), the rate
    /// is not counted as failed by the path: the search stops there
    /// ([`Stopped::Descheduled`]). A sender that fell behind on a busy
    /// core (or whose CPU is unknown) did fail the rate: that counts.
    fn counted(
        &mut self,
        rate: Option<u64>,
        phase: Phase,
    ) -> Result<std::result::Result<Trial, Stopped>> {
        let mut repeats = 0;
        loop {
            let trial = match self.once(rate, phase)? {
                Ok(t) => t,
                Err(stopped) => return Ok(Err(stopped)),
            };
            let budget_left = self.trials.len() < self.s.max_trials as usize;
            if trial.cause != Some(Cap::SenderCpu) {
                return Ok(Ok(trial));
            }
            if repeats == SENDER_REPEATS || !budget_left {
                return Ok(match (trial.descheduled(), trial.offered_bps) {
                    (true, Some(offered)) => Err(Stopped::Descheduled(offered)),
                    _ => Ok(trial),
                });
            }
            if let Some(last) = self.trials.last_mut() {
                last.repeated = true;
            }
            repeats += 1;
        }
    }
}

/// Runs the search against `cfg.server` with uploads, calling `on_trial`
/// after each trial (for the live lines). A signal ends it with the
/// result so far.
pub fn find(
    cfg: &ClientConfig,
    s: &SearchSettings,
    shutdown: &Shutdown,
    on_trial: &mut dyn FnMut(&Trial),
) -> Result<LimitReport> {
    let mut upload = |c: &ClientConfig| super::run(c, shutdown).and_then(|r| TrialRun::of(&r));
    find_with(cfg, s, shutdown, on_trial, &mut upload)
}

/// [`find`], each trial run by `run` (`-R` runs reverse streams).
pub fn find_with(
    cfg: &ClientConfig,
    s: &SearchSettings,
    shutdown: &Shutdown,
    on_trial: &mut dyn FnMut(&Trial),
    run: &mut dyn FnMut(&ClientConfig) -> Result<TrialRun>,
) -> Result<LimitReport> {
    let started = std::time::SystemTime::now();
    let mut runner = Runner {
        cfg,
        s,
        shutdown,
        on_trial,
        run,
        trials: Vec::new(),
    };
    let unpaced = match runner.counted(None, Phase::Unpaced)? {
        Ok(t) => t,
        Err(_) => {
            return Err(Error::runtime(
                "stopped during the first (unpaced) trial: no result",
            ))
        }
    };
    let upper = unpaced.sent_bps.unwrap_or(0.0) as u64;
    if upper == 0 {
        return Err(Error::runtime(format!(
            "the unpaced trial sent too little for a rate in {:.3} s: give a longer --trial-duration",
            s.trial.as_secs_f64()
        )));
    }
    let mut search = Search::new(*s, upper, unpaced.passed);
    search.add_repeats((runner.trials.len() - 1) as u32);
    let mut interrupted = false;
    let mut descheduled_at = None;
    let found = loop {
        match search.next_step() {
            Next::Done(found) => break found,
            Next::Trial { rate_bps, phase } => {
                let before = runner.trials.len();
                match runner.counted(Some(rate_bps), phase)? {
                    Ok(t) => {
                        // Repeats spend the --max-trials budget too.
                        search.add_repeats((runner.trials.len() - before - 1) as u32);
                        // The offered rate is what the clients were paced at.
                        search.record(rate_bps, phase, t.passed);
                    }
                    Err(Stopped::Signal) => {
                        interrupted = true;
                        break search.so_far();
                    }
                    Err(Stopped::Descheduled(offered)) => {
                        search.add_repeats((runner.trials.len() - before - 1) as u32);
                        descheduled_at = Some(offered);
                        break search.so_far();
                    }
                }
            }
        }
    };
    let stopped = descheduled_at.is_some();
    let mut report = summarise(cfg, s, started, &unpaced, found, runner.trials, stopped);
    if let Some(offered) = descheduled_at {
        report.limit.descheduled_at_bps = Some(offered);
        let cpu = report
            .trials
            .iter()
            .rev()
            .take(SENDER_REPEATS as usize + 1)
            .filter_map(|t| t.sender_cpu_percent)
            .fold(0.0, f64::max);
        report.notes.insert(
            0,
            format!(
                "stopped: this machine was too busy to offer {:.3} Mbit/s: in {} tries the sender fell behind its pacing with no full queue, using at most {cpu:.0}% of a core (it was descheduled); nothing at or above that rate was measured, the rate found is the highest that passed below it, not confirmed; run again on a quieter machine, or with --scheduler fifo",
                offered as f64 / 1e6,
                SENDER_REPEATS + 1
            ),
        );
    }
    if interrupted {
        report.limit.interrupted = true;
        report.notes.insert(
            0,
            "interrupted: the search stopped before it ended; the rate is the highest that passed so far, not confirmed".into(),
        );
    }
    Ok(report)
}

/// A search step's `rate` as offered: the pacer paces each client, so it
/// is split evenly, and the offer is a multiple of the client count.
fn split_evenly(rate: u64, clients: u64) -> u64 {
    (rate / clients).max(1) * clients
}

/// Sleeps `d` unless stopped; true when stopped.
fn pause(d: Duration, shutdown: &Shutdown) -> bool {
    let until = Instant::now() + d;
    while !shutdown.is_triggered() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        std::thread::sleep(left.min(crate::shutdown::POLL));
    }
    true
}

fn summarise(
    cfg: &ClientConfig,
    s: &SearchSettings,
    started: std::time::SystemTime,
    unpaced: &Trial,
    found: Found,
    trials: Vec<Trial>,
    stopped_descheduled: bool,
) -> LimitReport {
    // The rate a search step asked for, as offered.
    let clients = cfg.clients.max(1) as u64;
    let split = |r: u64| split_evenly(r, clients);
    let at_limit: Vec<&Trial> = found.rate_bps.map_or(Vec::new(), |rate| {
        trials
            .iter()
            .filter(|t| !t.repeated && t.offered_bps == Some(split(rate)))
            .collect()
    });
    // Nothing paced above the unpaced rate passed: the sender (or its own
    // queue) is the limit, not the path.
    let sender_bound =
        unpaced.passed && found.rate_bps == Some(unpaced.sent_bps.unwrap_or(0.0) as u64);
    // The lowest failing rate's trial (the unpaced one when nothing paced
    // failed), for where its losses were counted.
    let first_failure = found.first_failure_bps.and_then(|rate| {
        trials
            .iter()
            .filter(|t| !t.passed && !t.repeated)
            .find(|t| match t.offered_bps {
                Some(offered) => offered == split(rate),
                None => t.sent_bps.map(|b| b as u64) == Some(rate),
            })
    });
    let mut notes = Vec::new();
    if found.rate_bps.is_none() && found.out_of_trials {
        notes.push(format!(
            "stopped at --max-trials {} before any paced trial passed: no rate found",
            s.max_trials
        ));
    } else if found.out_of_trials {
        notes.push(format!(
            "stopped at --max-trials {} before the resolution was reached: the rate is the highest that passed, not confirmed",
            s.max_trials
        ));
    } else if found.rate_bps.is_none() && !stopped_descheduled {
        notes.push(format!(
            "no rate passed down to 1/{FLOOR_DIVISOR} of the unpaced rate: the path loses at every rate worth measuring (see the trials' causes)"
        ));
    }
    if sender_bound {
        notes.push(if unpaced.places.enobufs_retries > 0 {
            "the unpaced trial lost nothing: the sender's own queue (a slower link or a shaper on this host) set its rate, and nothing faster passed".into()
        } else {
            "the unpaced trial lost nothing: the sender is the limit, not the path (try --clients 2)".into()
        });
    }
    let mean = |f: fn(&Trial) -> Option<f64>| {
        let v: Vec<f64> = at_limit.iter().filter_map(|t| f(t)).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    LimitReport {
        version: env!("CARGO_PKG_VERSION"),
        start: humantime::format_rfc3339_millis(started).to_string(),
        server_addr: cfg.server.to_string(),
        limit: Limit {
            rate_bps: found.rate_bps.map(split),
            loss_percent: at_limit.iter().map(|t| t.loss_percent).reduce(f64::max),
            received_bps: mean(|t| t.received_bps),
            queue_delay_ms: at_limit
                .iter()
                .filter_map(|t| t.queue_delay_ms)
                .reduce(Spread::worst),
            max_delay_ms: s.max_delay.map(|d| d.as_secs_f64() * 1e3),
            confirmed: found.confirmed,
            confirmations: s.confirmations,
            first_loss_at_bps: found.first_failure_bps.map(split),
            first_loss_cause: first_failure.and_then(|t| t.cause),
            first_loss: first_failure.map(|t| t.places.clone()),
            unpaced_bps: unpaced.sent_bps.unwrap_or(0.0),
            sender_bound,
            resolution_percent: (s.resolution * 100.0 * 1e6).round() / 1e6,
            loss_tolerance_percent: s.loss_tolerance,
            trial_seconds: s.trial.as_secs_f64(),
            pause_seconds: s.pause.as_secs_f64(),
            buffer_size: cfg.buffer_size,
            clients: cfg.clients,
            trials: trials.len(),
            out_of_trials: found.out_of_trials,
            interrupted: false,
            descheduled_at_bps: None,
        },
        trials,
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> SearchSettings {
        SearchSettings {
            resolution: 0.02,
            confirmations: 2,
            max_trials: 40,
            loss_tolerance: 0.0,
            max_delay: None,
            trial: Duration::from_secs(1),
            pause: Duration::ZERO,
        }
    }

    #[test]
    fn max_delay_fails_a_lossless_trial_whose_queue_grew() {
        let run = |p99: Option<f64>| TrialRun {
            buffer_size: 1000,
            sent_packets: 1000,
            sent_bytes: 1_000_000,
            seconds: 1.0,
            receiver: Some(ReceiverFacts {
                received: 1000,
                ..ReceiverFacts::default()
            }),
            queue_delay: p99.map(|p99| Spread {
                p50: p99 / 2.0,
                p90: p99,
                p99,
                max: p99,
            }),
            ..TrialRun::default()
        };
        let offered = Some(8_000_000);
        let bounded = SearchSettings {
            max_delay: Some(Duration::from_millis(10)),
            ..settings()
        };
        let judge = |r: &TrialRun, s: &SearchSettings| judge_trial(1, Phase::Bisect, offered, r, s);
        let over = judge(&run(Some(12.0)), &bounded);
        assert!(!over.passed);
        assert_eq!(over.cause, Some(Cap::QueueDelay));
        assert!(judge(&run(Some(9.0)), &bounded).passed);
        assert!(
            judge(&run(Some(12.0)), &settings()).passed,
            "no bound: delay alone never fails"
        );
        let unknown = judge(&run(None), &bounded);
        assert!(!unknown.passed, "a bound that cannot be checked is not met");
    }

    /// Runs a search against a path that carries everything up to `limit`
    /// (and, with `flaky`, fails the first trial at each of those rates).
    fn search(upper: u64, limit: u64, flaky: &[u64]) -> (Found, Vec<(u64, Phase)>) {
        let unpaced_passed = upper <= limit;
        let mut s = Search::new(settings(), upper, unpaced_passed);
        let mut seen = Vec::new();
        let mut flaked = Vec::new();
        loop {
            match s.next_step() {
                Next::Done(f) => return (f, seen),
                Next::Trial { rate_bps, phase } => {
                    seen.push((rate_bps, phase));
                    let flake = flaky.contains(&rate_bps) && !flaked.contains(&rate_bps);
                    if flake {
                        flaked.push(rate_bps);
                    }
                    s.record(rate_bps, phase, rate_bps <= limit && !flake);
                }
            }
        }
    }

    #[test]
    fn finds_the_limit_within_the_resolution_and_confirms_it() {
        for (upper, limit) in [
            (40_000_000_000u64, 15_700_000_000u64),
            (1_000_000_000, 999_000_000),
            (1_000_000_000, 10_000_000),
            (100_000, 1_234),
        ] {
            let (f, seen) = search(upper, limit, &[]);
            let rate = f.rate_bps.expect("a rate");
            assert!(rate <= limit, "{rate} > {limit}");
            let fail = f.first_failure_bps.expect("a failure");
            assert!(fail > limit);
            assert!(
                (fail - rate) as f64 <= 0.02 * fail as f64,
                "{rate}..{fail} wider than 2 %"
            );
            assert!(f.confirmed && !f.out_of_trials);
            let confirms: Vec<_> = seen.iter().filter(|t| t.1 == Phase::Confirm).collect();
            assert_eq!(confirms.len(), 2, "{seen:?}");
            assert!(confirms.iter().all(|t| t.0 == rate));
            assert!(seen.len() < 40, "{} trials: {seen:?}", seen.len());
        }
    }

    #[test]
    fn an_unpaced_pass_is_probed_from_above() {
        // The paced sender cannot beat its unpaced rate: the first step
        // above fails, and the unpaced rate is confirmed.
        let (f, seen) = search(5_000_000_000, 5_000_000_000, &[]);
        assert_eq!(f.rate_bps, Some(5_000_000_000));
        assert!(f.confirmed);
        assert_eq!(f.first_failure_bps, Some(5_100_000_000));
        assert_eq!(
            seen,
            vec![
                (5_100_000_000, Phase::Bracket),
                (5_000_000_000, Phase::Confirm),
                (5_000_000_000, Phase::Confirm)
            ]
        );
        // A path above the unpaced rate: steps grow until one fails.
        let (f, seen) = search(5_000_000_000, 9_000_000_000, &[]);
        let rate = f.rate_bps.unwrap();
        let fail = f.first_failure_bps.unwrap();
        assert!(rate <= 9_000_000_000 && fail > 9_000_000_000, "{seen:?}");
        assert!((fail - rate) as f64 <= 0.02 * fail as f64, "{seen:?}");
        assert!(f.confirmed);
        assert!(seen.len() < 15, "{seen:?}");
    }

    #[test]
    fn a_failed_confirmation_searches_again_below() {
        // The first trial at each of the first rates found fails, once.
        let (first, _) = search(40_000_000_000, 15_700_000_000, &[]);
        let flaky = [first.rate_bps.unwrap()];
        let (f, seen) = search(40_000_000_000, 15_700_000_000, &flaky);
        let rate = f.rate_bps.unwrap();
        assert!(f.confirmed, "{seen:?}");
        assert!(rate < flaky[0], "{rate} after {flaky:?} flaked");
        let fail = f.first_failure_bps.unwrap();
        assert!((fail - rate) as f64 <= 0.02 * fail as f64);
    }

    #[test]
    fn a_path_that_loses_everywhere_has_no_limit() {
        let (f, seen) = search(1_000_000_000, 0, &[]);
        assert_eq!(f.rate_bps, None);
        assert!(!f.confirmed);
        assert!(seen.iter().all(|t| t.1 == Phase::Bracket));
        assert!(
            seen.len() <= 13,
            "halving to 1/4096 takes 12 steps: {seen:?}"
        );
    }

    /// A search whose trials are made up: the path carries `limit`, and
    /// from `behind_from` up the sender falls a fifth behind its pacing
    /// using `cpu` % of a core.
    fn fake_search(limit: u64, behind_from: u64, cpu: f64) -> LimitReport {
        let args = crate::config::parse_args::<crate::config::client::ClientArgs>(
            [
                "udp_client",
                "-s",
                "192.0.2.1:9",
                "--find-limit",
                "-b",
                "1000",
            ]
            .map(Into::into),
        )
        .unwrap();
        let cfg = ClientConfig::from_args(args).unwrap();
        let s = settings();
        let mut run = |c: &ClientConfig| -> Result<TrialRun> {
            // Unpaced: 1 Gbit/s, lost in part above the limit.
            let offered = c.rate_bps.unwrap_or(1_000_000_000);
            let behind = c.rate_bps.is_some() && offered >= behind_from;
            let sent_bytes = if behind {
                offered / 8 * 4 / 5
            } else {
                offered / 8
            };
            let sent = sent_bytes / 1000;
            let lost = if offered > limit && !behind {
                sent / 10
            } else {
                0
            };
            Ok(TrialRun {
                buffer_size: 1000,
                sent_packets: sent,
                sent_bytes,
                seconds: 1.0,
                sent_bps: Some(sent_bytes as f64 * 8.0),
                sender_cpu_percent: Some(cpu),
                receiver: Some(ReceiverFacts {
                    received: sent - lost,
                    lost,
                    loss_percent: lost as f64 * 100.0 / sent as f64,
                    ..ReceiverFacts::default()
                }),
                ..TrialRun::default()
            })
        };
        find_with(&cfg, &s, &Shutdown::new(), &mut |_| {}, &mut run).unwrap()
    }

    #[test]
    fn a_descheduled_sender_stops_the_search_instead_of_failing_the_rate() {
        // The path carries 600 Mbit/s; from 400 up the sender is
        // descheduled (10 % of a core): 500 (the first halving) falls
        // behind three times, and the search stops there.
        let r = fake_search(600_000_000, 400_000_000, 10.0);
        let l = &r.limit;
        assert_eq!(l.descheduled_at_bps, Some(500_000_000), "{l:?}");
        assert_eq!(l.rate_bps, None, "nothing passed below 500: {l:?}");
        assert!(!l.confirmed);
        // The unpaced trial's loss is the only failure counted.
        assert_eq!(l.first_loss_at_bps, Some(1_000_000_000));
        assert_eq!(l.first_loss_cause, Some(Cap::Network));
        assert_eq!(r.trials.len(), 1 + 1 + SENDER_REPEATS as usize);
        assert!(r.trials[1..].iter().all(Trial::descheduled));
        assert!(
            r.notes[0].starts_with(
                "stopped: this machine was too busy to offer 500.000 Mbit/s: in 3 tries"
            ),
            "{:?}",
            r.notes
        );
        assert_eq!(
            r.notes.len(),
            1,
            "nothing on rates not tried: {:?}",
            r.notes
        );
        // Faster than the path allows, a sender that keeps up finds its
        // limit, untouched.
        let r = fake_search(300_000_000, 700_000_000, 10.0);
        let l = &r.limit;
        assert_eq!(l.descheduled_at_bps, None, "{l:?}");
        assert!(l.confirmed, "{l:?}");
        let rate = l.rate_bps.unwrap();
        assert!((290_000_000..=300_000_000).contains(&rate), "{rate}");
    }

    #[test]
    fn a_sender_on_a_busy_core_that_falls_behind_fails_the_rate() {
        // CPU-bound (99 % of a core): the sender cannot offer 500 Mbit/s,
        // and that is a result: the search goes on below it.
        let r = fake_search(600_000_000, 400_000_000, 99.0);
        let l = &r.limit;
        assert_eq!(l.descheduled_at_bps, None, "{l:?}");
        assert!(l.confirmed, "{l:?}");
        assert!(l.rate_bps.unwrap() < 400_000_000, "{l:?}");
        assert_eq!(l.first_loss_cause, Some(Cap::SenderCpu), "{l:?}");
        assert!(r.trials.iter().any(|t| t.repeated));
    }

    #[test]
    fn max_trials_bounds_the_search() {
        let mut s = Search::new(
            SearchSettings {
                max_trials: 4,
                ..settings()
            },
            1_000_000_000,
            false,
        );
        let mut n = 1;
        while let Next::Trial { rate_bps, phase } = s.next_step() {
            s.record(rate_bps, phase, rate_bps < 300_000_000);
            n += 1;
        }
        assert_eq!(n, 4);
        match s.next_step() {
            Next::Done(f) => {
                assert!(f.out_of_trials && !f.confirmed);
                assert_eq!(f.rate_bps, Some(250_000_000));
            }
            other => panic!("{other:?}"),
        }
    }
}
