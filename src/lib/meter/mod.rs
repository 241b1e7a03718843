//! The meter: the engines that move and count datagrams, whichever role
//! runs them.
//!
//! Why a layer of its own: an upload has the client send and the server
//! receive; a reverse stream has the server send and the client receive.
//! The send path, the pacer, the receive loops and the datagram plan are
//! the same either way, so they live here and both roles compose them;
//! neither role reaches into the other's files. The meter imports only
//! the leaves (wire, stats, sys, units, shutdown, error).
//!
//! - [`send`]: the send paths (sendto, sendmmsg, UDP GSO) with back-off on
//!   a full queue and fallbacks the report names;
//! - [`pace`]: pacing to a rate by schedule, and the back-off;
//! - [`recv`]: the receive methods (thread, select, poll, epoll, tokio,
//!   mmsg) that hand batches to a [`recv::Deliver`];
//! - [`plan`]: how many datagrams of what length each call carries, for an
//!   exact volume;
//! - [`stream`]: the one send loop every sender drives (pacer, plan,
//!   headers, send, sender-side timing and intervals).

pub mod pace;
pub mod plan;
pub mod recv;
pub mod send;
pub mod stream;
