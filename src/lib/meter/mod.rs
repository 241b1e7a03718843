//! The meter: the engines that move and count datagrams, whichever role
//! runs them.
//!
//! Why a layer of its own: an upload has the client send and the server
//! receive; a reverse stream has the server send and the client receive.
//! The send path, the pacer, the receive loops, the receive accounting
//! and the datagram plan are the same either way, so they live here and both roles compose them;
//! neither role reaches into the other's files. The meter imports only
//! the leaves (wire, stats, sys, units, shutdown, error).
//!
//! - [`account`]: the receive accounting: per session and per source,
//!   loss, duplicates, reordering, jitter, kernel drops, and the receiving
//!   side of the end-of-test exchange (the server runs it for uploads,
//!   the client for a reverse stream);
//! - [`send`]: the send paths (sendto, sendmmsg, UDP GSO) with back-off on
//!   a full queue and fallbacks the report names;
//! - [`pace`]: pacing to a rate by schedule, and the back-off;
//! - [`receiver`]: the receive engine: threads that read the sockets and
//!   count into one table, and the thread that finalises what they
//!   counted, with a role's hooks (the server's and the client's);
//! - [`recv`]: the receive methods (thread, select, poll, epoll, tokio,
//!   mmsg) that hand batches to a [`recv::Deliver`];
//! - [`plan`]: how many datagrams of what length each call carries, for an
//!   exact volume;
//! - [`stream`]: the one send loop every sender drives (pacer, plan,
//!   headers, send, sender-side timing and intervals).

pub mod account;
pub mod pace;
pub mod plan;
pub mod receiver;
pub mod recv;
pub mod send;
pub mod stream;
