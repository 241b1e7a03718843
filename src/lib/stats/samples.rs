//! Sample summaries for sockbench (moved here from bench/stats.rs by the sockbench restructuring).
