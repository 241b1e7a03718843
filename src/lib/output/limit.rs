//! `udp_client --find-limit`'s output: a header, one line per trial as it
//! ends, then the rate found and where the first losses above it were
//! counted. `docs/output.md` defines each figure.

use crate::client::limit::{LimitReport, LossPlaces, Trial};
use crate::client::verdict::Cap;
use crate::config::ClientConfig;
use crate::config::SearchSettings;
use crate::error::Result;
use crate::output::plot::{err, finish, two_axes, TwoAxes, COLORS};
use plotters::prelude::*;
use std::path::Path;

/// A rate with the unit that keeps four significant digits: the search
/// runs from tens of Gbit/s down to a shaper's few Mbit/s.
pub fn rate(bps: f64) -> String {
    crate::units::bps_text(bps)
}

fn opt_rate(bps: Option<f64>) -> String {
    bps.map_or_else(|| "-".into(), rate)
}

/// A percentage as given: `7`, `0.5`, not `7.000000000000001`.
fn percent(p: f64) -> String {
    let rounded = (p * 1e6).round() / 1e6;
    format!("{rounded}")
}

/// The line before the first trial, and the table's header.
pub fn header(cfg: &ClientConfig, s: &SearchSettings) -> String {
    format!(
        "find-limit {} {}: {}-byte datagrams, {} client{}, trials of {:.1} s, resolution {}%, loss tolerance {}%\n\
         trial  phase            offered           sent       received        lost   loss %  result",
        if cfg.traffic.has_reverse() {
            "[S->C] from"
        } else {
            "to"
        },
        cfg.server,
        cfg.buffer_size,
        cfg.clients,
        if cfg.clients == 1 { "" } else { "s" },
        s.trial.as_secs_f64(),
        percent(s.resolution * 100.0),
        percent(s.loss_tolerance)
    )
}

/// Where a trial's shortfall was counted, in words.
pub fn places(cause: Cap, p: &LossPlaces) -> String {
    // Who received and who sent: -R swaps them.
    let (receiver, sender) = if p.reverse {
        ("this client's", "the server's")
    } else {
        ("the server's", "the sender's")
    };
    let dropped = format!(
        "{} {}",
        p.kernel_drops.unwrap_or(0),
        match p.kernel_drops_unit {
            Some("buffers") => "GRO buffers",
            _ => "datagrams",
        }
    );
    match cause {
        Cap::ReceiveBuffer | Cap::ReceiverCpu => {
            let rest = match p.network_lost {
                Some(n) if n > 0 => format!(", {n} more lost on the way"),
                _ => String::new(),
            };
            format!(
                "{receiver} receive buffer ({dropped} dropped by its socket; {} datagrams lost{rest})",
                p.lost_packets
            )
        }
        Cap::Network => {
            let drops = match p.kernel_drops {
                Some(0) => format!("none dropped by {receiver} socket"),
                Some(_) => format!("{dropped} dropped by {receiver} socket"),
                None => format!("{receiver} socket drops unknown"),
            };
            let queue = match p.enobufs_retries {
                0 => format!("none refused by {sender} queue"),
                n => format!("{n} ENOBUFS back-offs at {}", sender.trim_end_matches("'s")),
            };
            format!(
                "the network ({} datagrams lost; {drops}, {queue})",
                p.lost_packets
            )
        }
        Cap::QueueDelay => {
            "the queue on the path (its data's 99th percentile queue delay went over --max-delay)"
                .to_string()
        }
        Cap::SenderQueue => format!(
            "{sender} own queue ({} ENOBUFS back-offs; {} datagrams short of the offered rate)",
            p.enobufs_retries, p.not_sent_packets
        ),
        _ => format!(
            "the sender ({} datagrams short of the offered rate, with no full queue)",
            p.not_sent_packets
        ),
    }
}

/// One trial, as it ends.
pub fn trial_line(t: &Trial) -> String {
    let result = match t.cause {
        None => "ok".to_string(),
        Some(cause) => format!("FAIL: {}", places(cause, &t.places)),
    };
    let queue = t.queue_delay_ms.map_or_else(String::new, |q| {
        format!("  (queue p99 {})", crate::client::latency::ms(q.p99))
    });
    format!(
        "{:>5}  {:<8}  {:>15}  {:>13}  {:>13}  {:>10}  {:>6.3}%  {result}{queue}",
        t.index,
        t.phase.name(),
        t.offered_bps
            .map_or_else(|| "unpaced".into(), |o| rate(o as f64)),
        opt_rate(t.sent_bps),
        opt_rate(t.received_bps),
        t.places.lost_packets,
        t.loss_percent,
    )
}

