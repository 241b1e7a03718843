//! How many connections the process's descriptor limit (RLIMIT_NOFILE)
//! lets the proxy serve, and `--max-conns` capped to it.
//!
//! Why: every connection costs descriptors, and a proxy that runs out of
//! them fails in ways that look like somebody else's fault. From a shell
//! with the usual soft limit of 1,024, 169 of 600 idle connections were
//! served while `--max-conns` said 4,096, and the log blamed the upstream
//! ("cannot reach upstream ...: Too many open files"). So at start the
//! proxy raises its soft limit to the hard one (as Go's runtime, nginx
//! and HAProxy do), and the hard one too when `--max-conns` needs more and
//! the process may (CAP_SYS_RESOURCE, as HAProxy and nginx do as root),
//! works out what that limit allows, and, when
//! `--max-conns` asks for more, says so once with the arithmetic and
//! serves at most what fits. Connections beyond it are `rejected` like
//! any over `--max-conns`, with the descriptor limit named as the reason.
//!
//! The arithmetic (pure, [`Capacity::compute`]): `reserved` descriptors
//! are those open once the runtime is up plus [`HEADROOM`]; what is left
//! is divided by the two sockets of a connection, in every mode. In
//! `splice`, the pipes come from what the connections leave: a direction
//! takes one only while bytes are queued, and copies its burst when none
//! is free, so a connection works without one. See
//! [`Capacity::fds_planned`].

use crate::config::proxy::Mode;
use crate::error::{Error, Result};
use crate::sys::FileBudget;
use serde::Serialize;

/// Descriptors kept free beyond those open once the runtime is up (its
/// epoll and wake-up descriptors are counted among those): one for a
/// connection accepted beyond `--max-conns` only to be closed
/// (`rejected`), one for a file read at start (/proc/sys/fs/pipe-max-size,
/// the congestion control's name), and two to spare. It was 16, a guess
/// for the runtime's descriptors included, while the proxy counted before
/// starting its runtime, which opens three (two epoll instances and an
/// eventfd, in /proc/PID/fd): 9 descriptors more than now, 4 connections.
pub const HEADROOM: u64 = 4;

/// What the descriptor limit allows, as the `listening` event reports it.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Capacity {
    /// The soft RLIMIT_NOFILE the proxy runs with (after raising it); None
    /// where the platform does not tell.
    #[serialize_always]
    pub fd_limit: Option<u64>,
    /// The soft limit it started with, before raising it.
    pub fd_limit_before: Option<u64>,
    /// The hard limit: the most the soft one could be raised to.
    pub fd_hard_limit: Option<u64>,
    /// The hard limit before the proxy raised it (only when it did: it
    /// was below what `--max-conns` needs, and the process may raise it).
    pub fd_hard_limit_before: Option<u64>,
    /// Why the hard limit could not be raised to what `--max-conns` needs
    /// (no CAP_SYS_RESOURCE, mostly): the error, with the number asked.
    pub fd_hard_limit_refused: Option<String>,
    /// Descriptors open once the runtime is up, plus [`HEADROOM`]: not
    /// for connections.
    pub fds_reserved: Option<u64>,
    /// Descriptors planned per connection: its two sockets, in every mode.
    pub fds_per_conn: u64,
    /// Descriptors a connection holds at most, while bytes flow: `splice`
    /// adds two pipes of two descriptors each, when there are pipes free.
    pub fds_per_busy_conn: u64,
    /// The most connections open at once: `--max-conns`, capped to what
    /// the limit allows.
    pub max_conns: usize,
    /// `--max-conns` as given.
    pub max_conns_asked: usize,
    /// `--mode splice`: the most pipes open at once, in use and pooled
    /// (two descriptors each): the descriptors left once `max_conns`
    /// connections have their two sockets, and at most two per connection.
    /// 0 when the connections take every descriptor: then every direction
    /// copies.
    pub pipes_max: Option<usize>,
    /// `--mode splice`: the most empty pipes kept for reuse.
    pub pipe_pool_max: Option<usize>,
}

