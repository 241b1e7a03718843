//! Why a run was not faster: one verdict, computed from figures the report
//! already holds (loss, the server's kernel drops, ENOBUFS back-offs, the
//! pacer's shortfall, both ends' CPU).
//!
//! A user who sees "13 Gbit/s, 16 % lost" wants to know what to change.
//! Each place a datagram can be held up or lost has its own counter, so the
//! cap can be named instead of guessed: the server's socket buffer (kernel
//! drops), the sender's own queue (ENOBUFS back-offs, its qdisc's drops,
//! time blocked in send calls), the path between
//! (loss nobody else counted), or a busy core on either end. The rules are
//! written out in `docs/output.md` ("limited_by"); they are pure, and
//! tested here without sockets.

use super::egress::SenderQueue;
use super::{ClientReport, ServerView};
use crate::stats;
use serde::Serialize;

/// A core at least this busy (% of one core) is the cap when nothing else
/// explains the rate.
pub const BUSY_PERCENT: f64 = 90.0;
/// A paced run held its rate when it sent at least this share of it.
pub const RATE_HELD: f64 = 0.98;
/// Below this span there is too little to judge an unpaced run by: its
/// rate is mostly the start-up.
pub const SHORTEST_JUDGED_SECONDS: f64 = 0.2;
/// Back-off time, as a share of the sending time, that makes the sender's
/// own queue the cap of an unpaced run.
pub const BACKOFF_SHARE: f64 = 0.05;
/// Time blocked in send calls, as a share of the sending time, that makes
/// the sender's own queue the cap (the queue held the data that long).
pub const BLOCKED_SHARE: f64 = 0.05;

/// What capped a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cap {
    /// `--rate` was held and everything arrived: the limit is above it.
    Paced,
    /// The sending thread used a whole core.
    SenderCpu,
    /// The sender's own queue (qdisc, NIC) refused datagrams (ENOBUFS),
    /// dropped them (its qdisc's counter), or held them so long that the
    /// sends blocked.
    SenderQueue,
    /// The server's socket buffer overflowed while its receive thread was
    /// busy: the receiver could not keep up.
    ReceiverCpu,
    /// The server's socket buffer overflowed although its thread was not
    /// busy: bursts outran the buffer.
    ReceiveBuffer,
    /// Datagrams lost where no end counted them: the path.
    Network,
    /// `--find-limit --max-delay`: the data waited in a queue longer than
    /// the bound allows.
    QueueDelay,
    /// Too short, no answer, or no single cap stands out.
    #[default]
    Unknown,
}

impl Cap {
    /// The name used in JSON and by `--find-limit`'s causes.
    pub fn name(self) -> &'static str {
        match self {
            Cap::Paced => "paced",
            Cap::SenderCpu => "sender_cpu",
            Cap::SenderQueue => "sender_queue",
            Cap::ReceiverCpu => "receiver_cpu",
            Cap::ReceiveBuffer => "receive_buffer",
            Cap::Network => "network",
            Cap::QueueDelay => "queue_delay",
            Cap::Unknown => "unknown",
        }
    }
}

/// The receive buffer the advice suggests (32 MiB): a buffer granted this
/// large already is not suggested again.
const SUGGESTED_BUFFER: u64 = 32 << 20;

/// The verdict: what capped the run, in one sentence that says what to try.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Verdict {
    pub cause: Cap,
    pub text: String,
}

/// What the receiver said, as far as the verdict needs it.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReceiverFacts {
    pub lost: u64,
    pub loss_percent: f64,
    /// Kernel drops on the receiving socket while the session(s) ran, in
    /// the kernel's unit: the sessions' own, or the whole socket's.
    pub kernel_drops: Option<u64>,
    /// The drops count GRO buffers, not datagrams.
    pub drops_in_buffers: bool,
    /// The drops are the sessions' own: nothing else used the socket.
    pub drops_own: bool,
    /// Datagrams received, the GRO buffers that held several, and the
    /// datagrams in those (None where the server did not say).
    pub received: u64,
    pub gro_buffers: u64,
    pub gro_datagrams: Option<u64>,
    /// The receive threads' CPU, % of one core.
    pub cpu_percent: Option<f64>,
    /// The receiving socket's buffer (what the kernel granted), when known.
    pub recv_buffer: Option<u64>,
}

