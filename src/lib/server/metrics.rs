//! What `udp_server --metrics` exposes, kept off the receive path.
//!
//! The receive threads never see this module. The server's own thread (the
//! one that finalises sessions) publishes to a [`Board`]:
//!
//! * a [`Live`] snapshot of every unfinished peer and the server's totals,
//!   built under the table's lock it already takes each loop, but only
//!   when a scrape asked for one ([`Board::view`] sets a flag and wakes
//!   that thread), so an unscraped server pays nothing and a scraped one
//!   pays once per scrape, not per datagram;
//! * every `peer_done` report, as it is passed on: a finished peer's
//!   series then carry exactly the figures its `peer_done` line printed.
//!
//! Finished peers are kept for `--metrics-retain` and at most `--max-peers`
//! of them, oldest dropped first ([`Retained`]); unfinished peers are
//! bounded by `--max-peers` already. So the label sets a scrape can show
//! are bounded, whatever the traffic.
//!
//! Formatting the exposition is [`crate::output::metrics`]' business.

use crate::meter::account::{PeerReport, Totals};
use crate::stats::CpuTime;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// One peer's series: what is exposed for it.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerSample {
    /// `addr:port`, as `peer_done` prints it.
    pub peer: String,
    /// The session id in hex; empty for untagged traffic.
    pub session: String,
    pub packets: u64,
    pub bytes: u64,
    /// Lost so far: an estimate from sequence numbers until the End
    /// arrives, then against what the client declared (`lost` in
    /// `peer_done`). Untagged peers have none of the sequence figures.
    pub lost: Option<u64>,
    pub duplicates: Option<u64>,
    pub reordered: Option<u64>,
    /// Drops on the peer's receive socket while it was active
    /// (`socket_wide_kernel_drops`), and whether other traffic shared it.
    pub kernel_drops: Option<u64>,
    pub kernel_drops_shared: bool,
    /// The receive threads' CPU seconds while the peer was active.
    pub cpu_seconds: Option<f64>,
    /// Its `peer_done` was written: these figures are final.
    pub finished: bool,
    /// A reverse stream (the server sends): payload bytes sent so far.
    /// None for what the server receives.
    pub sent_bytes: Option<u64>,
    /// The session's queue delay so far (`peer_done queue_delay_ms`), in
    /// seconds: median and 99th percentile.
    pub queue_delay_p50: Option<f64>,
    pub queue_delay_p99: Option<f64>,
}

/// The labels that name a peer's series.
pub type PeerKey = (String, String);

impl PeerSample {
    pub fn of(r: &PeerReport, finished: bool) -> Self {
        PeerSample {
            peer: r.peer.clone(),
            session: r.session.clone().unwrap_or_default(),
            packets: r.packets,
            bytes: r.bytes,
            lost: r.lost,
            duplicates: r.duplicates,
            reordered: r.reordered,
            kernel_drops: r.drops.socket_wide_kernel_drops,
            kernel_drops_shared: r.drops.socket_wide_kernel_drops.is_some()
                && r.drops.kernel_drops.is_none(),
            cpu_seconds: r.cpu.map(|c| c.seconds),
            finished,
            sent_bytes: None,
            queue_delay_p50: r.queue_delay_ms.map(|q| q.p50 / 1e3),
            queue_delay_p99: r.queue_delay_ms.map(|q| q.p99 / 1e3),
        }
    }

    /// A reverse stream, sending or done: what the server sent, and what
    /// its client said it received once it answered.
    pub fn of_stream(
        peer: String,
        session: String,
        sent_bytes: u64,
        received: Option<(u64, u64)>,
        finished: bool,
    ) -> Self {
        PeerSample {
            peer,
            session,
            packets: received.map_or(0, |r| r.0),
            bytes: received.map_or(0, |r| r.1),
            lost: None,
            duplicates: None,
            reordered: None,
            kernel_drops: None,
            kernel_drops_shared: false,
            cpu_seconds: None,
            finished,
            sent_bytes: Some(sent_bytes),
            queue_delay_p50: None,
            queue_delay_p99: None,
        }
    }

    pub fn key(&self) -> PeerKey {
        (self.peer.clone(), self.session.clone())
    }
}

