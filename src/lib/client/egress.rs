//! The sender's own egress queue, read around a run: the device the
//! datagrams leave by, its root qdisc's counters before and after, and the
//! namespace's UDP SndbufErrors.
//!
//! Why: a shaper on the sender's own device drops in ways the socket does
//! not always hear of. With GSO, tbf cuts a buffer larger than its burst
//! into datagrams and drops those that do not fit, and the send still
//! succeeds: the loss then looks like the network's. The qdisc's own
//! counter tells. It counts the whole device's traffic, so the report says
//! so, and the unit it counts in is worked out here ([`drops_unit`]),
//! purely, from the qdisc and how the datagrams were sent.

use crate::meter::send::GsoOff;
use crate::sys::{self, EgressDevice, QdiscStats};
use serde::Serialize;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often the GSO watch reads the qdisc: a netlink request for one
/// device's root qdisc, on a thread of its own, never the senders'.
pub const WATCH_EVERY: Duration = Duration::from_millis(10);

/// Ethernet's header: qdiscs see frames with it (loopback's too).
const L2_HEADER: usize = 14;

/// The counters at one moment.
#[derive(Debug, Clone)]
pub(super) struct Snapshot {
    device: EgressDevice,
    qdisc: Option<QdiscStats>,
    sndbuf_errors: Option<u64>,
}

/// Reads the egress device for `dest` and its counters now; Err says why
/// they cannot be read (for a note).
pub(super) fn snapshot(dest: SocketAddr) -> Result<Snapshot, String> {
    let device = sys::egress_device(dest.ip())
        .map_err(|e| format!("cannot tell which device sends to {}: {e}", dest.ip()))?;
    again(&device)
}

/// The same device's counters now.
pub(super) fn again(device: &EgressDevice) -> Result<Snapshot, String> {
    let qdisc = sys::root_qdisc(device.ifindex)
        .map_err(|e| format!("cannot read the qdisc of {}: {e}", device.name))?;
    Ok(Snapshot {
        device: device.clone(),
        qdisc,
        sndbuf_errors: sys::udp_sndbuf_errors().ok(),
    })
}

impl Snapshot {
    pub(super) fn device(&self) -> &EgressDevice {
        &self.device
    }
}

/// How the datagrams were handed to the kernel, as far as the unit of a
/// qdisc's drops depends on it.
#[derive(Debug, Clone, Copy)]
pub struct SendShape {
    /// Datagram payload bytes.
    pub size: usize,
    /// Datagrams per full GSO buffer, when GSO was on.
    pub gso_datagrams: Option<usize>,
    /// Paced: a release can be a GSO buffer shorter than a full one.
    pub paced: bool,
    pub ipv6: bool,
}

impl SendShape {
    /// IP and UDP headers of one datagram.
    fn headers(&self) -> usize {
        8 + if self.ipv6 { 40 } else { 20 }
    }
}

/// What the sender's own egress queue did during the run (`sender_queue`
/// in JSON). Every count is the **device's**: the qdisc counts all traffic
/// leaving by it, and SndbufErrors all of the network namespace's UDP
/// sockets.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Serialize, Default)]
pub struct SenderQueue {
    /// The device the datagrams left by (`eth0`, `veth1`, `lo`).
    pub device: String,
    /// Its root qdisc's kind (`tbf`, `noqueue`, `mq`, ...).
    pub qdisc: Option<String>,
    /// Packets the root qdisc dropped during the run, in its unit.
    pub qdisc_drops: Option<u64>,
    /// `datagrams`, `gso_buffers` or `packets` (see `qdisc_drops_basis`).
    pub qdisc_drops_unit: Option<&'static str>,
    /// Why the drops are in that unit, in words.
    pub qdisc_drops_basis: Option<String>,
    /// Times the qdisc held a packet back over its rate, during the run.
    pub qdisc_overlimits: Option<u64>,
    /// Packets the device handed back to the qdisc, during the run.
    pub qdisc_requeues: Option<u64>,
    /// Bytes still queued in the qdisc when the run ended.
    pub qdisc_backlog_bytes: Option<u64>,
    /// tbf's rate (bit/s), burst and queue limit (bytes), when it is one.
    pub tbf_rate_bps: Option<u64>,
    pub tbf_burst_bytes: Option<u64>,
    pub tbf_limit_bytes: Option<u64>,
    /// Growth of the namespace's UDP SndbufErrors (IPv4 and IPv6): send
    /// calls the kernel refused for want of buffer or queue room.
    pub sndbuf_errors: Option<u64>,
    /// Of the datagrams lost, at most this many can have been the qdisc's
    /// drops (its drops in datagrams, or fewer than the loss); present when
    /// datagrams were lost and the qdisc dropped any.
    pub lost_in_sender_queue_at_most: Option<u64>,
    /// Why something above is unknown.
    pub note: Option<String>,
}

