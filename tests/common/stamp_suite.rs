//! stamp-suite (crates.io, pinned in .ci/run): the independent STAMP
//! implementation the interop tests run against. A test that needs it and
//! cannot find it fails, saying how to install it; it never skips.

use std::path::PathBuf;

/// stamp-suite's binary, or a failure that says how to get it.
pub fn stamp_suite() -> PathBuf {
    if let Some(path) = std::env::var_os("STAMP_SUITE") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "STAMP_SUITE={} is not a file: install stamp-suite with `cargo install stamp-suite --version 1.0.0 --locked --root /opt/stamp-suite`",
            path.display()
        );
        return path;
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("stamp-suite"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "stamp-suite is not installed: these interop tests need it. Install it with \
             `cargo install stamp-suite --version 1.0.0 --locked --root /opt/stamp-suite` and put \
             /opt/stamp-suite/bin on PATH, or set STAMP_SUITE to the binary (.ci/run does this)"
        )
    })
}
