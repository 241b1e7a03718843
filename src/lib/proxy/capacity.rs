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
//! are those open at start plus [`HEADROOM`] for the runtime; what is left
//! is divided by what a connection costs in the mode. See
//! [`Capacity::fds_per_conn`].

use crate::config::proxy::Mode;
use crate::error::{Error, Result};
use crate::sys::FileBudget;
use serde::Serialize;

/// Descriptors kept free beyond those open at start: the runtime's epoll
/// and wake-up descriptors, the connection being accepted, a file read
/// now and then (/proc/sys/fs/pipe-max-size).
pub const HEADROOM: u64 = 16;

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
    /// Descriptors open at start plus [`HEADROOM`]: not for connections.
    pub fds_reserved: Option<u64>,
    /// Descriptors an idle connection holds: its two sockets.
    pub fds_per_conn: u64,
    /// Descriptors a connection holds at most, while bytes flow: `splice`
    /// adds two pipes of two descriptors each.
    pub fds_per_busy_conn: u64,
    /// The most connections open at once: `--max-conns`, capped to what
    /// the limit allows.
    pub max_conns: usize,
    /// `--max-conns` as given.
    pub max_conns_asked: usize,
    /// `--mode splice`: the most pipes open at once, in use and pooled
    /// (two descriptors each): the descriptors left once every connection
    /// has its two sockets, and at most two per connection.
    pub pipes_max: Option<usize>,
    /// `--mode splice`: the most empty pipes kept for reuse.
    pub pipe_pool_max: Option<usize>,
}

/// The pool keeps at most this many empty pipes, whatever the limit: an
/// idle pipe holds two descriptors and its grown size.
pub const POOL_MAX: usize = 1024;

/// `splice` plans one pipe for every this many connections
/// ([`Capacity::fds_planned`]).
pub const CONNS_PER_PIPE: u64 = 4;

impl Capacity {
    /// What a connection in `mode` costs in descriptors, idle and at most.
    pub fn fds_per_conn(mode: Mode) -> (u64, u64) {
        match mode {
            // Two sockets; a direction holds a pipe (two descriptors)
            // while bytes are queued.
            Mode::Splice => (2, 6),
            // Two sockets; the std modes' threads hold no descriptor.
            _ => (2, 2),
        }
    }

    /// What the proxy can serve, worked out at start: the soft limit is
    /// raised to the hard one, and when `asked` (`--max-conns`) needs more
    /// than the hard limit, the hard one too if the process may
    /// (CAP_SYS_RESOURCE: HAProxy and nginx do the same when started as
    /// root); a refusal is kept, to be said with the arithmetic. Then
    /// [`Capacity::compute`].
    pub fn at_start(mode: Mode, asked: usize) -> Result<Capacity> {
        let Ok((before, mut files)) = crate::sys::raise_files_to_hard_limit() else {
            return Capacity::compute(mode, asked, None);
        };
        let plan = Capacity::compute(mode, asked, None)?;
        let need = plan
            .fds_planned(asked as u64)
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

    /// Caps `asked` (`--max-conns`) to what `files` allows: `before` is
    /// the soft limit before it was raised, `files` the budget after.
    /// Without `files` (a platform that does not tell) `asked` stands.
    /// A limit that leaves room for no connection at all is an error.
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
        let fit = cap.fit(room);
        if fit == 0 {
            return Err(Error::runtime(format!(
                "RLIMIT_NOFILE {} leaves no room for a connection: {reserved} descriptors are \
                 reserved and one connection needs {fds_per_busy_conn} in --mode {}; {}",
                files.soft,
                mode.name(),
                RAISE
            )));
        }
        cap.max_conns = asked.min(usize::try_from(fit).unwrap_or(usize::MAX));
        if pipes {
            let sockets = (cap.max_conns as u64).saturating_mul(2);
            let left = usize::try_from((room - sockets) / 2).unwrap_or(usize::MAX);
            let most = left.min(cap.max_conns.saturating_mul(2));
            cap.pipes_max = Some(most);
            cap.pipe_pool_max = Some(most.min(POOL_MAX));
        }
        Ok(cap)
    }