impl ReceiverFacts {
    /// The figures of the server's answer(s).
    pub fn of(v: &ServerView) -> Self {
        ReceiverFacts {
            lost: v.lost_packets,
            loss_percent: v.loss_percent,
            kernel_drops: v.drops.kernel_drops.or(v.drops.socket_wide_kernel_drops),
            drops_in_buffers: v.drops.kernel_drops_unit == Some("buffers"),
            drops_own: v.drops.kernel_drops.is_some(),
            received: v.received_packets,
            gro_buffers: v.gro_buffers,
            gro_datagrams: v.gro_datagrams,
            cpu_percent: v.cpu.as_ref().and_then(|c| c.percent_of_core),
            recv_buffer: None,
        }
    }

    /// The kernel drops in datagrams: themselves, or with GRO an estimate
    /// from the buffers that arrived (`stats::drops`).
    pub fn dropped_datagrams(&self) -> u64 {
        let drops = self.kernel_drops.unwrap_or(0);
        if !self.drops_in_buffers {
            return drops;
        }
        let arrivals = stats::Arrivals {
            datagrams: self.received,
            coalesced_buffers: self.gro_buffers,
            coalesced_datagrams: self.gro_datagrams,
        };
        arrivals.drops_in_datagrams(drops).datagrams
    }

    /// The drops in words, against the loss: `1279 GRO buffers (about
    /// 58834 datagrams), all the loss`.
    fn drops_share(&self) -> String {
        let drops = self.kernel_drops.unwrap_or(0);
        let dropped = self.dropped_datagrams();
        let what = if self.drops_in_buffers {
            format!("{drops} GRO buffers (about {dropped} datagrams)")
        } else {
            format!("{drops} datagrams")
        };
        if !self.drops_own {
            return format!(
                "{what} while the sessions ran, other traffic's included (the {} lost cannot be split)",
                self.lost
            );
        }
        if dropped >= self.lost {
            format!("{what}, all the loss")
        } else {
            format!(
                "{what} of the {} datagrams lost; the other {} were lost before it",
                self.lost,
                self.lost - dropped
            )
        }
    }

    /// The server's socket dropped most of the lost datagrams: the buffer,
    /// not the path, lost them. One rule for the verdict and for
    /// `--find-limit`'s causes.
    pub fn drops_are_most_of_the_loss(&self) -> bool {
        let drops = self.kernel_drops.unwrap_or(0);
        drops > 0 && self.dropped_datagrams() * 2 >= self.lost
    }
}

/// The sum of each client's own sender-side rate, bit/s. Clients start a
/// few ms apart: a rate over the union of their spans would read low on a
/// short paced run.
pub fn summed_client_bps(clients: &[ClientReport]) -> Option<f64> {
    clients.iter().map(|c| c.gbps.map(|g| g * 1e9)).sum()
}

/// The busiest sending thread, % of one core.
pub fn busiest_sender_percent(clients: &[ClientReport]) -> Option<f64> {
    clients
        .iter()
        .filter_map(|c| c.cpu.as_ref().and_then(|c| c.percent_of_core))
        .reduce(f64::max)
}

/// The figures a verdict is computed from.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// `--rate` over all clients, bit/s.
    pub offered_bps: Option<u64>,
    /// The sender-side rate, bit/s.
    pub sent_bps: Option<f64>,
    /// The sending span, seconds.
    pub seconds: f64,
    /// The busiest sending thread, % of one core.
    pub sender_cpu_percent: Option<f64>,
    pub enobufs_retries: u64,
    /// Time spent backing off, summed over the clients.
    pub backoff_seconds: f64,
    pub clients: usize,
    /// The datagrams are handed to the kernel in GSO buffers.
    pub gso: bool,
    /// Datagrams per full GSO buffer, when GSO was on.
    pub gso_datagrams: Option<usize>,
    /// The watch of the sender's qdisc turned GSO off during the run (its
    /// drops of cut buffers went unheard): the report's notes say why.
    pub gso_fell_back: bool,
    /// Time the sending threads were blocked in send calls, at least,
    /// summed over the clients; None where unknown.
    pub send_blocked_seconds: Option<f64>,
    /// What the sender's own egress qdisc did during the run, if read.
    pub sender_queue: Option<SenderQueue>,
    /// `--local`: the server is in-process, with settings the user cannot
    /// change; advice about the server says to run one instead.
    pub local: bool,
    /// None when the server did not answer (or was not asked).
    pub receiver: Option<ReceiverFacts>,
    /// A reverse stream (`-R`): the server sent and this client received,
    /// so the ends swap in the words and the advice.
    pub reverse: bool,
}

