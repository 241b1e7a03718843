//! tcp_proxy's settings (moved here from proxy/config.rs by the proxy restructuring).
