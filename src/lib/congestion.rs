//! `--congestion ALGO`: the TCP congestion control a tool asks for on its
//! own sockets (TCP_CONGESTION), shared by `tcp_proxy` and `sockbench tcp`.
//!
//! Why a flag at all: on a host whose default is BBR and whose device has
//! no fq qdisc (loopback), the kernel paces every BBR sender with its own
//! timer, and the gaps it leaves can cap a loopback measurement far below
//! what the CPUs could carry (docs/proxy.md measures it). The flag lets a
//! user see the difference without changing the host's sysctl.
//!
//! Why a small `Copy` type rather than a `String`: benchmark cases are
//! `Copy` values handed to threads and tasks; the kernel caps names at 15
//! bytes (TCP_CA_NAME_MAX is 16 with the NUL), so the name fits inline.

use crate::error::{Error, Result};
use crate::sys::CongestionRefusal;
use std::fmt;

/// A congestion control algorithm's name, checked for shape.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Congestion {
    name: [u8; Congestion::MAX_LEN],
    len: u8,
}

impl Congestion {
    /// The longest name the kernel accepts.
    pub const MAX_LEN: usize = 15;

    /// Checks the shape of a name: 1 to 15 ASCII letters, digits, `_` or
    /// `-`. Whether the kernel has it is [`Congestion::check_available`].
    pub fn parse(name: &str) -> Result<Congestion> {
        let ok = !name.is_empty()
            && name.len() <= Self::MAX_LEN
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !ok {
            return Err(Error::usage(format!(
                "--congestion '{name}': expected an algorithm name such as cubic, bbr or reno \
                 (at most {} letters, digits, '_' or '-')",
                Self::MAX_LEN
            )));
        }
        let mut bytes = [0u8; Self::MAX_LEN];
        bytes[..name.len()].copy_from_slice(name.as_bytes());
        Ok(Congestion {
            name: bytes,
            len: name.len() as u8,
        })
    }

    /// The name, as the kernel knows it.
    pub fn as_str(&self) -> &str {
        // Only ASCII was ever stored (see `parse`).
        std::str::from_utf8(&self.name[..usize::from(self.len)]).unwrap_or("")
    }

    /// Sets this algorithm on a probe socket, so that a name the kernel
    /// lacks is a usage error at start and not a failure per connection.
    pub fn check_available(&self) -> Result<()> {
        let probe = socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )
        .map_err(|e| Error::io("cannot create a TCP socket", e))?;
        let name = self.as_str();
        crate::sys::set_tcp_congestion(&probe, name).map_err(|e| {
            let available = crate::sys::available_tcp_congestion()
                .map(|list| format!(" (loaded now: {list})"))
                .unwrap_or_default();
            let why = match crate::sys::congestion_refusal(&e) {
                CongestionRefusal::NotLoaded => format!(
                    "no such algorithm in this kernel{available}; the kernel tries to load a module tcp_{name} only for a caller with CAP_NET_ADMIN"
                ),
                CongestionRefusal::NotAllowed => format!(
                    "not in net.ipv4.tcp_allowed_congestion_control and this process lacks CAP_NET_ADMIN{available}"
                ),
                CongestionRefusal::Other => format!("{e}{available}"),
            };
            Error::usage(format!("--congestion {name}: {why}"))
        })
    }

    /// Sets this algorithm on one TCP socket.
    pub fn apply(&self, socket: &socket2::Socket) -> std::io::Result<()> {
        crate::sys::set_tcp_congestion(socket, self.as_str())
    }

    /// What a socket of this process gets: `configured`, or the system's
    /// default (None where the platform cannot tell).
    pub fn effective(configured: Option<Congestion>) -> Option<String> {
        match configured {
            Some(c) => Some(c.as_str().to_string()),
            None => crate::sys::default_tcp_congestion(),
        }
    }
}

impl fmt::Display for Congestion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Congestion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Congestion({})", self.as_str())
    }
}

/// clap's value parser for `--congestion`.
pub fn congestion_arg(s: &str) -> Result<Congestion> {
    Congestion::parse(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_shapes_are_usage_errors() {
        for name in ["cubic", "bbr", "reno", "a", "abcdefghijklmno", "dc_tcp-2"] {
            assert_eq!(Congestion::parse(name).unwrap().as_str(), name);
        }
        for bad in ["", "cubic;rm", "a b", "abcdefghijklmnop", "cübic"] {
            let err = Congestion::parse(bad).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{bad}");
            assert!(!err.to_string().contains('\n'));
        }
    }

    #[test]
    fn reno_is_always_available_and_a_made_up_name_is_not() {
        if crate::sys::default_tcp_congestion().is_none() {
            return; // a platform that cannot choose per socket
        }
        // reno is built into every Linux kernel: the fallback of all.
        Congestion::parse("reno")
            .unwrap()
            .check_available()
            .unwrap();
        let err = Congestion::parse("no-such-algo")
            .unwrap()
            .check_available()
            .unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("no-such-algo"), "{err}");
    }
}
