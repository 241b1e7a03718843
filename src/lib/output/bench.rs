//! sockbench tables, CSV, charts and progress (filled in by the sockbench restructuring).