fn core(percent: Option<f64>) -> String {
    percent.map_or("an unknown share".into(), |p| format!("{p:.0}%"))
}

fn busy(percent: Option<f64>) -> bool {
    percent.is_some_and(|p| p >= BUSY_PERCENT)
}

/// A rate in the unit a shaper is written in.
fn rate_words(bps: u64) -> String {
    if bps >= 1_000_000_000 {
        crate::units::bps_text(bps as f64)
    } else {
        format!("{:.0} Mbit/s", bps as f64 / 1e6)
    }
}

/// `the tbf qdisc on veth0`, or the device alone.
fn queue_name(q: &SenderQueue) -> String {
    match &q.qdisc {
        Some(kind) => format!("the {kind} qdisc on {}", q.device),
        None => format!("the queue of {}", q.device),
    }
}

/// The qdisc's drops in words, in its unit: `40210 datagrams`, or `12
/// GSO buffers (up to 552 datagrams)`.
fn drops_words(q: &SenderQueue, gso_datagrams: Option<usize>) -> String {
    let drops = q.qdisc_drops.unwrap_or(0);
    let unit = q.unit_words();
    match q.qdisc_drops_unit {
        Some("datagrams") => format!("{drops} {unit}"),
        Some("gso_buffers") => format!(
            "{drops} {unit} (up to {} datagrams)",
            q.drops_in_datagrams_at_most(gso_datagrams)
        ),
        _ => format!(
            "{drops} {unit} as it counts them ({})",
            q.qdisc_drops_basis.as_deref().unwrap_or("its own unit")
        ),
    }
}

impl Facts {
    /// The qdisc cut GSO buffers and dropped their datagrams where the
    /// socket does not hear of it (the send succeeds when any fit).
    fn silent_gso_drops(&self) -> bool {
        self.gso
            && self.sender_queue.as_ref().is_some_and(|q| {
                q.qdisc_drops.unwrap_or(0) > 0
                    && q.tbf_burst_bytes.is_some()
                    && q.qdisc_drops_unit != Some("gso_buffers")
            })
    }

    /// What to try against the sender's own queue.
    fn queue_fix(&self) -> String {
        let q = self.sender_queue.as_ref();
        let mut fixes = Vec::new();
        if self.silent_gso_drops() {
            fixes.push("`--no-gso` into a small-burst shaper (its drops then come back to the socket as ENOBUFS and are sent again)".to_string());
        } else if self.gso_fell_back {
            fixes.push(
                "`--no-gso` from the start (no datagrams lost before the fallback)".to_string(),
            );
        }
        if q.is_some_and(|q| q.tbf_limit_bytes.is_some()) {
            fixes.push("a larger queue `limit` on the shaper".to_string());
        }
        let rate = q.and_then(|q| q.tbf_rate_bps).map_or(String::new(), |r| {
            format!(
                " (it passes {} in all{})",
                rate_words(r),
                if self.clients > 1 {
                    ", shared by the clients"
                } else {
                    ""
                }
            )
        });
        fixes.push(format!("a --rate the shaper or link allows{rate}"));
        fixes.join(", or ")
    }

    /// The share of the sending time the threads were blocked in send.
    fn blocked_share(&self) -> f64 {
        match self.send_blocked_seconds {
            Some(b) if self.seconds > 0.0 => b / (self.seconds * self.clients.max(1) as f64),
            _ => 0.0,
        }
    }
}

