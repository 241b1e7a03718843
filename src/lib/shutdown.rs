//! One way to stop: Ctrl-C, SIGTERM, the end of a test and an in-process
//! caller all set the same flag, and every loop polls it at least every
//! [`POLL`]. A flag rather than a channel because the hot loops are
//! blocking threads that already wake up on a receive timeout.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often a blocked loop wakes up to check the flag.
pub const POLL: Duration = Duration::from_millis(100);

/// A cloneable stop flag.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    flag: Arc<AtomicBool>,
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    /// A flag that SIGINT and SIGTERM set.
    pub fn on_signals() -> std::io::Result<Self> {
        let this = Self::new();
        for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            signal_hook::flag::register(signal, Arc::clone(&this.flag))?;
        }
        Ok(this)
    }

    pub fn trigger(&self) {
        self.flag.store(true, Ordering::Relaxed);
    }

    pub fn is_triggered(&self) -> bool {
        self.flag.load(Ordering::Relaxed)
    }
}