impl SenderQueue {
    /// The qdisc's drops as at most this many datagrams: themselves, or
    /// each GSO buffer's datagrams, or each fragment its own datagram.
    pub fn drops_in_datagrams_at_most(&self, gso_datagrams: Option<usize>) -> u64 {
        let drops = self.qdisc_drops.unwrap_or(0);
        match self.qdisc_drops_unit {
            Some("gso_buffers") => drops.saturating_mul(gso_datagrams.unwrap_or(1) as u64),
            _ => drops,
        }
    }

    /// The unit in words, for a sentence: `datagrams`, `GSO buffers`,
    /// `packets`.
    pub fn unit_words(&self) -> &'static str {
        match self.qdisc_drops_unit {
            Some("gso_buffers") => "GSO buffers",
            Some("datagrams") => "datagrams",
            _ => "packets",
        }
    }
}

/// The unit a qdisc's drops count in for datagrams sent as `shape` over a
/// device of `mtu`, and why: a qdisc counts each skb it refuses, and what
/// an skb holds depends on GSO, tbf's burst and fragmentation.
pub fn drops_unit(q: &QdiscStats, shape: &SendShape, mtu: Option<u32>) -> (&'static str, String) {
    if q.kind == "noqueue" {
        return (
            "packets",
            "noqueue holds nothing and drops nothing: packets go straight to the device".into(),
        );
    }
    let frame = shape.size + shape.headers() + L2_HEADER;
    if let Some(n) = shape.gso_datagrams.filter(|&n| n > 1) {
        let buffer = n * frame;
        return match q.tbf {
            Some(t) if (buffer as u64) <= t.burst_bytes => (
                "gso_buffers",
                format!(
                    "tbf queues a GSO buffer no larger than its burst ({} bytes; a full one here is {buffer}) whole: each drop is a buffer of up to {n} datagrams",
                    t.burst_bytes
                ),
            ),
            Some(t) if shape.paced => (
                "packets",
                format!(
                    "tbf cuts a GSO buffer larger than its burst ({} bytes) into its datagrams and counts each it drops, but queues a shorter one (a paced release can be) whole and counts it once",
                    t.burst_bytes
                ),
            ),
            Some(t) => (
                "datagrams",
                format!(
                    "tbf cuts each GSO buffer larger than its burst ({} bytes; a full one here is {buffer}: {n} datagrams) into its datagrams and counts each it drops (a shorter buffer, such as a run's last, would count once)",
                    t.burst_bytes
                ),
            ),
            None => (
                "gso_buffers",
                format!(
                    "{} drops whole GSO buffers (up to {n} datagrams each): the device cuts them after the qdisc",
                    q.kind
                ),
            ),
        };
    }
    let packet = shape.size + shape.headers();
    match mtu {
        Some(mtu) if packet > mtu as usize => {
            let per_fragment = (mtu as usize).saturating_sub(shape.headers() - 8).max(8) & !7;
            let fragments = (shape.size + 8).div_ceil(per_fragment);
            (
                "packets",
                format!(
                    "IP fragments: each {}-byte datagram leaves as {fragments} fragments of an MTU of {mtu}, and a datagram is lost when any of them is",
                    shape.size
                ),
            )
        }
        _ => (
            "datagrams",
            "without GSO each datagram is one packet".to_string(),
        ),
    }
}