/// The pool keeps at most this many empty pipes, whatever the limit: an
/// idle pipe holds two descriptors and its grown size.
pub const POOL_MAX: usize = 1024;

/// When the proxy may raise its hard limit, `splice` asks for one pipe for
/// every this many connections on top of their sockets
/// ([`Capacity::fds_wanted`]), HAProxy's default ratio (`tune.maxpipes` is
/// `maxconn / 4`).
pub const CONNS_PER_PIPE: u64 = 4;

impl Capacity {
    /// What a connection in `mode` costs in descriptors: planned (its
    /// sockets), and at most.
    pub fn fds_per_conn(mode: Mode) -> (u64, u64) {
        match mode {
            // Two sockets; a direction holds a pipe (two descriptors)
            // while bytes are queued, if one is free.
            Mode::Splice => (2, 6),
            // Two sockets; the std modes' threads hold no descriptor.
            _ => (2, 2),
        }
    }

    /// What the proxy can serve, worked out at start, once the runtime is
    /// up (its descriptors are then counted as open): the soft limit is
    /// raised to the hard one, and when `asked` (`--max-conns`) wants more
    /// than the hard limit ([`Capacity::fds_wanted`]), the hard one too if
    /// the process may (CAP_SYS_RESOURCE: HAProxy and nginx do the same
    /// when started as root); a refusal is kept, to be said with the
    /// arithmetic. Then [`Capacity::compute`].
    pub fn at_start(mode: Mode, asked: usize) -> Result<Capacity> {
        let Ok((before, mut files)) = crate::sys::raise_files_to_hard_limit() else {
            return Capacity::compute(mode, asked, None);
        };
        let plan = Capacity::compute(mode, asked, None)?;
        let need = plan
            .fds_wanted(asked as u64)
            .saturating_add(files.open + HEADROOM);
        let (mut raised_from, mut refused) = (None, None);
        if need > files.hard {
            match crate::sys::raise_hard_file_limit(need) {
                Ok(now) if now > files.hard => {
                    raised_from = Some(files.hard);
                    files.hard = now;
                    files.soft = now;
                }
                Ok(_) => {}
                Err(e) => {
                    refused = Some(format!(
                        "raising the hard limit to {need} was refused ({e}; it needs \
                         CAP_SYS_RESOURCE)"
                    ))
                }
            }
        }
        let mut cap = Capacity::compute(mode, asked, Some((before, files)))?;
        cap.fd_hard_limit_before = raised_from;
        cap.fd_hard_limit_refused = refused;
        Ok(cap)
    }

    /// Caps `asked` (`--max-conns`) to what `files` allows at two
    /// descriptors per connection, and gives `splice` the pipes that the
    /// descriptors left after those connections allow: `before` is the
    /// soft limit before it was raised, `files` the budget after. Without
    /// `files` (a platform that does not tell) `asked` stands. A limit that
    /// leaves room for no connection at all is an error.
    pub fn compute(mode: Mode, asked: usize, files: Option<(u64, FileBudget)>) -> Result<Capacity> {
        let (fds_per_conn, fds_per_busy_conn) = Capacity::fds_per_conn(mode);
        let mut cap = Capacity {
            fd_limit: None,
            fd_limit_before: None,
            fd_hard_limit: None,
            fd_hard_limit_before: None,
            fd_hard_limit_refused: None,
            fds_reserved: None,
            fds_per_conn,
            fds_per_busy_conn,
            max_conns: asked,
            max_conns_asked: asked,
            pipes_max: None,
            pipe_pool_max: None,
        };
        let pipes = mode == Mode::Splice;
        let Some((before, files)) = files else {
            if pipes {
                cap.pipes_max = Some(asked.saturating_mul(2));
                cap.pipe_pool_max = Some(asked.saturating_mul(2).min(POOL_MAX));
            }
            return Ok(cap);
        };
        let reserved = files.open + HEADROOM;
        cap.fd_limit = Some(files.soft);
        cap.fd_limit_before = Some(before);
        cap.fd_hard_limit = Some(files.hard);
        cap.fds_reserved = Some(reserved);
        let room = files.soft.saturating_sub(reserved);
        let fit = room / fds_per_conn;
        if fit == 0 {
            return Err(Error::runtime(format!(
                "RLIMIT_NOFILE {} leaves no room for a connection: {reserved} descriptors are \
                 reserved and one connection needs {fds_per_conn}; {}",
                files.soft, RAISE
            )));
        }
        cap.max_conns = asked.min(usize::try_from(fit).unwrap_or(usize::MAX));
        if pipes {
            let left = cap.fds_left_for_pipes().unwrap_or(0);
            let most = usize::try_from(left / 2).unwrap_or(usize::MAX);
            let most = most.min(cap.max_conns.saturating_mul(2));
            cap.pipes_max = Some(most);
            cap.pipe_pool_max = Some(most.min(POOL_MAX));
        }
        Ok(cap)
    }

