//! splice(2) zero-copy forwarding for `tcp_proxy --mode splice` (being written).