/// What the queue did between two snapshots of the same device: the
/// counters' growth, in the units worked out from `shape`.
pub(super) fn growth(before: &Snapshot, after: &Snapshot, shape: &SendShape) -> SenderQueue {
    let mut out = SenderQueue {
        device: after.device.name.clone(),
        sndbuf_errors: before
            .sndbuf_errors
            .zip(after.sndbuf_errors)
            .map(|(b, a)| a.saturating_sub(b)),
        ..SenderQueue::default()
    };
    let (Some(b), Some(a)) = (&before.qdisc, &after.qdisc) else {
        out.note = Some(format!(
            "{} has no root qdisc in the kernel's list: its drops are unknown",
            out.device
        ));
        return out;
    };
    out.qdisc = Some(a.kind.clone());
    if b.kind != a.kind || a.packets < b.packets || a.bytes < b.bytes {
        out.note = Some(format!(
            "the qdisc of {} was replaced during the run ({} before, {} after): its counters restarted",
            out.device, b.kind, a.kind
        ));
        return out;
    }
    // The kernel's u32 counters wrap; one run does not wrap them twice.
    let grew = |a: u32, b: u32| u64::from(a.wrapping_sub(b));
    out.qdisc_drops = Some(grew(a.drops, b.drops));
    out.qdisc_overlimits = Some(grew(a.overlimits, b.overlimits));
    out.qdisc_requeues = Some(grew(a.requeues, b.requeues));
    out.qdisc_backlog_bytes = Some(u64::from(a.backlog_bytes));
    if let Some(t) = a.tbf {
        out.tbf_rate_bps = Some(t.rate_bytes_per_s.saturating_mul(8));
        out.tbf_burst_bytes = Some(t.burst_bytes);
        out.tbf_limit_bytes = Some(u64::from(t.limit_bytes));
    }
    let (unit, basis) = drops_unit(a, shape, after.device.mtu);
    out.qdisc_drops_unit = Some(unit);
    out.qdisc_drops_basis = Some(basis);
    out
}

/// Whether the qdisc of `before` cuts this run's GSO buffers (a tbf whose
/// burst is smaller than a full buffer): only then can its drops go
/// unheard, and only then is the run watched.
pub(super) fn cuts_gso(before: &Snapshot, shape: &SendShape) -> bool {
    let Some(q) = &before.qdisc else {
        return false;
    };
    q.tbf.is_some()
        && shape.gso_datagrams.is_some_and(|n| n > 1)
        && drops_unit(q, shape, before.device.mtu).0 != "gso_buffers"
}

