//! Kernel drops in the unit of loss, and loss split by where it happened.
//!
//! Why this is its own concern: a receive socket's drop counter
//! (SO_RXQ_OVFL) counts the kernel's buffers, and with UDP GRO one buffer
//! holds many datagrams (46 of 1,400 bytes in 64 KiB), while loss is
//! counted in datagrams. Reported side by side, "1,279 buffers dropped"
//! and "58,834 datagrams lost" read as two unrelated figures, and a
//! verdict can only say "most of". Here the drops are put in datagrams,
//! exactly where the kernel's unit is the datagram and as a stated
//! estimate where it is the buffer, and a session's loss is split into
//! what the receiving socket dropped and what was lost before it, or
//! said plainly to be unsplittable (the socket also carried other
//! peers' traffic, so its count is not this session's).
//!
//! Pure: the callers pass the counts (the server from its table, the
//! client from the server's answer).

use serde::Serialize;

/// How a receiver's datagrams came in: the basis for an estimate of the
/// datagrams a dropped buffer held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Arrivals {
    /// Datagrams received.
    pub datagrams: u64,
    /// Buffers that held more than one datagram (UDP GRO) ...
    pub coalesced_buffers: u64,
    /// ... and the datagrams in them; None where not known (an older
    /// server's answer).
    pub coalesced_datagrams: Option<u64>,
}

impl Arrivals {
    /// What arrived since `earlier` (counters that only grow).
    pub fn since(&self, earlier: &Arrivals) -> Arrivals {
        Arrivals {
            datagrams: self.datagrams.saturating_sub(earlier.datagrams),
            coalesced_buffers: self
                .coalesced_buffers
                .saturating_sub(earlier.coalesced_buffers),
            coalesced_datagrams: self
                .coalesced_datagrams
                .zip(earlier.coalesced_datagrams)
                .map(|(n, e)| n.saturating_sub(e)),
        }
    }

    /// The mean datagrams per buffer received: coalesced buffers and
    /// single datagrams alike, since a dropped buffer is one of either.
    pub fn per_buffer(&self) -> Option<f64> {
        if self.coalesced_buffers == 0 {
            return None;
        }
        let buffers = match self.coalesced_datagrams {
            Some(in_coalesced) => {
                self.coalesced_buffers + self.datagrams.saturating_sub(in_coalesced)
            }
            // Without the split, the coalesced buffers alone.
            None => self.coalesced_buffers,
        };
        Some((self.datagrams as f64 / buffers.max(1) as f64).max(1.0))
    }
}

/// Drops in the kernel's unit, put in datagrams.
#[derive(Debug, Clone, PartialEq)]
pub struct InDatagrams {
    pub datagrams: u64,
    /// `counted`, or how the estimate was made.
    pub basis: String,
}

impl Arrivals {
    /// The unit the kernel's drop counter counts for such arrivals:
    /// `buffers` once datagrams came coalesced, else `datagrams`.
    pub fn drops_unit(&self) -> &'static str {
        if self.per_buffer().is_some() {
            "buffers"
        } else {
            "datagrams"
        }
    }

    /// `drops` of the kernel's counter in datagrams: themselves, or `drops`
    /// buffers × the mean datagrams per buffer received, with that basis.
    pub fn drops_in_datagrams(&self, drops: u64) -> InDatagrams {
        match self.per_buffer() {
            None => InDatagrams {
                datagrams: drops,
                basis: "counted".into(),
            },
            Some(per) => InDatagrams {
                datagrams: (drops as f64 * per).round() as u64,
                basis: format!(
                    "estimate: {drops} buffers × {per:.1} datagrams per buffer received"
                ),
            },
        }
    }
}

/// Drops on a receive socket (its counter's growth) while a session ran,
/// in the kernel's unit and in datagrams. `docs/output.md` defines each.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct KernelDrops {
    /// This session's own: nothing else arrived on the socket meanwhile
    /// (in `kernel_drops_unit`).
    pub kernel_drops: Option<u64>,
    /// The whole socket's drops while the session was active, whoever's
    /// datagrams they were (in `kernel_drops_unit`): not a per-peer
    /// figure when other peers shared the socket.
    pub socket_wide_kernel_drops: Option<u64>,
    /// What the counts count: `datagrams`, or `buffers` when the
    /// session's datagrams arrived coalesced (UDP GRO).
    pub kernel_drops_unit: Option<&'static str>,
    /// `kernel_drops` in datagrams: the count itself when the unit is the
    /// datagram, else an estimate (see `kernel_drops_basis`).
    pub kernel_drops_datagrams: Option<u64>,
    /// `counted`, or how the estimate was made.
    pub kernel_drops_basis: Option<String>,
}

impl KernelDrops {
    /// `drops` on the socket (None where unknown); `shared` when other
    /// traffic used it meanwhile; `arrivals` how the session's datagrams
    /// came in.
    pub fn new(drops: Option<u64>, shared: bool, arrivals: Arrivals) -> KernelDrops {
        let own = drops
            .filter(|_| !shared)
            .map(|d| arrivals.drops_in_datagrams(d));
        KernelDrops {
            kernel_drops: drops.filter(|_| !shared),
            socket_wide_kernel_drops: drops,
            kernel_drops_unit: drops.map(|_| arrivals.drops_unit()),
            kernel_drops_datagrams: own.as_ref().map(|c| c.datagrams),
            kernel_drops_basis: own.map(|c| c.basis),
        }
    }

