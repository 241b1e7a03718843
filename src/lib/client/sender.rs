//! The gate that holds every client of a run back until all of them can
//! start, and what the run will send. (The clients themselves run in
//! `client/fleet.rs`.)

use super::*;
pub(super) use crate::meter::stream::SendTiming;
pub use crate::meter::stream::{NoProgress, SendProgress};

/// After a signal ended the test, how long (beyond the server's grace
/// period) the client still waits for the answer.
pub(super) const SIGNALLED_WAIT: Duration = Duration::from_millis(300);

/// Holds every client back until all of them have probed the server: if
/// one cannot start (no room for it, say), none sends, so that no data is
/// sent for a report that will not be printed.
pub struct StartGate {
    pub(super) state: Mutex<(usize, bool)>,
    pub(super) all_ready: Condvar,
    pub(super) clients: usize,
}

/// The message of a client that did not start because another could not.
pub(super) const HELD_BACK: &str = "held back: another client could not start";

impl StartGate {
    pub fn new(clients: usize) -> Self {
        StartGate {
            state: Mutex::new((0, false)),
            all_ready: Condvar::new(),
            clients,
        }
    }

    /// `clients` clients (one thread's) say whether they could start;
    /// returns whether all could, once every client of the run has said.
    fn ready(&self, clients: usize, ok: bool) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.0 += clients;
        state.1 |= !ok;
        if state.0 >= self.clients {
            self.all_ready.notify_all();
        }
        while state.0 < self.clients {
            state = self
                .all_ready
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
        !state.1
    }
}

/// One thread's place at the [`StartGate`], for its `clients` clients;
/// says "could not start" if dropped unused (an error or a panic before
/// the probes ended).
pub(super) struct Ticket<'a> {
    pub(super) gate: &'a StartGate,
    pub(super) clients: usize,
    pub(super) used: bool,
}

impl Ticket<'_> {
    pub(super) fn ready(mut self, ok: bool) -> bool {
        self.used = true;
        self.gate.ready(self.clients, ok)
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.used {
            self.gate.ready(self.clients, false);
        }
    }
}

/// The payload bytes a run will send, when its volume is a size.
pub fn planned_bytes(cfg: &ClientConfig) -> Option<u64> {
    match cfg.volume {
        Volume::Bytes(t) => Some(t * cfg.clients as u64),
        Volume::Packets(n) => Some(n * cfg.buffer_size as u64 * cfg.clients as u64),
        Volume::Time(_) => None,
    }
}