/// The server-wide figures, as of a snapshot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerSample {
    /// Every datagram counted (data, duplicates, untagged, late, overflow).
    pub packets: u64,
    pub bytes: u64,
    /// Peer entries ever created.
    pub peers: u64,
    /// Traffic that found the peer table full (`--max-peers`).
    pub overflow_packets: u64,
    /// Datagrams for sessions already finished.
    pub late_packets: u64,
    /// Drops on the receive socket(s), where the kernel counts them.
    pub kernel_drops: Option<u64>,
    /// The receive threads' CPU seconds.
    pub receive_cpu_seconds: Option<f64>,
    /// Control messages read (Hello, End, probes): not in `packets`.
    pub control_packets: u64,
    /// The most any receive socket's buffer was seen holding (SO_MEMINFO),
    /// where the platform tells.
    pub recv_buffer_most: Option<u64>,
    /// What came from sessions never proven, by reason, and the answers
    /// the budgets refused.
    pub not_proven: crate::meter::account::NotProven,
    pub answers_limited: u64,
}

impl ServerSample {
    pub fn of(totals: &Totals, kernel_drops: Option<u64>, cpu: Option<CpuTime>) -> Self {
        ServerSample {
            packets: totals.packets,
            bytes: totals.bytes,
            peers: totals.peers,
            overflow_packets: totals.overflow.packets,
            late_packets: totals.late_packets,
            kernel_drops,
            receive_cpu_seconds: cpu.map(|c| c.total().as_secs_f64()),
            control_packets: totals.control_packets,
            recv_buffer_most: None,
            not_proven: totals.not_proven,
            answers_limited: totals.answers_limited,
        }
    }
}

/// What does not change while the server runs.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerInfo {
    pub version: &'static str,
    pub method: &'static str,
    pub threads: usize,
    /// SO_RCVBUF as granted by the kernel.
    pub recv_buffer: u64,
    pub max_peers: usize,
}

/// A snapshot of the unfinished peers and the totals, taken by the
/// server's thread when a scrape asked.
#[derive(Debug, Clone)]
pub struct Live {
    pub peers: Vec<PeerSample>,
    pub server: ServerSample,
}

/// What one scrape exposes.
#[derive(Debug, Clone)]
pub struct View {
    pub info: ServerInfo,
    pub server: ServerSample,
    /// Every `peer_done` so far (retained or not).
    pub peers_finished: u64,
    /// Unfinished peers first, then finished ones, oldest first.
    pub peers: Vec<PeerSample>,
}

impl View {
    pub fn active(&self) -> usize {
        self.peers.iter().filter(|p| !p.finished).count()
    }
}

struct Kept {
    at: Instant,
    /// The snapshot generation current when it finished (see [`merge`]).
    generation: u64,
    sample: PeerSample,
}

/// Finished peers' final figures: each kept for `retain`, at most `most`
/// of them, oldest dropped first; a peer that finishes again under the
/// same labels (an untagged source that came back) replaces its record.
pub struct Retained {
    retain: Duration,
    most: usize,
    by_key: HashMap<PeerKey, u64>,
    entries: BTreeMap<u64, Kept>,
    next: u64,
}

impl Retained {
    pub fn new(retain: Duration, most: usize) -> Self {
        Retained {
            retain,
            most: most.max(1),
            by_key: HashMap::new(),
            entries: BTreeMap::new(),
            next: 0,
        }
    }

    /// Keeps `sample`, finished at `at` during snapshot `generation`.
    pub fn insert(&mut self, sample: PeerSample, at: Instant, generation: u64) {
        let key = sample.key();
        if let Some(old) = self.by_key.remove(&key) {
            self.entries.remove(&old);
        }
        self.next += 1;
        self.by_key.insert(key, self.next);
        self.entries.insert(
            self.next,
            Kept {
                at,
                generation,
                sample,
            },
        );
        while self.entries.len() > self.most {
            self.pop_oldest();
        }
    }

    fn pop_oldest(&mut self) {
        if let Some((_, kept)) = self.entries.pop_first() {
            self.by_key.remove(&kept.sample.key());
        }
    }

