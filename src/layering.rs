//! The module graph follows the request path, and this test keeps it so: it reads every
//! file under `src/`, takes each `crate::…` path (and, inside `store/redis/`, each
//! `super::…` path) outside comments and strings, and fails on an edge that goes up the
//! declared layers or across one, at the top level and inside `store/redis/`. A new
//! module must be placed in [`TOP_LEVEL`] (or [`STORE_REDIS`]) to compile into the graph.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Top-level modules from the top down: a module may use only modules of lower layers.
/// The request goes down it: the listener hands a call to the service, which asks the
/// limiter, which asks the store, which runs the algorithms; rules, telemetry, the
/// clock and the serving threads sit below all of them.
const TOP_LEVEL: &[&[&str]] = &[
    &["commands", "server", "fuzzing"],
    &["settings"],
    &["bench"],
    &["admin", "listener"],
    &["lifecycle", "service", "xds"],
    &["limiter", "exchange"],
    &["store", "ledger"],
    &["lanes", "rules", "telemetry", "clock"],
    &["algorithm", "codec", "regions"],
    &["proto", "pem", "reloading", "jitter"],
];

/// `store/redis/`'s modules from the top down (its `mod.rs`, the store, is above all).
const STORE_REDIS: &[&[&str]] = &[
    &["lease", "hold", "batcher", "exchange"],
    &["call"],
    &["health"],
    &["nodes"],
    &["clients", "sentinel"],
    &["functions", "client"],
    &["script", "tls"],
    &["links"],
];

/// The source with comments, string and char literals blanked out, so that a path in
/// a doc comment or a message is not an edge.
fn code_only(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut chars = source.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut previous = ' ';
                for c in chars.by_ref() {
                    if previous == '*' && c == '/' {
                        break;
                    }
                    previous = c;
                }
                out.push(' ');
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if escaped {
                        escaped = false;
                    } else if c == '\\' {
                        escaped = true;
                    } else if c == '"' {
                        break;
                    }
                }
                out.push_str("\"\"");
            }
            _ => out.push(c),
        }
    }
    out
}

/// The first segment of every `prefix…` path in `code` (`crate::a::b` → `a`).
fn first_segments(code: &str, prefix: &str) -> BTreeSet<String> {
    code.match_indices(prefix)
        .filter(|(at, _)| {
            // A whole path start, not the end of a longer name.
            code[..*at]
                .chars()
                .next_back()
                .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
        })
        .filter_map(|(at, _)| {
            let rest = &code[at + prefix.len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files
}

/// The layer of `module` in `layers`, if it is declared.
fn layer_of(layers: &[&[&str]], module: &str) -> Option<usize> {
    layers.iter().position(|layer| layer.contains(&module))
}

/// The violations of `layers` among `edges` (from, to).
fn violations(layers: &[&[&str]], edges: &BTreeSet<(String, String)>) -> Vec<String> {
    let mut wrong = Vec::new();
    for (from, to) in edges {
        match (layer_of(layers, from), layer_of(layers, to)) {
            (Some(a), Some(b)) if a < b => {}
            (Some(_), Some(_)) => wrong.push(format!("{from} -> {to}: not to a lower layer")),
            (None, _) => wrong.push(format!("{from} is in no layer")),
            (_, None) => wrong.push(format!("{to} is in no layer")),
        }
    }
    wrong
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn top_level_modules_use_only_lower_layers() {
    let root = src();
    let mut edges = BTreeSet::new();
    for file in sources(&root) {
        let relative = file.strip_prefix(&root).expect("under src");
        let first = relative
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .expect("path")
            .trim_end_matches(".rs")
            .to_owned();
        if ["lib", "main", "layering"].contains(&first.as_str()) {
            continue;
        }
        let code = code_only(&std::fs::read_to_string(&file).expect("read source"));
        for to in first_segments(&code, "crate::") {
            if to != first {
                edges.insert((first.clone(), to));
            }
        }
    }
    assert!(edges.len() > 20, "too few edges read: {edges:?}");
    let wrong = violations(TOP_LEVEL, &edges);
    assert!(
        wrong.is_empty(),
        "module graph against the layers: {wrong:#?}"
    );
}

#[test]
fn store_redis_modules_use_only_lower_layers() {
    let dir = src().join("store").join("redis");
    let files = sources(&dir);
    let siblings: BTreeSet<String> = files
        .iter()
        .filter_map(|f| f.file_stem().and_then(|s| s.to_str()).map(str::to_owned))
        .filter(|name| name != "mod")
        .collect();
    let mut edges = BTreeSet::new();
    for file in &files {
        let name = file
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("name")
            .to_owned();
        if name == "mod" {
            continue;
        }
        let code = code_only(&std::fs::read_to_string(file).expect("read source"));
        let mut used = first_segments(&code, "super::");
        used.extend(first_segments(&code, "crate::store::redis::"));
        for to in used {
            if to != name && siblings.contains(&to) {
                edges.insert((name.clone(), to));
            }
        }
    }
    assert!(edges.len() > 8, "too few edges read: {edges:?}");
    let wrong = violations(STORE_REDIS, &edges);
    assert!(
        wrong.is_empty(),
        "store/redis graph against its layers: {wrong:#?}"
    );
}

#[test]
fn the_checker_sees_an_edge_up_and_skips_comments_and_strings() {
    let code =
        code_only("use crate::a; // crate::b\nlet s = \"crate::c\"; /* crate::d */ crate::e::f();");
    let found = first_segments(&code, "crate::");
    assert_eq!(found, ["a", "e"].map(String::from).into_iter().collect());
    let edges: BTreeSet<_> = [("limiter".to_owned(), "service".to_owned())].into();
    assert_eq!(violations(TOP_LEVEL, &edges).len(), 1);
}
