//! sockbench's settings: flags and file layered by [`super::layered`] (filled in by the sockbench restructuring).
