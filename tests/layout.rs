//! The library's shape, checked on its source so that it cannot drift back:
//! only `output` prints or exits and only it uses the presentation crates;
//! platform `cfg` and the Unix API live in `sys`; the modules form layers
//! (leaves, the meter, settings, roles, what composes roles, output), no
//! module imports from a layer above its own, no role imports another,
//! and no modules import each other in a circle; roles do not re-export
//! settings; output chooses its format once; no file outgrows a reader
//! (1,000 lines before its tests); and the crate docs' "Layout" names
//! every module file.
//!
//! These read the source as text. Comment lines are skipped, so a doc that
//! mentions `println!` is not a violation; code is.

use std::collections::{BTreeMap, BTreeSet};
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
    .filter(|l| {
        !l.contains("#[cfg(all(test, target_os = \"linux\", not(feature = \"portable\")))]")
    })
    .collect();
    assert!(
        found.is_empty(),
        "platform code outside sys:\n{}",
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
fn the_leaves_do_not_parse_flags() {
    // Flags are the settings layer's: no leaf knows the flag parser.
    let mut found = Vec::new();
    for file in rust_files(Path::new(LIB)) {
        let shown = file.to_string_lossy().into_owned();
        if layer_of(&shown) == Some(0) {
            for (n, line) in code_lines(&file) {
                if line.contains("clap") {
                    found.push(format!("src/lib/{shown}:{n}: {}", line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "a leaf uses the flag parser:\n{}",
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

/// The layers, lowest first: a module imports only from its own layer or
/// the ones below (by path prefix below src/lib).
const LAYERS: [&[&str]; 6] = [
    // Leaves.
    &[
        "units.rs",
        "wire/",
        "auth.rs",
        "shutdown.rs",
        "error.rs",
        "matrix.rs",
        "stamp/",
        "stats/",
        "sys/",
    ],
    // Engines.
    &["meter/"],
    // Settings.
    &["config/", "congestion.rs"],
    // Roles: none imports another.
    &["server/", "client/", "proxy/"],
    // What composes roles.
    &["local.rs", "sockbench/"],
    // Presentation.
    &["output/"],
];

const ROLE_DIRS: [&str; 3] = ["server/", "client/", "proxy/"];

fn layer_of(file: &str) -> Option<usize> {
    LAYERS
        .iter()
        .position(|layer| layer.iter().any(|prefix| file.starts_with(prefix)))
}

/// A file's module path: `client/duplex.rs` is `client::duplex`,
/// `client/mod.rs` is `client`.
fn module_of(file: &str) -> Vec<String> {
    let trimmed = file.trim_end_matches(".rs").trim_end_matches("/mod");
    if trimmed == "lib" {
        return Vec::new();
    }
    trimmed.split('/').map(String::from).collect()
}

/// The file's code without comments, up to its unit tests, as one
/// string. (Inside a `mod tests`, `super::` names the file's own module;
/// what its tests import does not shape the library.)
fn code_text(file: &Path) -> String {
    let text = std::fs::read_to_string(Path::new(LIB).join(file)).expect("read source");
    text.lines()
        .take_while(|l| !l.starts_with("#[cfg(test)]") && !l.starts_with("#[cfg(all(test"))
        .map(|l| match l.find("//") {
            // Keep "//" inside strings such as URLs harmlessly: only the
            // paths below matter, and a comment never declares one.
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The paths named at `text[at..]`, expanding `{a, b::{c}}` groups.
fn expand(prefix: &[String], text: &str, out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    let mut rest = text.trim_start();
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            // Split the group at its top-level commas.
            let (mut depth, mut start) = (0usize, 0usize);
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        expand(&path, &group[start..i], out);
                        return;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(&path, &group[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            return;
        }
        let end = rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len());
        let ident = &rest[..end];
        if ident.is_empty() {
            break;
        }
        if ident != "self" {
            path.push(ident.to_string());
        }
        rest = &rest[end..];
        match rest.strip_prefix("::") {
            Some(r) => rest = r.trim_start(),
            None => break,
        }
    }
    out.push(path);
}

/// Every module each file imports from (other than itself, its
/// ancestors and the modules inside it: a module and what it contains are
/// one unit to everyone else), by file.
fn import_graph() -> BTreeMap<String, BTreeSet<String>> {
    let files: Vec<String> = rust_files(Path::new(LIB))
        .iter()
        .map(|f| f.to_string_lossy().into_owned())
        .collect();
    let by_module: BTreeMap<Vec<String>, String> =
        files.iter().map(|f| (module_of(f), f.clone())).collect();
    let mut graph = BTreeMap::new();
    for file in &files {
        let me = module_of(file);
        let parent: Vec<String> = me[..me.len().saturating_sub(1)].to_vec();
        let text = code_text(Path::new(file));
        let mut paths = Vec::new();
        for (anchor, base) in [("crate::", Vec::new()), ("super::", parent.clone())] {
            for (i, _) in text.match_indices(anchor) {
                if text[..i].chars().next_back().is_some_and(is_ident) {
                    continue;
                }
                let mut base = base.clone();
                let mut rest = &text[i + anchor.len()..];
                while let Some(r) = rest.strip_prefix("super::") {
                    base.pop();
                    rest = r;
                }
                expand(&base, rest, &mut paths);
            }
        }
        let mut targets = BTreeSet::new();
        for path in paths {
            let Some(target) = (1..=path.len())
                .rev()
                .find_map(|n| by_module.get(&path[..n]))
            else {
                continue;
            };
            let them = module_of(target);
            let related = me.starts_with(&them) || them.starts_with(&me);
            if !related {
                targets.insert(target.clone());
            }
        }
        graph.insert(file.clone(), targets);
    }
    graph
}

#[test]
fn the_import_graph_reads_the_imports_it_should() {
    // The graph is the base of the two tests below: it must see grouped
    // and nested imports and `super::` paths, or they prove nothing.
    let graph = import_graph();
    let of = |f: &str| {
        graph
            .get(f)
            .unwrap_or_else(|| panic!("no {f} in the graph"))
    };
    assert!(of("client/duplex.rs").contains("client/latency.rs"));
    assert!(of("client/duplex.rs").contains("meter/account/mod.rs"));
    assert!(of("server/mod.rs").contains("meter/receiver.rs"));
    assert!(of("output/report/duplex.rs").contains("client/duplex.rs"));
    assert!(graph.values().map(BTreeSet::len).sum::<usize>() > 200);
}

#[test]
fn no_module_imports_from_a_layer_above_its_own_and_no_role_another() {
    let mut found = Vec::new();
    for (file, targets) in import_graph() {
        let Some(mine) = layer_of(&file) else {
            continue;
        };
        for target in targets {
            let theirs = layer_of(&target).unwrap_or(0);
            let my_role = ROLE_DIRS.iter().find(|r| file.starts_with(*r));
            let other_role = ROLE_DIRS
                .iter()
                .any(|r| target.starts_with(r) && Some(r) != my_role);
            if theirs > mine || (my_role.is_some() && other_role) {
                found.push(format!("src/lib/{file} imports src/lib/{target}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "imports that run up a layer or across roles:\n{}",
        found.join("\n")
    );
}

#[test]
fn no_modules_import_each_other_in_a_circle() {
    let graph = import_graph();
    // Tarjan's strongly connected components, iteratively small enough
    // to recurse: a component of more than one file is a circle.
    struct State<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        next: usize,
        circles: Vec<Vec<&'g str>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g str) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w);
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                s.circles.push(component);
            }
        }
    }
    let mut state = State {
        graph: &graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        circles: Vec::new(),
    };
    for v in graph.keys() {
        if !state.index.contains_key(v.as_str()) {
            visit(&mut state, v);
        }
    }
    assert!(
        state.circles.is_empty(),
        "modules that import each other in a circle: {:?}",
        state.circles
    );
}

#[test]
fn output_chooses_the_format_once() {
    // A view that takes the JSON flag decides text or JSON at every call;
    // the format is a value of its own, made once from the flags (by a
    // `from_flags`), and every report knows how it looks in each.
    let found: Vec<String> = uses_outside(
        &[
            "auth.rs",
            "client/",
            "config/",
            "congestion.rs",
            "error.rs",
            "lib.rs",
            "local.rs",
            "matrix.rs",
            "meter/",
            "proxy/",
            "server/",
            "shutdown.rs",
            "sockbench/",
            "stamp/",
            "stats/",
            "sys/",
            "units.rs",
            "wire/",
        ],
        &["json_out: bool", "json: bool"],
    )
    .into_iter()
    .filter(|l| !l.contains("fn from_flags("))
    .collect();
    assert!(
        found.is_empty(),
        "output functions that take the JSON flag:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_unix_api_is_used_only_in_sys_and_sockbench() {
    // sockbench compares socket libraries on purpose (nix, libc, std's
    // Unix extensions); everything else goes through sys's safe API, which
    // is what a platform without them replaces.
    let found = uses_outside(
        &["sys/", "sockbench/"],
        &["std::os::", "libc::", "nix::", "use libc", "use nix"],
    );
    assert!(
        found.is_empty(),
        "the Unix API outside sys:\n{}",
        found.join("\n")
    );
}

#[test]
fn modules_have_the_names_that_say_what_they_are() {
    for present in [
        "sockbench/mod.rs",
        "client/sweep.rs",
        "client/reverse.rs",
        "proxy/latency_bench.rs",
        "config/sockbench.rs",
        "output/plot.rs",
        "meter/receiver.rs",
    ] {
        assert!(
            Path::new(LIB).join(present).exists(),
            "src/lib/{present} is missing"
        );
    }
    for gone in [
        "bench",
        "download.rs",
        "proxy/bench.rs",
        "config/bench.rs",
        "output/bench",
    ] {
        assert!(
            !Path::new(LIB).join(gone).exists(),
            "src/lib/{gone} is back: it names what it holds badly"
        );
    }
}