/// The one-line verdict for a run with these figures.
pub fn judge(f: &Facts) -> Verdict {
    let verdict = |cause, text: String| Verdict { cause, text };
    let backed_off = if f.enobufs_retries > 0 {
        format!(
            "; the sender also backed off {} times on a full queue ({:.3} s)",
            f.enobufs_retries, f.backoff_seconds
        )
    } else {
        String::new()
    };
    // Who received and who sent: the words and the advice follow.
    let (receiver, sender) = if f.reverse {
        ("this client's", "the server's")
    } else {
        ("the server's", "the sender's")
    };
    // Where the receiver-side advice applies.
    let on_server = |flags: &str| {
        if f.reverse {
            // udp_client has --recv-buffer-size, and -P for more receive
            // threads (one per client socket), not --threads.
            if flags.contains("--recv-buffer-size") {
                "try `--recv-buffer-size 32M` on udp_client (its receive socket)".to_string()
            } else {
                "try -P 2 (each client socket receives on a thread of its own)".to_string()
            }
        } else if f.local {
            // The in-process server is tuned already: what it could not
            // take in is what this host can receive beside its sender,
            // whatever `flags` a separate server would need.
            "--local's server already has the largest buffer this host allows and a receive thread per client (up to half the cores): this is what the host can receive beside its own sender; pace with --rate below it, or measure against a udp_server on another host".to_string()
        } else {
            format!("try `{flags}` on the server")
        }
    };
    let Some(rx) = f.receiver else {
        return verdict(
            Cap::Unknown,
            format!("unknown: without {receiver} figures the receiver side cannot be judged"),
        );
    };
    // Advice never asks for what the run already had: a buffer as large
    // as the one suggested, or pacing a paced sender.
    let bigger_buffer = rx.recv_buffer.is_none_or(|b| b < SUGGESTED_BUFFER);
    let or_rate = if f.offered_bps.is_some() {
        "or a lower --rate"
    } else {
        "or pace with --rate"
    };
    if rx.lost > 0 {
        let drops = rx.kernel_drops.unwrap_or(0);
        if rx.drops_are_most_of_the_loss() {
            let share = rx.drops_share();
            let cpu_flags = if bigger_buffer {
                "--recv-buffer-size 32M --threads 2"
            } else {
                "--threads 2"
            };
            return if f.seconds >= SHORTEST_JUDGED_SECONDS && busy(rx.cpu_percent) {
                verdict(
                    Cap::ReceiverCpu,
                    format!(
                        "receiver CPU-bound: {receiver} receive thread used {} of a core and its buffer dropped {share}: {}, or a lower --rate{backed_off}",
                        core(rx.cpu_percent),
                        on_server(cpu_flags)
                    ),
                )
            } else {
                let remedy = if bigger_buffer {
                    format!("{}, {or_rate}", on_server("--recv-buffer-size 32M"))
                } else {
                    format!(
                        "its buffer ({} MiB granted) is already large; {or_rate}, or fewer clients at once",
                        rx.recv_buffer.unwrap_or(0) >> 20
                    )
                };
                verdict(
                    Cap::ReceiveBuffer,
                    format!(
                        "receive buffer: {receiver} socket buffer dropped {share}{}: bursts outran the buffer; {remedy}{backed_off}",
                        // CPU sampled every 10 ms says nothing of a
                        // shorter run.
                        match rx.cpu_percent {
                            Some(p) if f.seconds >= SHORTEST_JUDGED_SECONDS =>
                                format!(" while its receive thread used {p:.0}% of a core"),
                            _ => String::new(),
                        },
                    ),
                )
            };
        }
        if let Some(q) = f
            .sender_queue
            .as_ref()
            .filter(|q| q.qdisc_drops.unwrap_or(0) > 0)
        {
            // Lost before the receiver's socket: could the queue's drops
            // be at least half of those?
            let before_socket = rx.lost.saturating_sub(rx.dropped_datagrams().min(rx.lost));
            if q.drops_in_datagrams_at_most(f.gso_datagrams) * 2 >= before_socket {
                let heard = if f.enobufs_retries > 0 {
                    format!(
                        "; the socket heard of some of them (ENOBUFS: {} retries, {:.3} s backing off)",
                        f.enobufs_retries, f.backoff_seconds
                    )
                } else {
                    String::new()
                };
                let silent = if f.silent_gso_drops() {
                    ": with GSO, tbf cuts each buffer larger than its burst into datagrams and drops those that do not fit, and the send still succeeds"
                } else if f.gso_fell_back {
                    ": GSO was on until the drops began, and tbf dropped datagrams of the buffers it cut unheard; then GSO was turned off (see the notes) and later drops came back as ENOBUFS, sent again"
                } else {
                    ""
                };
                return verdict(
                    Cap::SenderQueue,
                    format!(
                        "sender's queue: {} (this host's own egress) dropped {} during the run, and {} datagrams ({:.3}%) were lost: dropped before they left this host, not on the way{silent}{heard} (the qdisc's counter is the device's: other traffic on {} counts too); try {}",
                        queue_name(q),
                        drops_words(q, f.gso_datagrams),
                        rx.lost,
                        rx.loss_percent,
                        q.device,
                        f.queue_fix()
                    ),
                );
            }
        }
        if rx.kernel_drops.is_none() {
            // Without the socket's drop counter the loss cannot be placed:
            // saying "on the way" would be a guess.
            return verdict(
                Cap::Unknown,
                format!(
                    "loss: {} datagrams ({:.3}%) were lost, on the way or in {receiver} socket buffer: {} cannot count its kernel drops on this platform, so the two cannot be told apart; a larger receive buffer rules out the socket, and `--find-limit` finds the rate the path carries{backed_off}",
                    rx.lost,
                    rx.loss_percent,
                    receiver.trim_end_matches("'s")
                ),
            );
        }
        let unknown = if drops > 0 {
            format!(" (it dropped only {})", rx.drops_share())
        } else {
            String::new()
        };
        return verdict(
            Cap::Network,
            format!(
                "network: {} datagrams ({:.3}%) were lost on the way, not in {receiver} socket buffer{unknown} nor {sender} queue: a policer, a full queue on the path, or a firewall; `--find-limit` finds the rate the path carries{backed_off}",
                rx.lost, rx.loss_percent
            ),
        );
    }
    let sent = f.sent_bps.unwrap_or(0.0);
    let blocked_share = f.blocked_share();
    let blocked = blocked_share >= BLOCKED_SHARE;
    // The sender's own queue, in what it did: refused, held (the sends
    // blocked), dropped.
    let queue_full = |share: f64| {
        let q = f.sender_queue.as_ref();
        let mut did = Vec::new();
        if f.enobufs_retries > 0 {
            did.push(format!(
                "refused {} times and it waited {:.3} s backing off ({:.0}% of the time)",
                f.enobufs_retries,
                f.backoff_seconds,
                share * 100.0
            ));
        }
        if blocked {
            did.push(format!(
                "held the data while the sends blocked for {:.3} s ({:.0}% of the sending time{}), a full socket send buffer waiting on it",
                f.send_blocked_seconds.unwrap_or(0.0),
                blocked_share * 100.0,
                if f.clients > 1 { ", over all the clients" } else { "" }
            ));
        }
        if let Some(q) = q.filter(|q| q.qdisc_drops.unwrap_or(0) > 0) {
            did.push(format!(
                "dropped {} (the device's count: other traffic on {} counts too)",
                drops_words(q, f.gso_datagrams),
                q.device
            ));
        }
        let name = match q {
            Some(q) if !f.reverse => format!("({})", queue_name(q)),
            _ => "(qdisc or NIC)".to_string(),
        };
        verdict(
            Cap::SenderQueue,
            format!(
                "sender's queue: {sender} own queue {name} {}: the link or a shaper on {} host is slower than the sender; try {}",
                did.join("; "),
                if f.reverse { "the server's" } else { "this" },
                f.queue_fix()
            ),
        )
    };
    let backoff_share = if f.seconds > 0.0 {
        f.backoff_seconds / (f.seconds * f.clients.max(1) as f64)
    } else {
        0.0
    };
    if let Some(offered) = f.offered_bps {
        let offered = offered as f64;
        if sent >= offered * RATE_HELD {
            return verdict(
                Cap::Paced,
                format!(
                    "paced: the sender held the requested {} and nothing was lost; the path may carry more (`--find-limit` finds how much)",
                    crate::units::bps_text(offered)
                ),
            );
        }
        let short = format!(
            "sent {} of the requested {}",
            crate::units::bps_text(sent),
            crate::units::bps_text(offered)
        );
        return if f.enobufs_retries > 0 || blocked {
            let v = queue_full(backoff_share);
            verdict(Cap::SenderQueue, format!("{}; {short}", v.text))
        } else if busy(f.sender_cpu_percent) {
            verdict(
                Cap::SenderCpu,
                format!(
                    "sender CPU-bound: {sender} sending thread used {} of a core and {short}: try --clients 2{}",
                    core(f.sender_cpu_percent),
                    if f.gso { "" } else { " or GSO (drop --no-gso)" }
                ),
            )
        } else {
            verdict(
                Cap::Unknown,
                format!(
                    "sender fell behind: it {short} with no full queue{} and {} of a core: it was descheduled (another busy process, or a VM's stolen time)",
                    match f.send_blocked_seconds {
                        Some(b) => format!(" (blocked in send calls {b:.3} s)"),
                        None => String::new(),
                    },
                    core(f.sender_cpu_percent)
                ),
            )
        };
    }
    if (f.enobufs_retries > 0 && backoff_share >= BACKOFF_SHARE) || blocked {
        return queue_full(backoff_share);
    }
    if f.seconds < SHORTEST_JUDGED_SECONDS {
        return verdict(
            Cap::Unknown,
            format!(
                "too short to tell what caps it ({:.3} s of sending, too short to time well): send for longer with --duration 10s or -t 1G",
                f.seconds
            ),
        );
    }
    if busy(f.sender_cpu_percent) {
        return verdict(
            Cap::SenderCpu,
            format!(
                "sender CPU-bound: {sender} sending thread used {} of a core and nothing was lost: try --clients 2 or a larger -b (fewer datagrams per byte){}",
                core(f.sender_cpu_percent),
                if f.gso { "" } else { ", or GSO (drop --no-gso)" }
            ),
        );
    }
    if busy(rx.cpu_percent) {
        return verdict(
            Cap::ReceiverCpu,
            format!(
                "receiver CPU-bound: {receiver} receive thread used {} of a core; nothing was lost yet: {} to spread the work",
                core(rx.cpu_percent),
                on_server("--threads 2")
            ),
        );
    }
    verdict(
        Cap::Unknown,
        format!(
            "no single cap: the sender used {} and the receiver {} of a core, with no loss and no full queue ({})",
            core(f.sender_cpu_percent),
            core(rx.cpu_percent),
            crate::units::bps_text(sent)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unpaced(sender_cpu: f64, rx: ReceiverFacts) -> Facts {
        Facts {
            sent_bps: Some(10e9),
            seconds: 3.0,
            sender_cpu_percent: Some(sender_cpu),
            clients: 1,
            gso: true,
            receiver: Some(rx),
            ..Facts::default()
        }
    }

    /// Asserts the verdict's cause, and that its text says each of `says`.
    fn assert_verdict(v: &Verdict, cause: Cap, says: &[&str]) {
        assert_eq!(v.cause, cause, "{}", v.text);
        for said in says {
            assert!(v.text.contains(said), "{said:?} not in: {}", v.text);
        }
    }

    fn rx(lost: u64, drops: Option<u64>, cpu: f64) -> ReceiverFacts {
        ReceiverFacts {
            lost,
            loss_percent: lost as f64 / 100.0,
            kernel_drops: drops,
            drops_own: true,
            received: 10_000,
            cpu_percent: Some(cpu),
            ..ReceiverFacts::default()
        }
    }

    #[test]
    fn drops_with_a_busy_receiver_make_it_receiver_cpu_bound() {
        let v = judge(&unpaced(60.0, rx(3965, Some(3965), 98.0)));
        assert_verdict(
            &v,
            Cap::ReceiverCpu,
            &[
                "98% of a core",
                "3965 datagrams, all the loss",
                "--recv-buffer-size 32M",
            ],
        );
    }

    #[test]
    fn drops_with_an_idle_receiver_blame_the_buffer_and_split_the_rest() {
        let v = judge(&unpaced(60.0, rx(100, Some(60), 30.0)));
        assert_verdict(
            &v,
            Cap::ReceiveBuffer,
            &["60 datagrams of the 100", "other 40 were lost before it"],
        );
    }

    #[test]
    fn a_few_drops_in_much_loss_leave_it_to_the_network() {
        let v = judge(&unpaced(20.0, rx(1000, Some(25), 5.0)));
        assert_verdict(&v, Cap::Network, &["only 25 datagrams"]);
        // 25 buffers of 13 datagrams each are 325: still a minority.
        let mut r = rx(1000, Some(25), 5.0);
        r.drops_in_buffers = true;
        r.received = 13_000;
        r.gro_buffers = 1_000;
        r.gro_datagrams = Some(13_000);
        assert_eq!(r.dropped_datagrams(), 325);
        assert_verdict(
            &judge(&unpaced(20.0, r)),
            Cap::Network,
            &["only 25 GRO buffers (about 325 datagrams)"],
        );
        r.kernel_drops = Some(40);
        assert_verdict(
            &judge(&unpaced(20.0, r)),
            Cap::ReceiveBuffer,
            &["40 GRO buffers (about 520 datagrams) of the 1000 datagrams lost; the other 480"],
        );
    }

    #[test]
    fn local_runs_are_told_what_the_host_can_receive() {
        let mut f = unpaced(60.0, rx(3965, Some(3965), 98.0));
        assert!(judge(&f)
            .text
            .contains("try `--recv-buffer-size 32M --threads 2` on the server"));
        // The in-process server has those already: no advice to tune it.
        f.local = true;
        let v = judge(&f);
        assert_eq!(v.cause, Cap::ReceiverCpu);
        assert!(
            v.text
                .contains("this is what the host can receive beside its own sender")
                && !v.text.contains("--threads 2"),
            "{}",
            v.text
        );
    }

    #[test]
    fn loss_the_socket_did_not_count_is_the_network_unless_it_cannot_count() {
        let v = judge(&unpaced(20.0, rx(17, Some(0), 5.0)));
        assert_verdict(&v, Cap::Network, &[]);
        // Without the drop counter (the portable backend), the loss is not
        // blamed on the network: it cannot be placed.
        let v = judge(&unpaced(20.0, rx(17, None, 5.0)));
        assert_verdict(&v, Cap::Unknown, &["cannot count", "cannot be told apart"]);
        assert!(!v.text.contains("network:"), "{}", v.text);
    }

    #[test]
    fn a_held_rate_without_loss_is_paced() {
        let mut f = unpaced(5.0, rx(0, Some(0), 3.0));
        f.offered_bps = Some(1_000_000_000);
        f.sent_bps = Some(0.999e9);
        assert_eq!(judge(&f).cause, Cap::Paced);
        // Not held: a full queue, a busy core, or neither.
        f.sent_bps = Some(0.5e9);
        f.enobufs_retries = 7;
        f.backoff_seconds = 0.4;
        let v = judge(&f);
        assert_verdict(&v, Cap::SenderQueue, &["refused 7 times"]);
        f.enobufs_retries = 0;
        f.sender_cpu_percent = Some(99.0);
        assert_eq!(judge(&f).cause, Cap::SenderCpu);
        f.sender_cpu_percent = Some(10.0);
        let v = judge(&f);
        assert_eq!(v.cause, Cap::Unknown);
        assert!(v.text.contains("descheduled"), "{}", v.text);
    }

    #[test]
    fn unpaced_without_loss_is_capped_by_the_busiest_end() {
        assert_eq!(
            judge(&unpaced(101.0, rx(0, Some(0), 40.0))).cause,
            Cap::SenderCpu
        );
        assert_eq!(
            judge(&unpaced(50.0, rx(0, Some(0), 95.0))).cause,
            Cap::ReceiverCpu
        );
        assert_eq!(
            judge(&unpaced(50.0, rx(0, Some(0), 40.0))).cause,
            Cap::Unknown
        );
        let mut f = unpaced(50.0, rx(0, Some(0), 40.0));
        f.enobufs_retries = 1000;
        f.backoff_seconds = 0.5;
        assert_eq!(judge(&f).cause, Cap::SenderQueue);
        // A few back-offs in a long run do not make the queue the cap.
        f.backoff_seconds = 0.01;
        assert_eq!(judge(&f).cause, Cap::Unknown);
    }

    #[test]
    fn short_or_unanswered_runs_are_not_judged() {
        let mut f = unpaced(100.0, rx(0, Some(0), 40.0));
        f.seconds = 0.001;
        let v = judge(&f);
        assert_eq!(v.cause, Cap::Unknown);
        assert!(v.text.contains("too short"), "{}", v.text);
        // Loss is judged however short the run, without a CPU figure that
        // the 10 ms sampling cannot give.
        f.receiver = Some(rx(5, Some(5), 40.0));
        let v = judge(&f);
        assert_eq!(v.cause, Cap::ReceiveBuffer);
        assert!(!v.text.contains("of a core"), "{}", v.text);
        f.receiver = None;
        assert_eq!(judge(&f).cause, Cap::Unknown);
    }

    #[test]
    fn buffer_drops_are_not_compared_with_datagrams() {
        let mut r = rx(6409, Some(493), 41.0);
        r.drops_in_buffers = true;
        r.received = 33_682;
        r.gro_buffers = 2_584;
        let v = judge(&unpaced(70.0, r));
        assert_eq!(v.cause, Cap::ReceiveBuffer);
        assert!(v.text.contains("493 GRO buffers"), "{}", v.text);
        assert!(!v.text.contains("on the way"), "{}", v.text);
    }

    fn tbf_queue(drops: u64, unit: &'static str) -> SenderQueue {
        SenderQueue {
            device: "veth0".into(),
            qdisc: Some("tbf".into()),
            qdisc_drops: Some(drops),
            qdisc_drops_unit: Some(unit),
            tbf_rate_bps: Some(200_000_000),
            tbf_burst_bytes: Some(32768),
            tbf_limit_bytes: Some(65536),
            ..SenderQueue::default()
        }
    }

    #[test]
    fn drops_in_the_senders_own_qdisc_are_not_the_networks() {
        // Issue 28: GSO into a small-burst tbf; 68 % lost, none of it
        // heard of by the socket, none dropped by the receiver.
        let mut f = unpaced(40.0, rx(6800, Some(0), 20.0));
        f.gso_datagrams = Some(46);
        f.sender_queue = Some(tbf_queue(6800, "datagrams"));
        let v = judge(&f);
        assert_verdict(
            &v,
            Cap::SenderQueue,
            &[
                "the tbf qdisc on veth0",
                "dropped 6800 datagrams",
                "6800 datagrams (68.000%) were lost",
                "not on the way",
                "the send still succeeds",
                "other traffic on veth0 counts too",
                "`--no-gso`",
                "a larger queue `limit`",
                "200 Mbit/s",
            ],
        );
        assert!(!v.text.contains("network"), "{}", v.text);
        // Whole GSO buffers: the unit says so, with the datagrams at most.
        f.sender_queue = Some(tbf_queue(150, "gso_buffers"));
        let v = judge(&f);
        assert_verdict(
            &v,
            Cap::SenderQueue,
            &["150 GSO buffers (up to 6900 datagrams)"],
        );
        assert!(!v.text.contains("--no-gso"), "{}", v.text);
        // A few device-wide drops against much loss: still the network.
        f.sender_queue = Some(tbf_queue(3, "datagrams"));
        assert_eq!(judge(&f).cause, Cap::Network);
        // The receiver's own drops come first.
        let mut f = unpaced(40.0, rx(6800, Some(6800), 20.0));
        f.sender_queue = Some(tbf_queue(6800, "datagrams"));
        assert_eq!(judge(&f).cause, Cap::ReceiveBuffer);
    }

    #[test]
    fn sends_blocked_on_the_queue_are_not_descheduling() {
        // Issue 28: two clients paced at 150 Mbit/s into a 200 Mbit/s tbf.
        let mut f = unpaced(8.0, rx(0, Some(0), 5.0));
        f.clients = 2;
        f.offered_bps = Some(300_000_000);
        f.sent_bps = Some(200e6);
        f.send_blocked_seconds = Some(4.2);
        f.sender_queue = Some(tbf_queue(0, "packets"));
        let v = judge(&f);
        assert_verdict(
            &v,
            Cap::SenderQueue,
            &[
                "the tbf qdisc on veth0",
                "blocked for 4.200 s (70% of the sending time, over all the clients)",
                "it passes 200 Mbit/s in all, shared by the clients",
                "sent 200.0 Mbit/s of the requested 300.0 Mbit/s",
            ],
        );
        assert!(!v.text.contains("descheduled"), "{}", v.text);
        // Nothing was dropped: GSO is not the trouble.
        assert!(!v.text.contains("--no-gso"), "{}", v.text);
        // Unpaced, the same.
        f.offered_bps = None;
        assert_eq!(judge(&f).cause, Cap::SenderQueue);
        // Barely blocked: descheduled after all, and it says how little.
        f.offered_bps = Some(300_000_000);
        f.send_blocked_seconds = Some(0.01);
        let v = judge(&f);
        assert_verdict(
            &v,
            Cap::Unknown,
            &["descheduled", "blocked in send calls 0.010 s"],
        );
    }

    #[test]
    fn a_reverse_stream_names_the_client_as_the_receiver() {
        let mut f = unpaced(60.0, rx(3965, Some(3965), 30.0));
        f.reverse = true;
        let v = judge(&f);
        assert_verdict(
            &v,
            Cap::ReceiveBuffer,
            &[
                "this client's socket buffer",
                "--recv-buffer-size 32M` on udp_client",
            ],
        );
        assert!(!v.text.contains("server's socket"), "{}", v.text);
        let mut f = unpaced(60.0, rx(50, Some(0), 30.0));
        f.reverse = true;
        assert_verdict(
            &judge(&f),
            Cap::Network,
            &["not in this client's socket buffer nor the server's queue"],
        );
        let mut f = unpaced(99.0, rx(0, Some(0), 30.0));
        f.reverse = true;
        assert_verdict(&judge(&f), Cap::SenderCpu, &["the server's sending thread"]);
    }
}