    /// Whether the mode uses pipes on top of the sockets (`splice`).
    fn uses_pipes(&self) -> bool {
        self.fds_per_busy_conn > self.fds_per_conn
    }

    /// Descriptors planned for `conns` connections: their two sockets
    /// each, in every mode. A `splice` connection needs no pipe to work
    /// (its small bursts are copied, and a bulk direction that finds no
    /// pipe free copies its burst too), so none is planned for it: the
    /// pipes come from the descriptors the connections leave
    /// ([`Capacity::fds_left_for_pipes`]). Planning a pipe for every fourth
    /// connection, as before, served 93 connections under a limit of 256
    /// where HAProxy serves 119.
    pub fn fds_planned(&self, conns: u64) -> u64 {
        conns.saturating_mul(self.fds_per_conn)
    }

    /// Descriptors asked for when the proxy may raise its hard limit: the
    /// sockets of `conns` connections and, in `splice`, one pipe (two
    /// descriptors) for every [`CONNS_PER_PIPE`] connections, so that a
    /// limit raised to fit `--max-conns` leaves pipes too. Under a limit
    /// the proxy cannot raise, the connections come first.
    pub fn fds_wanted(&self, conns: u64) -> u64 {
        let sockets = self.fds_planned(conns);
        if self.uses_pipes() {
            sockets.saturating_add(2 * conns.div_ceil(CONNS_PER_PIPE))
        } else {
            sockets
        }
    }

    /// `splice` with a known limit: the descriptors left for pipes once
    /// `max_conns` connections have their sockets, and the reserve.
    pub fn fds_left_for_pipes(&self) -> Option<u64> {
        if !self.uses_pipes() {
            return None;
        }
        let room = self.fd_limit?.saturating_sub(self.fds_reserved?);
        Some(room.saturating_sub(self.fds_planned(self.max_conns as u64)))
    }

    /// `--max-conns` was more than the limit allows.
    pub fn capped(&self) -> bool {
        self.max_conns < self.max_conns_asked
    }

    /// Descriptors `conns` connections want ([`Capacity::fds_wanted`]),
    /// with the reserve: what the proxy raises its hard limit to when it
    /// may.
    pub fn fds_needed(&self, conns: usize) -> u64 {
        self.fds_wanted(conns as u64)
            .saturating_add(self.fds_reserved.unwrap_or(0))
    }