    /// The drops are an estimate (GRO buffers put in datagrams).
    pub fn estimated(&self) -> bool {
        self.kernel_drops_unit == Some("buffers")
    }
}

/// A session's loss, split by where it happened. `docs/output.md`
/// defines each.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LossSplit {
    /// Lost datagrams the receiving socket dropped (its buffer was full) ...
    pub lost_in_socket: Option<u64>,
    /// ... and those lost before they reached it (on the path, or in the
    /// sender's own queue).
    pub lost_before_socket: Option<u64>,
    /// `exact`, `estimate` (the drops were GRO buffers), or `cannot
    /// split: ` and why.
    pub loss_split: Option<String>,
}

/// Splits `lost` datagrams with the session's `drops`. The socket's part
/// never exceeds the loss (a dropped Hello or End is a drop, not a loss),
/// so the two parts always add up to it.
pub fn split_loss(lost: u64, drops: &KernelDrops) -> LossSplit {
    let cannot = |why: &str| LossSplit {
        loss_split: Some(format!("cannot split: {why}")),
        ..LossSplit::default()
    };
    if lost == 0 {
        return LossSplit::default();
    }
    let Some(dropped) = drops.kernel_drops_datagrams else {
        return match drops.socket_wide_kernel_drops {
            Some(_) => cannot("the receive socket also carried other peers' traffic, so its drops are not this session's alone"),
            None => cannot("the receiver cannot count its socket's drops on this platform"),
        };
    };
    let in_socket = dropped.min(lost);
    LossSplit {
        lost_in_socket: Some(in_socket),
        lost_before_socket: Some(lost - in_socket),
        loss_split: Some(
            if drops.estimated() {
                "estimate"
            } else {
                "exact"
            }
            .to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gro(datagrams: u64, buffers: u64, in_them: u64) -> Arrivals {
        Arrivals {
            datagrams,
            coalesced_buffers: buffers,
            coalesced_datagrams: Some(in_them),
        }
    }

    #[test]
    fn gro_buffers_are_put_in_datagrams_with_their_basis() {
        // 1,279 buffers dropped, each of 46 datagrams of 1,400 bytes, as
        // the buffers that arrived held.
        let drops = KernelDrops::new(Some(1279), false, gro(46 * 500, 500, 46 * 500));
        assert_eq!(drops.kernel_drops_unit, Some("buffers"));
        assert_eq!(drops.kernel_drops_datagrams, Some(58_834));
        assert_eq!(
            drops.kernel_drops_basis.as_deref(),
            Some("estimate: 1279 buffers × 46.0 datagrams per buffer received")
        );
        let split = split_loss(58_834, &drops);
        assert_eq!(split.lost_in_socket, Some(58_834));
        assert_eq!(split.lost_before_socket, Some(0));
        assert_eq!(split.loss_split.as_deref(), Some("estimate"));
    }

    #[test]
    fn single_datagrams_count_in_the_mean_of_a_buffer() {
        // 100 buffers of 10 and 1,000 single datagrams: 1,100 buffers for
        // 2,000 datagrams.
        let a = gro(2000, 100, 1000);
        assert!((a.per_buffer().unwrap() - 2000.0 / 1100.0).abs() < 1e-9);
        // Nothing coalesced: the drops are datagrams, counted.
        let plain = KernelDrops::new(Some(7), false, gro(500, 0, 0));
        assert_eq!(plain.kernel_drops_unit, Some("datagrams"));
        assert_eq!(plain.kernel_drops_datagrams, Some(7));
        assert_eq!(plain.kernel_drops_basis.as_deref(), Some("counted"));
    }

    #[test]
    fn the_split_adds_up_to_the_loss_and_never_exceeds_it() {
        let drops = KernelDrops::new(Some(40), false, Arrivals::default());
        let split = split_loss(100, &drops);
        assert_eq!(
            (split.lost_in_socket, split.lost_before_socket),
            (Some(40), Some(60))
        );
        assert_eq!(split.loss_split.as_deref(), Some("exact"));
        // More drops than loss (a dropped control message): capped.
        let split = split_loss(30, &drops);
        assert_eq!(
            (split.lost_in_socket, split.lost_before_socket),
            (Some(30), Some(0))
        );
        // No loss: nothing to split.
        assert_eq!(split_loss(0, &drops), LossSplit::default());
    }

    #[test]
    fn a_shared_socket_or_no_counter_cannot_split() {
        let shared = KernelDrops::new(Some(40), true, Arrivals::default());
        assert_eq!(shared.kernel_drops, None);
        assert_eq!(shared.socket_wide_kernel_drops, Some(40));
        let split = split_loss(100, &shared);
        assert_eq!(split.lost_in_socket, None);
        assert!(split
            .loss_split
            .unwrap()
            .starts_with("cannot split: the receive socket also carried"));
        let unknown = KernelDrops::new(None, false, Arrivals::default());
        assert!(split_loss(5, &unknown)
            .loss_split
            .unwrap()
            .contains("cannot count"));
    }
}
