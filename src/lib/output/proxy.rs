//! tcp_proxy event lines and benchmark tables (filled in by the proxy restructuring).
