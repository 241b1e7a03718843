//! The library's shape, checked on its source so that it cannot drift back:
//! only `output` prints or exits and only it uses the presentation crates;
//! platform `cfg` lives in `sys`; the leaves import nothing above them,
//! the meter nothing but the leaves, and the settings no role; roles do
//! not re-export settings; no file outgrows a reader (1,000 lines before
//! its tests); and the crate docs' "Layout" names every module file.
//!
//! These read the source as text. Comment lines are skipped, so a doc that
//! mentions `println!` is not a violation; code is.

use std::path::{Path, PathBuf};

const LIB: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/lib");

/// Every `.rs` file below `dir`, as paths relative to src/lib.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == "rs") {
                found.push(path.strip_prefix(LIB).expect("below src/lib").to_path_buf());
            }
        }
    }
    found.sort();
    assert!(found.len() > 20, "read too few files: {found:?}");
    found
}

/// The file's code lines (not comments), with their numbers.
fn code_lines(file: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(Path::new(LIB).join(file)).expect("read source");
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .map(|(i, l)| (i + 1, l.to_string()))
        .collect()
}

/// Lines of files outside `allowed` (path prefixes below src/lib) that
/// contain any of `needles`.
fn uses_outside(allowed: &[&str], needles: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for file in rust_files(Path::new(LIB)) {
        let shown = file.to_string_lossy().into_owned();
        if allowed.iter().any(|a| shown.starts_with(a)) {
            continue;
        }
        for (n, line) in code_lines(&file) {
            if needles.iter().any(|needle| line.contains(needle)) {
                found.push(format!("src/lib/{shown}:{n}: {}", line.trim()));
            }
        }
    }
    found
}

#[test]
fn only_output_prints_or_exits() {
    let found = uses_outside(
        &["output/"],
        &[
            "print!(",
            "println!(",
            "eprint!(",
            "eprintln!(",
            "stdout()",
            "stderr()",
            "process::exit",
        ],
    );
    assert!(
        found.is_empty(),
        "printing outside output:\n{}",
        found.join("\n")
    );
}

#[test]
fn only_output_uses_the_presentation_crates() {
    let found = uses_outside(
        &["output/"],
        &["indicatif", "plotters", "prometheus_client", "hyper::"],
    );
    assert!(found.is_empty(), "outside output:\n{}", found.join("\n"));
}

#[test]
fn platform_cfg_and_errno_live_in_sys() {
    let found: Vec<String> = uses_outside(
        &["sys/"],
        &[
            "target_os",
            "target_family",
            "cfg(unix",
            "cfg(windows",
            "cfg(not(unix",
            "cfg!(",
            "libc::E",
            "raw_os_error",
        ],
    )
    .into_iter()
    // Gating a module of Linux-only tests is not platform code.
    .filter(|l| !l.contains("#[cfg(all(test, target_os = \"linux\"))]"))
    .collect();
    assert!(
        found.is_empty(),
        "platform code outside sys:\n{}",
        found.join("\n")
    );
}

/// Lines of files under `dirs` (path prefixes below src/lib) that import
/// any of the crate modules in `above`, directly or in a `crate::{...}`
/// group.
fn imports_from(dirs: &[&str], above: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for file in rust_files(Path::new(LIB)) {
        let shown = file.to_string_lossy().into_owned();
        if !dirs.iter().any(|d| shown.starts_with(d)) {
            continue;
        }
        for (n, line) in code_lines(&file) {
            let grouped: Vec<String> = line
                .split_once("crate::{")
                .map(|(_, rest)| {
                    rest.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                        .map(|name| format!("crate::{name}"))
                        .collect()
                })
                .unwrap_or_default();
            let named =
                |a: &&str| line.contains(&format!("{a}::")) || line.contains(&format!("{a};"));
            if above.iter().any(named) || grouped.iter().any(|g| above.contains(&g.as_str())) {
                found.push(format!("src/lib/{shown}:{n}: {}", line.trim()));
            }
        }
    }
    found
}