    /// The one line said at start when `--max-conns` is capped: the
    /// arithmetic, and what to do about it.
    pub fn capped_text(&self) -> String {
        let limit = self.fd_limit.unwrap_or(0);
        let reserved = self.fds_reserved.unwrap_or(0);
        let hard = match self.fd_hard_limit {
            Some(h) if h == limit => " (the hard limit)".to_string(),
            Some(h) => format!(" (hard limit {h})"),
            None => String::new(),
        };
        let refused = match &self.fd_hard_limit_refused {
            Some(why) => format!("; {why}"),
            None => String::new(),
        };
        let pipes = match self.fds_left_for_pipes() {
            Some(left) => format!(", with pipes from the {} left", descriptors(left)),
            None => String::new(),
        };
        format!(
            "--max-conns {} needs {} descriptors ({}, plus {reserved} reserved); the limit is \
             {limit}{hard}: serving at most {} connections, 2 descriptors each{pipes}{refused}; \
             {}",
            self.max_conns_asked,
            self.fds_needed(self.max_conns_asked),
            self.wanted_text(),
            self.max_conns,
            RAISE
        )
    }

    /// What [`Capacity::fds_wanted`] counts, in words.
    fn wanted_text(&self) -> &'static str {
        if self.uses_pipes() {
            "2 per connection for its sockets, and a pipe of 2 for every fourth connection"
        } else {
            "2 per connection: 2 sockets"
        }
    }

    /// The plan in words, for the `listening` event: how many connections
    /// fit, and, in `splice`, that the pipes come from what they leave.
    /// `at most 122 connections (--max-conns 4096 capped), 2 descriptors
    /// each (their sockets); pipes from the 0 descriptors left: none, so
    /// every direction copies`.
    pub fn plan_text(&self) -> String {
        let capped = if self.capped() {
            format!(" (--max-conns {} capped)", self.max_conns_asked)
        } else {
            String::new()
        };
        let conns = format!(
            "at most {} connections{capped}, {} descriptors each (their sockets)",
            self.max_conns, self.fds_per_conn
        );
        let Some(pipes) = self.pipes_max.filter(|_| self.uses_pipes()) else {
            return conns;
        };
        let from = match self.fds_left_for_pipes() {
            Some(left) => format!("from the {} left", descriptors(left)),
            None => "from what is left".to_string(),
        };
        if pipes == 0 {
            format!("{conns}; pipes {from}: none, so every direction copies")
        } else {
            format!("{conns}; pipes {from}: at most {pipes}, 2 descriptors each")
        }
    }
}

/// `1 descriptor`, `44 descriptors`.
fn descriptors(n: u64) -> String {
    if n == 1 {
        "1 descriptor".into()
    } else {
        format!("{n} descriptors")
    }
}

/// How a user gives the proxy more descriptors.
const RAISE: &str = "raise the hard limit (ulimit -Hn, LimitNOFILE= in a systemd unit) for more";

#[cfg(test)]
mod tests {
    use super::*;

    fn files(before: u64, soft: u64, hard: u64, open: u64) -> Option<(u64, FileBudget)> {
        Some((before, FileBudget { soft, hard, open }))
    }

    #[test]
    fn the_limit_caps_max_conns_with_the_arithmetic() {
        let cap = Capacity::compute(Mode::Tokio, 4096, files(1024, 1024, 1024, 8)).unwrap();
        assert_eq!(cap.fds_reserved, Some(12));
        assert_eq!(cap.max_conns, (1024 - 12) / 2);
        assert!(cap.capped());
        let text = cap.capped_text();
        assert!(
            text.starts_with(
                "--max-conns 4096 needs 8204 descriptors (2 per connection: 2 sockets, plus 12 \
                 reserved); the limit is 1024 (the hard limit): serving at most 506 connections, \
                 2 descriptors each; raise"
            ),
            "{text}"
        );
    }

    #[test]
    fn within_the_limit_max_conns_stands() {
        let cap = Capacity::compute(Mode::Std, 4096, files(1024, 20000, 20000, 8)).unwrap();
        assert_eq!((cap.max_conns, cap.capped()), (4096, false));
        assert_eq!(cap.fd_limit_before, Some(1024));
        // A platform that does not tell: --max-conns as given.
        let cap = Capacity::compute(Mode::Tokio, 7, None).unwrap();
        assert_eq!((cap.max_conns, cap.fd_limit), (7, None));
    }

