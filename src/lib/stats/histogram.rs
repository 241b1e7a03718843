//! Latency histograms (moved here from proxy/histogram.rs by the proxy restructuring).
