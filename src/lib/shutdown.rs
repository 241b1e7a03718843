//! One way to stop: Ctrl-C, SIGTERM, the end of a test and an in-process
//! caller all set the same flag, and every loop polls it at least every
//! [`POLL`]. A flag rather than a channel because the hot loops are
//! blocking threads that already wake up on a receive timeout.
//!
//! The flag also remembers which signal set it, so that a run can say it
//! was interrupted and exit as the shell expects of one ended by that
//! signal (130 for SIGINT, 143 for SIGTERM: [`Signal::exit_code`]). A
//! second signal while the first is being honoured (the end exchange, a
//! proxy's drain) ends the process at once with that code: a user who
//! presses Ctrl-C twice means it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a blocked loop wakes up to check the flag.
pub const POLL: Duration = Duration::from_millis(100);

/// A signal that stopped a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Interrupt,
    Terminate,
}

impl Signal {
    fn of(number: usize) -> Option<Self> {
        match number as i32 {
            signal_hook::consts::SIGINT => Some(Signal::Interrupt),
            signal_hook::consts::SIGTERM => Some(Signal::Terminate),
            _ => None,
        }
    }

    /// `SIGINT` or `SIGTERM`, as reports name it.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Interrupt => "SIGINT",
            Signal::Terminate => "SIGTERM",
        }
    }

    /// The shell's code for a process ended by this signal: 128 + its
    /// number (130, 143).
    pub fn exit_code(self) -> i32 {
        128 + match self {
            Signal::Interrupt => signal_hook::consts::SIGINT,
            Signal::Terminate => signal_hook::consts::SIGTERM,
        }
    }
}

/// A cloneable stop flag.
#[derive(Clone, Debug)]
pub struct Shutdown {
    flag: Arc<AtomicBool>,
    /// The number of the last signal that set the flag (0: none did).
    signal: Arc<AtomicUsize>,
    /// When the flag was made: the start of the run, as its user saw it.
    began: Instant,
}

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown {
            flag: Arc::default(),
            signal: Arc::default(),
            began: Instant::now(),
        }
    }
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    /// The time since the flag was made (for a binary, since it started).
    pub fn elapsed(&self) -> Duration {
        self.began.elapsed()
    }

    /// A flag that SIGINT and SIGTERM set; a second one ends the process.
    pub fn on_signals() -> std::io::Result<Self> {
        let this = Self::new();
        // Set by signals only, not by `trigger`: an in-process stop (the
        // end of a --one-off server) must not turn the user's first
        // Ctrl-C into an abrupt exit.
        let signalled = Arc::new(AtomicBool::new(false));
        for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            // Registered first, so it sees `signalled` as the previous
            // signal left it.
            signal_hook::flag::register_conditional_shutdown(
                signal,
                128 + signal,
                Arc::clone(&signalled),
            )?;
            signal_hook::flag::register(signal, Arc::clone(&signalled))?;
            signal_hook::flag::register_usize(signal, Arc::clone(&this.signal), signal as usize)?;
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

    /// The signal that set the flag, if one did.
    pub fn signal(&self) -> Option<Signal> {
        Signal::of(self.signal.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_map_to_the_shells_exit_codes() {
        assert_eq!(Signal::Interrupt.exit_code(), 130);
        assert_eq!(Signal::Terminate.exit_code(), 143);
        assert_eq!(Signal::of(2), Some(Signal::Interrupt));
        assert_eq!(Signal::of(15), Some(Signal::Terminate));
        assert_eq!(Signal::of(0), None);
    }

    #[test]
    fn an_in_process_stop_names_no_signal() {
        let stop = Shutdown::new();
        stop.trigger();
        assert!(stop.is_triggered());
        assert_eq!(stop.signal(), None);
    }
}