    #[test]
    fn no_room_for_one_connection_is_an_error() {
        // 5 open and 4 of headroom leave 1: not a connection's two sockets.
        let err = Capacity::compute(Mode::Tokio, 10, files(10, 10, 10, 5)).unwrap_err();
        assert!(err.to_string().contains("leaves no room"), "{err}");
    }

    #[test]
    fn splice_plans_two_per_connection_and_pipes_from_what_is_left() {
        // 256 - 12 = 244 descriptors: 122 connections' 244 sockets, and
        // nothing left for pipes (HAProxy serves 119 here).
        let cap = Capacity::compute(Mode::Splice, 4096, files(256, 256, 256, 8)).unwrap();
        assert_eq!((cap.fds_per_conn, cap.fds_per_busy_conn), (2, 6));
        assert_eq!(
            (cap.max_conns, cap.pipes_max, cap.pipe_pool_max),
            (122, Some(0), Some(0))
        );
        assert_eq!(cap.fds_left_for_pipes(), Some(0));
        assert_eq!((cap.fds_planned(122), cap.fds_planned(123)), (244, 246));
        assert_eq!(
            cap.plan_text(),
            "at most 122 connections (--max-conns 4096 capped), 2 descriptors each (their \
             sockets); pipes from the 0 descriptors left: none, so every direction copies"
        );
        // What it asks for when it may raise the hard limit: 4096 × 2
        // sockets + 1024 pipes × 2 + 12 reserved.
        let text = cap.capped_text();
        assert!(
            text.starts_with(
                "--max-conns 4096 needs 10252 descriptors (2 per connection for its sockets, \
                 and a pipe of 2 for every fourth connection, plus 12 reserved); the limit is \
                 256 (the hard limit): serving at most 122 connections, 2 descriptors each, \
                 with pipes from the 0 descriptors left; raise"
            ),
            "{text}"
        );
        // An odd descriptor left over makes no pipe.
        let cap = Capacity::compute(Mode::Splice, 4096, files(257, 257, 257, 8)).unwrap();
        assert_eq!((cap.max_conns, cap.pipes_max), (122, Some(0)));
        assert_eq!(cap.fds_left_for_pipes(), Some(1));
        assert!(
            cap.plan_text()
                .ends_with("pipes from the 1 descriptor left: none, so every direction copies"),
            "{}",
            cap.plan_text()
        );
        // A lower --max-conns leaves descriptors for pipes: 244 - 200.
        let cap = Capacity::compute(Mode::Splice, 100, files(256, 256, 256, 8)).unwrap();
        assert_eq!(
            (cap.max_conns, cap.pipes_max, cap.capped()),
            (100, Some(22), false)
        );
        assert_eq!(
            cap.plan_text(),
            "at most 100 connections, 2 descriptors each (their sockets); pipes from the 44 \
             descriptors left: at most 22, 2 descriptors each"
        );
        // Plenty of descriptors: no more than two pipes per connection, and
        // the pool within POOL_MAX.
        let cap = Capacity::compute(Mode::Splice, 100, files(1024, 1 << 20, 1 << 20, 6)).unwrap();
        assert_eq!(
            (cap.max_conns, cap.pipes_max, cap.pipe_pool_max),
            (100, Some(200), Some(200))
        );
        let cap = Capacity::compute(Mode::Splice, 4096, files(1024, 20000, 20000, 6)).unwrap();
        assert_eq!((cap.max_conns, cap.pipe_pool_max), (4096, Some(POOL_MAX)));
        assert_eq!(cap.pipes_max, Some((20000 - 10 - 2 * 4096) / 2));
        // The other modes have no pipes to speak of.
        let cap = Capacity::compute(Mode::Tokio, 4096, files(256, 256, 256, 8)).unwrap();
        assert_eq!((cap.max_conns, cap.pipes_max), (122, None));
        assert_eq!(
            cap.plan_text(),
            "at most 122 connections (--max-conns 4096 capped), 2 descriptors each (their \
             sockets)"
        );
    }
}