/// The result, as text (after the trial lines) or as one JSON object.
impl super::report::Shown for LimitReport {
    fn text(&self) -> String {
        report_text(self)
    }

    fn json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".into())
    }
}

fn report_text(r: &LimitReport) -> String {
    let l = &r.limit;
    let mut out = match l.rate_bps {
        Some(bps) => format!(
            "limit     {} {} ({}; received {}, loss {:.3}%)",
            if l.loss_tolerance_percent > 0.0 {
                format!(
                    "highest rate within {}% loss",
                    percent(l.loss_tolerance_percent)
                )
            } else {
                "no-drop rate".to_string()
            },
            rate(bps as f64),
            if l.confirmed {
                format!("passed {} more trials", l.confirmations)
            } else {
                "not confirmed".into()
            },
            opt_rate(l.received_bps),
            l.loss_percent.unwrap_or(0.0)
        ),
        None => "limit     none: no rate passed".into(),
    };
    if let (Some(_), Some(q)) = (l.rate_bps, &l.queue_delay_ms) {
        out += &format!(
            "\ndelay     at that rate, the data waited in queues p50 {}, p99 {}, max {}{}",
            crate::client::latency::ms(q.p50),
            crate::client::latency::ms(q.p99),
            crate::client::latency::ms(q.max),
            l.max_delay_ms.map_or_else(String::new, |b| format!(
                " (--max-delay {})",
                crate::client::latency::ms(b)
            ))
        );
    }
    if let (Some(at), Some(cause), Some(p)) =
        (l.first_loss_at_bps, l.first_loss_cause, &l.first_loss)
    {
        // A rate the sender could not reach failed without loss.
        let what = if p.lost_packets > 0 {
            "first loss at"
        } else {
            "first failure at"
        };
        out += &format!("\n{what} {}: {}", rate(at as f64), places(cause, p));
    }
    out += &format!(
        "\nsearch    {} trials of {:.1} s from the unpaced {}, resolution {}%",
        l.trials,
        l.trial_seconds,
        rate(l.unpaced_bps),
        percent(l.resolution_percent)
    );
    for note in &r.notes {
        out += &format!("\nnote: {note}");
    }
    out
}

/// `udp_client --find-limit --plot`: each paced trial's receive rate
/// (left axis) and loss (right axis) against its offered rate, the line
/// where received equals offered, and the rate found.
pub fn limit_plot(r: &LimitReport, path: &Path) -> Result<()> {
    let paced: Vec<(f64, f64, f64)> = r
        .trials
        .iter()
        .filter_map(|t| {
            let offered = t.offered_bps? as f64 / 1e9;
            Some((offered, t.received_bps.unwrap_or(0.0) / 1e9, t.loss_percent))
        })
        .collect();
    let top = paced
        .iter()
        .flat_map(|p| [p.0, p.1])
        .fold(0.0f64, f64::max)
        .max(1e-6)
        * 1.05;
    let loss_top = paced.iter().map(|p| p.2).fold(1.0f64, f64::max) * 1.1;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    let mut ctx = two_axes(
        &root,
        path,
        TwoAxes {
            title: "udp_client --find-limit",
            x: (0.0, top, "offered Gbit/s"),
            left: (top, "received Gbit/s"),
            right: (loss_top, "loss %"),
        },
    )?;
    let grey = RGBColor(150, 150, 150);
    ctx.draw_series(LineSeries::new(
        [(0.0, 0.0), (top, top)],
        grey.stroke_width(1),
    ))
    .map_err(|e| err(path, e))?
    .label("received = offered")
    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], grey.stroke_width(1)));
    let (blue, red, green) = (COLORS[0], COLORS[3], COLORS[2]);
    ctx.draw_series(
        paced
            .iter()
            .map(|p| Circle::new((p.0, p.1), 4, blue.filled())),
    )
    .map_err(|e| err(path, e))?
    .label("received")
    .legend(move |(x, y)| Circle::new((x + 10, y), 4, blue.filled()));
    ctx.draw_secondary_series(
        paced
            .iter()
            .map(|p| Cross::new((p.0, p.2), 5, red.stroke_width(2))),
    )
    .map_err(|e| err(path, e))?
    .label("loss % (right axis)")
    .legend(move |(x, y)| Cross::new((x + 10, y), 5, red.stroke_width(2)));
    if let Some(rate) = r.limit.rate_bps {
        let x = rate as f64 / 1e9;
        ctx.draw_series(LineSeries::new([(x, 0.0), (x, top)], green.stroke_width(2)))
            .map_err(|e| err(path, e))?
            .label(format!("no-drop rate {x:.3} Gbit/s"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], green.stroke_width(2))
            });
    }
    finish(ctx, &root, path)
}