    /// Whether the mode plans pipes on top of the sockets (`splice`).
    fn plans_pipes(&self) -> bool {
        self.fds_per_busy_conn > self.fds_per_conn
    }

    /// Descriptors planned for `conns` connections: their two sockets
    /// each, and in `splice` also one pipe (two descriptors) for every
    /// [`CONNS_PER_PIPE`] connections, HAProxy's default ratio
    /// (`tune.maxpipes` is `maxconn / 4`). A quarter of the connections
    /// can move bytes one way through a pipe at once, or an eighth both
    /// ways; a busy connection beyond that copies through a buffer while
    /// the pipes are all taken, and is not refused.
    pub fn fds_planned(&self, conns: u64) -> u64 {
        let sockets = conns.saturating_mul(self.fds_per_conn);
        if self.plans_pipes() {
            sockets.saturating_add(2 * conns.div_ceil(CONNS_PER_PIPE))
        } else {
            sockets
        }
    }

    /// The most connections whose planned descriptors fit in `room`.
    fn fit(&self, room: u64) -> u64 {
        let per_group = self.fds_planned(CONNS_PER_PIPE);
        let mut n = room / per_group * CONNS_PER_PIPE + CONNS_PER_PIPE;
        while n > 0 && self.fds_planned(n) > room {
            n -= 1;
        }
        n
    }

    /// `--max-conns` was more than the limit allows.
    pub fn capped(&self) -> bool {
        self.max_conns < self.max_conns_asked
    }

    /// Descriptors `conns` connections are planned to need, with the
    /// reserve.
    pub fn fds_needed(&self, conns: usize) -> u64 {
        self.fds_planned(conns as u64)
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
        format!(
            "--max-conns {} needs {} descriptors ({}, plus {reserved} reserved); the limit is \
             {limit}{hard}: serving at most {} connections{refused}; {}",
            self.max_conns_asked,
            self.fds_needed(self.max_conns_asked),
            self.per_conn_text(),
            self.max_conns,
            RAISE
        )
    }

    /// What one connection's descriptors are, in words.
    fn per_conn_text(&self) -> &'static str {
        if self.plans_pipes() {
            "2.5 per connection: 2 sockets, and a pipe of 2 for every fourth connection (a busy \
             one holds 2 pipes, 6 in all)"
        } else {
            "2 per connection: 2 sockets"
        }
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
        assert_eq!(cap.fds_reserved, Some(24));
        assert_eq!(cap.max_conns, (1024 - 24) / 2);
        assert!(cap.capped());
        let text = cap.capped_text();
        assert!(
            text.starts_with(
                "--max-conns 4096 needs 8216 descriptors (2 per connection: 2 sockets, plus 24 \
                 reserved); the limit is 1024 (the hard limit): serving at most 500 connections"
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
        let err = Capacity::compute(Mode::Tokio, 10, files(20, 20, 20, 5)).unwrap_err();
        assert!(err.to_string().contains("leaves no room"), "{err}");
    }

    #[test]
    fn splice_plans_a_pipe_for_every_fourth_connection() {
        // 256 - 22 = 234 descriptors: 93 connections' 186 sockets and 24
        // pipes (one for each started four) are 234; a 94th would need 236.
        let cap = Capacity::compute(Mode::Splice, 4096, files(256, 256, 256, 6)).unwrap();
        assert_eq!((cap.fds_per_conn, cap.fds_per_busy_conn), (2, 6));
        assert_eq!(
            (cap.max_conns, cap.pipes_max, cap.pipe_pool_max),
            (93, Some(24), Some(24))
        );
        assert_eq!((cap.fds_planned(93), cap.fds_planned(94)), (234, 236));
        // 4096 × 2 sockets + 1024 pipes × 2 + 22 reserved.
        let text = cap.capped_text();
        assert!(
            text.contains("needs 10262 descriptors (2.5 per connection"),
            "{text}"
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
        assert_eq!(cap.pipes_max, Some((20000 - 22 - 2 * 4096) / 2));
    }
}