/// The roles and what composes them: nothing below may import these.
const ROLES: [&str; 8] = [
    "crate::server",
    "crate::client",
    "crate::proxy",
    "crate::bench",
    "crate::output",
    "crate::local",
    "crate::download",
    "crate::latency",
];

#[test]
fn settings_import_no_role() {
    let found = imports_from(&["config/"], &ROLES);
    assert!(
        found.is_empty(),
        "config imports a role (settings types belong below the roles):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_meter_imports_no_role_and_no_settings() {
    let mut above = ROLES.to_vec();
    above.push("crate::config");
    let found = imports_from(&["meter/"], &above);
    assert!(
        found.is_empty(),
        "the meter imports from above it:\n{}",
        found.join("\n")
    );
}

#[test]
fn roles_do_not_re_export_settings() {
    let found: Vec<String> = uses_outside(
        &["config/", "output/", "lib.rs"],
        &["pub use crate::config"],
    );
    assert!(
        found.is_empty(),
        "a role re-exports config (import it from config instead):\n{}",
        found.join("\n")
    );
}

/// The most lines a source file may hold before its tests: a reader holds
/// one file at a time (docs/../STYLE: split a file past about 1,000 lines
/// by concern). Counted as all lines, comments included, up to the first
/// `#[cfg(test)]` line.
const MOST_LINES_BEFORE_TESTS: usize = 1000;

#[test]
fn no_file_is_longer_than_a_reader_can_hold() {
    let mut long = Vec::new();
    for file in rust_files(Path::new(LIB)) {
        let text = std::fs::read_to_string(Path::new(LIB).join(&file)).expect("read source");
        let before_tests = text
            .lines()
            .take_while(|l| !l.starts_with("#[cfg(test)]"))
            .count();
        if before_tests > MOST_LINES_BEFORE_TESTS {
            long.push(format!("src/lib/{}: {before_tests} lines", file.display()));
        }
    }
    assert!(
        long.is_empty(),
        "split these by concern:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_leaves_import_nothing_above_them() {
    const LEAVES: [&str; 7] = [
        "units.rs",
        "wire.rs",
        "auth.rs",
        "shutdown.rs",
        "error.rs",
        "stats/",
        "sys/",
    ];
    const ABOVE: [&str; 8] = [
        "crate::config",
        "crate::server",
        "crate::client",
        "crate::proxy",
        "crate::bench",
        "crate::output",
        "crate::local",
        "crate::congestion",
    ];
    let mut found = imports_from(&LEAVES, &ABOVE);
    // Nor the flag parser: flags are the settings layer's.
    for file in rust_files(Path::new(LIB)) {
        let shown = file.to_string_lossy().into_owned();
        if LEAVES.iter().any(|leaf| shown.starts_with(leaf)) {
            for (n, line) in code_lines(&file) {
                if line.contains("clap") {
                    found.push(format!("src/lib/{shown}:{n}: {}", line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "a leaf imports from above:\n{}",
        found.join("\n")
    );
}

/// The crate docs' "Layout" section: from its heading to the first line
/// that is not a doc comment.
fn layout_section() -> String {
    let text = std::fs::read_to_string(Path::new(LIB).join("lib.rs")).expect("read lib.rs");
    let start = text
        .find("//! # Layout")
        .expect("lib.rs has a Layout section");
    text[start..]
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn the_layout_section_names_every_module_file() {
    let layout = layout_section();
    let mut missing = Vec::new();
    for file in rust_files(Path::new(LIB)) {
        let shown = file.to_string_lossy().into_owned();
        if shown == "lib.rs" {
            continue;
        }
        // `server/peers.rs` is named as [`server::peers`] or as
        // `server/peers.rs`; a folder's mod.rs as the folder's module.
        let module = shown
            .trim_end_matches(".rs")
            .trim_end_matches("/mod")
            .replace('/', "::");
        let linked = format!("[`{module}`]");
        // By its whole path in backticks: `proxy/http.rs` does not name
        // a top-level http.rs.
        let path = format!("`{shown}`");
        if !(layout.contains(&linked) || layout.contains(&path)) {
            missing.push(shown);
        }
    }
    assert!(
        missing.is_empty(),
        "lib.rs's Layout does not name: {missing:?}"
    );
}