    /// Drops the records older than the retention period.
    pub fn age_out(&mut self, now: Instant) {
        while let Some((_, kept)) = self.entries.first_key_value() {
            if now.saturating_duration_since(kept.at) < self.retain {
                break;
            }
            self.pop_oldest();
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn generation_of(&self, key: &PeerKey) -> Option<u64> {
        let id = self.by_key.get(key)?;
        self.entries.get(id).map(|k| k.generation)
    }

    /// The samples kept, oldest first.
    pub fn samples(&self) -> impl Iterator<Item = &PeerSample> {
        self.entries.values().map(|k| &k.sample)
    }
}

/// The peers a scrape shows: the snapshot's unfinished peers and the
/// retained finished ones, each label set once. Where both name the same
/// peer, the later word wins: a record kept since `live` was taken
/// (generation at least `live_generation`) means that peer finished after
/// the snapshot, so its final figures win; an older record is a previous
/// peer under the same labels (an untagged source that came back), and
/// the live one wins.
pub fn merge(live: &[PeerSample], live_generation: u64, retained: &Retained) -> Vec<PeerSample> {
    let mut shown: Vec<PeerSample> = Vec::with_capacity(live.len() + retained.len());
    let mut superseded = std::collections::HashSet::new();
    for sample in live {
        let key = sample.key();
        match retained.generation_of(&key) {
            Some(g) if g >= live_generation => {}
            Some(_) => {
                superseded.insert(key);
                shown.push(sample.clone());
            }
            None => shown.push(sample.clone()),
        }
    }
    shown.extend(
        retained
            .samples()
            .filter(|s| !superseded.contains(&s.key()))
            .cloned(),
    );
    shown
}

/// A snapshot younger than this is served as it is, so a burst of scrapes
/// costs the server one snapshot.
pub const FRESH_ENOUGH: Duration = Duration::from_millis(100);
/// How long a scrape waits for the server's thread to publish a snapshot
/// before it serves the one it has.
pub const SNAPSHOT_WAIT: Duration = Duration::from_secs(1);

struct State {
    live: Option<(Instant, Live)>,
    generation: u64,
    retained: Retained,
    finished: u64,
    /// The server's thread is running and can publish.
    running: bool,
}

/// Where the server publishes and scrapes read; shared with the HTTP
/// thread behind an `Arc`.
pub struct Board {
    info: ServerInfo,
    state: Mutex<State>,
    published: Condvar,
    wanted: AtomicBool,
    server: Mutex<Option<Thread>>,
}

impl Board {
    /// `retain` and `most` bound the finished peers kept.
    pub fn new(info: ServerInfo, retain: Duration, most: usize) -> Self {
        Board {
            info,
            state: Mutex::new(State {
                live: None,
                generation: 0,
                retained: Retained::new(retain, most),
                finished: 0,
                running: false,
            }),
            published: Condvar::new(),
            wanted: AtomicBool::new(false),
            server: Mutex::new(None),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Called on the server's thread as it starts: scrapes wake it.
    pub(crate) fn attach(&self) {
        *self.server.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::thread::current());
        self.state().running = true;
    }

    /// Called as the server stops: scrapes no longer wait for it.
    pub(crate) fn detach(&self) {
        *self.server.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.state().running = false;
        self.published.notify_all();
    }

    /// Whether a scrape is waiting for a snapshot (and clears the flag).
    pub(crate) fn take_wanted(&self) -> bool {
        self.wanted.swap(false, Ordering::Relaxed)
    }

    pub(crate) fn publish(&self, live: Live) {
        let mut state = self.state();
        state.generation += 1;
        state.live = Some((Instant::now(), live));
        drop(state);
        self.published.notify_all();
    }

    /// A `peer_done` report: the peer's final figures.
    pub(crate) fn finished(&self, report: &PeerReport) {
        self.finished_sample(PeerSample::of(report, true));
    }

    /// A finished peer's or stream's final figures.
    pub(crate) fn finished_sample(&self, sample: PeerSample) {
        let mut state = self.state();
        let generation = state.generation;
        state.finished += 1;
        state.retained.insert(sample, Instant::now(), generation);
    }

    /// What a scrape shows: a fresh snapshot (asked of the server's thread,
    /// waited for at most `wait`), merged with the retained finished peers.
    pub fn view(&self, wait: Duration) -> View {
        let mut state = self.state();
        let fresh = state
            .live
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < FRESH_ENOUGH);
        if !fresh && state.running {
            let asked_at = state.generation;
            self.wanted.store(true, Ordering::Relaxed);
            if let Some(server) = &*self.server.lock().unwrap_or_else(|p| p.into_inner()) {
                server.unpark();
            }
            let deadline = Instant::now() + wait;
            while state.generation == asked_at && state.running {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                state = self
                    .published
                    .wait_timeout(state, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        }
        state.retained.age_out(Instant::now());
        let (live, server): (&[PeerSample], ServerSample) = match &state.live {
            Some((_, live)) => (&live.peers, live.server.clone()),
            None => (&[], ServerSample::default()),
        };
        View {
            info: self.info.clone(),
            server,
            peers_finished: state.finished,
            peers: merge(live, state.generation, &state.retained),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(peer: &str, packets: u64, finished: bool) -> PeerSample {
        PeerSample {
            peer: peer.into(),
            session: "00000000000000aa".into(),
            packets,
            bytes: packets * 100,
            lost: Some(0),
            duplicates: Some(0),
            reordered: Some(0),
            kernel_drops: None,
            kernel_drops_shared: false,
            cpu_seconds: None,
            finished,
            sent_bytes: None,
            queue_delay_p50: None,
            queue_delay_p99: None,
        }
    }

    fn peers(samples: &[PeerSample]) -> Vec<(&str, u64, bool)> {
        samples
            .iter()
            .map(|s| (s.peer.as_str(), s.packets, s.finished))
            .collect()
    }

    #[test]
    fn finished_peers_age_out_after_the_retention_period() {
        let t0 = Instant::now();
        let mut kept = Retained::new(Duration::from_secs(60), 10);
        kept.insert(sample("a:1", 1, true), t0, 0);
        kept.insert(sample("b:1", 2, true), t0 + Duration::from_secs(30), 0);
        kept.age_out(t0 + Duration::from_secs(59));
        assert_eq!(kept.len(), 2);
        kept.age_out(t0 + Duration::from_secs(60));
        assert_eq!(
            peers(&kept.samples().cloned().collect::<Vec<_>>()),
            [("b:1", 2, true)]
        );
        kept.age_out(t0 + Duration::from_secs(90));
        assert!(kept.is_empty());
    }

    #[test]
    fn at_most_the_bound_is_kept_oldest_dropped_first() {
        let t0 = Instant::now();
        let mut kept = Retained::new(Duration::from_secs(60), 2);
        for (i, name) in ["a:1", "b:1", "c:1"].into_iter().enumerate() {
            kept.insert(sample(name, i as u64, true), t0, 0);
        }
        let left: Vec<_> = kept.samples().map(|s| s.peer.clone()).collect();
        assert_eq!(left, ["b:1", "c:1"]);
    }

    #[test]
    fn the_same_labels_finishing_again_replace_the_record() {
        let t0 = Instant::now();
        let mut kept = Retained::new(Duration::from_secs(60), 2);
        kept.insert(sample("a:1", 1, true), t0, 0);
        kept.insert(sample("b:1", 1, true), t0, 0);
        kept.insert(sample("a:1", 5, true), t0, 0);
        assert_eq!(
            peers(&kept.samples().cloned().collect::<Vec<_>>()),
            [("b:1", 1, true), ("a:1", 5, true)]
        );
    }

    #[test]
    fn a_peer_that_finished_after_the_snapshot_shows_its_final_figures() {
        let mut kept = Retained::new(Duration::from_secs(60), 10);
        // Snapshot 3 saw a:1 at 10 packets; it finished at 12 afterwards.
        kept.insert(sample("a:1", 12, true), Instant::now(), 3);
        let live = [sample("a:1", 10, false), sample("b:1", 7, false)];
        assert_eq!(
            peers(&merge(&live, 3, &kept)),
            [("b:1", 7, false), ("a:1", 12, true)]
        );
    }

    #[test]
    fn a_new_peer_under_old_labels_replaces_the_old_record() {
        let mut kept = Retained::new(Duration::from_secs(60), 10);
        // a:1 finished before snapshot 4, then came back.
        kept.insert(sample("a:1", 12, true), Instant::now(), 3);
        let live = [sample("a:1", 2, false)];
        assert_eq!(peers(&merge(&live, 4, &kept)), [("a:1", 2, false)]);
    }

    #[test]
    fn a_scrape_asks_the_server_thread_for_a_snapshot() {
        let info = ServerInfo {
            version: "0",
            method: "mmsg",
            threads: 1,
            recv_buffer: 1000,
            max_peers: 4,
        };
        let board = std::sync::Arc::new(Board::new(info, Duration::from_secs(60), 4));
        // Not running: a scrape does not wait, and sees empty figures.
        let view = board.view(Duration::from_secs(5));
        assert!(view.peers.is_empty());
        assert_eq!(view.server, ServerSample::default());
        std::thread::scope(|s| {
            let server = s.spawn(|| {
                board.attach();
                let deadline = Instant::now() + Duration::from_secs(10);
                while !board.take_wanted() && Instant::now() < deadline {
                    std::thread::park_timeout(Duration::from_millis(100));
                }
                board.publish(Live {
                    peers: vec![sample("a:1", 3, false)],
                    server: ServerSample {
                        packets: 3,
                        ..Default::default()
                    },
                });
            });
            // Wait until the thread is attached, then scrape.
            while !board.state().running {
                std::thread::yield_now();
            }
            let view = board.view(Duration::from_secs(10));
            assert_eq!(view.server.packets, 3);
            assert_eq!(peers(&view.peers), [("a:1", 3, false)]);
            assert_eq!(view.active(), 1);
            server.join().unwrap();
        });
    }
}