/// Watches the qdisc of `before` until `done`: at its first drops during
/// the run, asks the senders to turn GSO off (`off`), saying why, and
/// stops. Bounded: it ends when the run does, or when the qdisc cannot be
/// read, is replaced, or has dropped.
pub(super) fn watch_gso(before: &Snapshot, off: &GsoOff, done: &AtomicBool) {
    let Some(start) = before.qdisc.as_ref() else {
        return;
    };
    let began = Instant::now();
    while !done.load(Ordering::Acquire) {
        std::thread::sleep(WATCH_EVERY);
        let Ok(Some(now)) = sys::root_qdisc(before.device.ifindex) else {
            return;
        };
        if now.kind != start.kind || now.packets < start.packets {
            return;
        }
        let drops = now.drops.wrapping_sub(start.drops);
        if drops > 0 {
            off.request(format!(
                "the {} qdisc on {} cut GSO buffers larger than its burst and dropped {drops} of their datagrams in the first {:.0} ms (device-wide count), drops the sends never hear of: GSO turned off from then on, so that each drop comes back as ENOBUFS and is sent again",
                now.kind,
                before.device.name,
                began.elapsed().as_secs_f64() * 1e3
            ));
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::TbfParams;

    fn tbf(burst: u64) -> QdiscStats {
        QdiscStats {
            kind: "tbf".into(),
            tbf: Some(TbfParams {
                rate_bytes_per_s: 25_000_000,
                burst_bytes: burst,
                limit_bytes: 65536,
            }),
            ..QdiscStats::default()
        }
    }

    fn shape(size: usize, gso: Option<usize>, paced: bool) -> SendShape {
        SendShape {
            size,
            gso_datagrams: gso,
            paced,
            ipv6: false,
        }
    }

    #[test]
    fn tbf_counts_the_datagrams_of_the_gso_buffers_it_cuts() {
        // 46 × 1442 = 66332 bytes: above a 32 KiB burst, so cut.
        let (unit, why) = drops_unit(&tbf(32768), &shape(1400, Some(46), false), Some(1500));
        assert_eq!(unit, "datagrams", "{why}");
        assert!(why.contains("66332"), "{why}");
        // A burst that holds the buffer: whole buffers.
        let (unit, _) = drops_unit(&tbf(100_000), &shape(1400, Some(46), false), Some(1500));
        assert_eq!(unit, "gso_buffers");
        // Paced releases can be short buffers: mixed.
        let (unit, _) = drops_unit(&tbf(32768), &shape(1400, Some(46), true), Some(1500));
        assert_eq!(unit, "packets");
        // Another qdisc never cuts.
        let pfifo = QdiscStats {
            kind: "pfifo".into(),
            ..QdiscStats::default()
        };
        let (unit, why) = drops_unit(&pfifo, &shape(1400, Some(46), false), Some(1500));
        assert_eq!(unit, "gso_buffers");
        assert!(why.contains("pfifo"), "{why}");
    }

    #[test]
    fn without_gso_a_drop_is_a_datagram_or_a_fragment() {
        let (unit, _) = drops_unit(&tbf(32768), &shape(1400, None, false), Some(1500));
        assert_eq!(unit, "datagrams");
        // 5000 bytes over a 1500 MTU: 4 fragments of 1480.
        let (unit, why) = drops_unit(&tbf(32768), &shape(5000, None, false), Some(1500));
        assert_eq!(unit, "packets");
        assert!(why.contains("4 fragments"), "{why}");
    }

    fn snap(q: Option<QdiscStats>, sndbuf: u64) -> Snapshot {
        Snapshot {
            device: EgressDevice {
                ifindex: 3,
                name: "veth0".into(),
                mtu: Some(1500),
            },
            qdisc: q,
            sndbuf_errors: Some(sndbuf),
        }
    }

    #[test]
    fn growth_is_taken_across_a_wrap_and_not_across_a_new_qdisc() {
        let mut b = tbf(32768);
        b.drops = u32::MAX - 4;
        b.packets = 10;
        let mut a = b.clone();
        a.drops = 5;
        a.packets = 20;
        a.backlog_bytes = 1442;
        let q = growth(
            &snap(Some(b.clone()), 7),
            &snap(Some(a), 9),
            &shape(1400, Some(46), false),
        );
        assert_eq!(q.qdisc_drops, Some(10));
        assert_eq!(q.qdisc_drops_unit, Some("datagrams"));
        assert_eq!(q.sndbuf_errors, Some(2));
        assert_eq!(q.qdisc_backlog_bytes, Some(1442));
        assert_eq!(q.tbf_rate_bps, Some(200_000_000));
        let mut replaced = b.clone();
        replaced.kind = "pfifo".into();
        let q = growth(
            &snap(Some(b), 0),
            &snap(Some(replaced), 0),
            &shape(1400, None, false),
        );
        assert_eq!(q.qdisc_drops, None);
        assert!(q.note.unwrap().contains("replaced"));
    }
}
