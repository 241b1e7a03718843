//! The progress bar: the only user of indicatif. It hides itself unless
//! stderr is a terminal, so logs and pipes stay clean.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// Bytes sent out of a total (or a spinner when the run is timed).
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A bar when `wanted` and stderr is a terminal; otherwise nothing.
    pub fn new(total: Option<u64>, wanted: bool) -> Self {
        if !wanted || !std::io::stderr().is_terminal() {
            return Progress { bar: None };
        }
        let bar = match total {
            Some(t) => ProgressBar::with_draw_target(Some(t), ProgressDrawTarget::stderr()).with_style(
                ProgressStyle::with_template(
                    "{bar:40.cyan/blue} {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec} ETA {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            ),
            None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()).with_style(
                ProgressStyle::with_template("{spinner} {decimal_bytes} sent, {decimal_bytes_per_sec} {elapsed}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            ),
        };
        Progress { bar: Some(bar) }
    }

    pub fn add(&self, bytes: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(bytes);
        }
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
}
