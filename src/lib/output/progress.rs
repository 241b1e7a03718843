//! The progress bar: the only user of indicatif. It hides itself unless
//! stderr is a terminal, so logs and pipes stay clean.

use crate::matrix::Progress as CellProgress;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use std::io::IsTerminal;
use std::time::Duration;

/// How client interval reports are printed.
#[derive(Debug, Clone, Copy)]
enum IntervalLines {
    /// A text line; with the session id when several clients run, and
    /// the direction (`[C->S]`) when data flows both ways.
    Text {
        with_session: bool,
        with_direction: bool,
    },
    /// An NDJSON `interval` event (`--json-stream`).
    Json,
}

/// Bytes sent out of a total (or a spinner when the run is timed).
pub struct Progress {
    bar: Option<ProgressBar>,
    /// How to print `--interval` reports, if at all.
    intervals: Option<IntervalLines>,
}

impl Progress {
    /// A bar when `wanted` and stderr is a terminal; otherwise nothing.
    pub fn new(total: Option<u64>, wanted: bool) -> Self {
        if !wanted || !std::io::stderr().is_terminal() {
            return Progress {
                bar: None,
                intervals: None,
            };
        }
        // The rate in bit/s, scaled as the report prints it (not
        // indicatif's MB/s).
        let gbps = |state: &ProgressState, w: &mut dyn std::fmt::Write| {
            let bps = (state.per_sec() * 8.0).max(0.0) as u64;
            let _ = write!(w, "{}", crate::units::HumanRate(bps));
        };
        let style = |template: &str, fallback: ProgressStyle| {
            ProgressStyle::with_template(template)
                .map(|s| s.with_key("gbps", gbps))
                .unwrap_or(fallback)
        };
        let bar = match total {
            Some(t) => ProgressBar::with_draw_target(Some(t), ProgressDrawTarget::stderr())
                .with_style(style(
                    "{bar:40.cyan/blue} {decimal_bytes}/{decimal_total_bytes} {gbps} ETA {eta}",
                    ProgressStyle::default_bar(),
                )),
            None => {
                ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()).with_style(style(
                    "{spinner} {decimal_bytes} sent, {gbps} {elapsed}",
                    ProgressStyle::default_spinner(),
                ))
            }
        };
        Progress {
            bar: Some(bar),
            intervals: None,
        }
    }

    pub fn add(&self, bytes: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(bytes);
        }
    }

    /// Prints a line above the bar (or plainly, without one).
    pub fn line(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => println!("{line}"),
        }
    }

    /// Also print each client interval, above the bar; `clients` > 1 puts
    /// the session id in front, `both_ways` the direction.
    pub fn with_intervals(mut self, clients: usize, both_ways: bool) -> Self {
        self.intervals = Some(IntervalLines::Text {
            with_session: clients > 1,
            with_direction: both_ways,
        });
        self
    }

    /// Print each client interval as an NDJSON `interval` event.
    pub fn with_interval_events(mut self) -> Self {
        self.intervals = Some(IntervalLines::Json);
        self
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl crate::client::SendProgress for Progress {
    fn add(&self, bytes: u64) {
        Progress::add(self, bytes)
    }

    fn interval(&self, session: &str, interval: &crate::stats::SendInterval) {
        let line = match self.intervals {
            None => return,
            Some(IntervalLines::Text {
                with_session,
                with_direction,
            }) => {
                let line =
                    super::report::client::send_interval(with_session.then_some(session), interval);
                match with_direction {
                    true => format!(
                        "{} {line}",
                        super::report::direction_label(crate::wire::Direction::ClientToServer)
                    ),
                    false => line,
                }
            }
            Some(IntervalLines::Json) => {
                super::report::client::send_interval_event(session, interval)
            }
        };
        self.line(&line);
    }
}

/// A bar counting cells, on stderr. Hidden when stderr is not a terminal
/// or when `quiet`. ([`Progress`] counts bytes; this counts cells.)
pub struct CellBar {
    quiet: bool,
    bar: Option<ProgressBar>,
}

impl CellBar {
    pub fn new(quiet: bool) -> Self {
        CellBar { quiet, bar: None }
    }
}

impl CellProgress for CellBar {
    /// Also prints the run's estimate, when the suite has one.
    fn start(&mut self, suite: &str, total: usize, estimate: Option<Duration>) {
        if self.quiet {
            return;
        }
        if std::io::stderr().is_terminal() {
            let bar =
                ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr())
                    .with_style(
                        ProgressStyle::with_template(
                            "{bar:30.cyan/blue} {pos}/{len} configurations, ETA {eta}  {wide_msg}",
                        )
                        .unwrap_or_else(|_| ProgressStyle::default_bar()),
                    );
            self.bar = Some(bar);
        }
        if let Some(estimate) = estimate {
            eprintln!(
                "sockbench {suite}: {total} configurations, about {:.0} s",
                estimate.as_secs_f64()
            );
        }
    }

    fn cell(&mut self, description: &str) {
        if let Some(b) = &self.bar {
            b.set_message(description.to_string());
        }
    }

    fn done(&mut self) {
        if let Some(b) = &self.bar {
            b.inc(1);
        }
    }

    fn finish(&mut self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
