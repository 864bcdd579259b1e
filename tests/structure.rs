//! The layout's rules, held against the source (docs/design.md, "Layers"): no import
//! cycle between the crate's top-level modules, no production file over 600 lines, no
//! `Result<_, String>` in production code, and serde visitors only in `wire/`.
#![allow(clippy::unwrap_used)]

mod repo;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 600;

/// Every `.rs` file under `src/`, with its production text: comments, and test
/// modules declared inline, left out. Test-only files are left out whole.
fn production_sources() -> Vec<(String, String)> {
    let mut files = Vec::new();
    collect(Path::new(&repo::path("src")), &mut files);
    files
        .into_iter()
        .filter(|path| !is_test_file(path))
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let rel = path
                .to_string_lossy()
                .split("/src/")
                .last()
                .unwrap()
                .to_string();
            (rel, production_text(&text))
        })
        .collect()
}

fn collect(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

fn is_test_file(path: &Path) -> bool {
    let name = path.file_name().unwrap().to_string_lossy();
    name.ends_with("_tests.rs") || name == "tests.rs" || name == "testing.rs"
}

/// The text up to an inline `#[cfg(test)] mod tests`, without comment lines.
fn production_text(text: &str) -> String {
    let end = text.find("#[cfg(test)]\nmod tests {").unwrap_or(text.len());
    text[..end]
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level module a file under `src/` belongs to (`main` and `lib` are roots).
fn module_of(rel: &str) -> &str {
    let first = rel.split('/').next().unwrap();
    first.strip_suffix(".rs").unwrap_or(first)
}

#[test]
fn no_import_cycle_between_top_level_modules() {
    let mut imports: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, text) in production_sources() {
        let from = module_of(&rel).to_string();
        for (at, _) in text.match_indices("crate::") {
            let rest = &text[at + "crate::".len()..];
            let to: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !to.is_empty() && to != from {
                imports.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    // A cycle exists iff some module reaches itself.
    for start in imports.keys() {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<(String, Vec<String>)> = vec![(start.clone(), vec![start.clone()])];
        while let Some((module, path)) = stack.pop() {
            for next in imports.get(&module).into_iter().flatten() {
                assert!(
                    next != start,
                    "import cycle: {} -> {start}",
                    path.join(" -> ")
                );
                if seen.insert(next.clone()) {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    stack.push((next.clone(), longer));
                }
            }
        }
    }
    // The layering docs/design.md draws: the pure core imports nothing above it.
    for core in ["placement", "quota", "dra"] {
        let above = [
            "cache",
            "backend",
            "admission",
            "extender",
            "server",
            "serve",
        ];
        let wrong: Vec<_> = imports
            .get(core)
            .into_iter()
            .flatten()
            .filter(|m| above.contains(&m.as_str()))
            .collect();
        assert!(wrong.is_empty(), "{core} imports {wrong:?}");
    }
}

#[test]
fn no_production_file_is_over_600_lines() {
    let mut long = Vec::new();
    collect_long(Path::new(&repo::path("src")), &mut long);
    assert!(long.is_empty(), "over {MAX_LINES} lines: {long:?}");
}

fn collect_long(dir: &Path, long: &mut Vec<String>) {
    let mut files = Vec::new();
    collect(dir, &mut files);
    for path in files.iter().filter(|p| !is_test_file(p)) {
        let text = std::fs::read_to_string(path).unwrap();
        let end = text.find("#[cfg(test)]\nmod tests {").unwrap_or(text.len());
        let lines = text[..end].lines().count();
        if lines > MAX_LINES {
            long.push(format!("{} ({lines})", path.display()));
        }
    }
}

#[test]
fn production_errors_are_typed_not_strings() {
    let stringly: Vec<String> = production_sources()
        .into_iter()
        .filter(|(_, text)| {
            let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
            flat.contains(", String>")
                && flat.contains("Result<")
                && flat
                    .match_indices("Result<")
                    .any(|(at, _)| result_error_is_string(&flat[at..]))
        })
        .map(|(rel, _)| rel)
        .collect();
    assert!(stringly.is_empty(), "Result<_, String> in {stringly:?}");
}

/// Whether the `Result<...>` at the start of `text` has `String` as its error type.
fn result_error_is_string(text: &str) -> bool {
    let mut depth = 0;
    let mut last_comma = None;
    for (i, c) in text.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => {
                depth -= 1;
                if depth == 0 {
                    let error = &text[last_comma.map_or(0, |c| c + 1)..i];
                    return last_comma.is_some() && error.trim() == "String";
                }
            }
            ',' if depth == 1 => last_comma = Some(i),
            _ => {}
        }
    }
    false
}

#[test]
fn serde_visitors_live_in_wire() {
    let outside: Vec<String> = production_sources()
        .into_iter()
        .filter(|(rel, text)| !rel.starts_with("wire/") && text.contains("Visitor<'de>"))
        .map(|(rel, _)| rel)
        .collect();
    assert!(
        outside.is_empty(),
        "serde visitors outside wire/: {outside:?}"
    );
}

#[test]
fn the_string_result_check_sees_what_it_must() {
    assert!(result_error_is_string("Result<Vec<(u8, u8)>, String>"));
    assert!(!result_error_is_string("Result<Vec<(u8, String)>, Error>"));
    assert!(!result_error_is_string("Result<String, Error>"));
}
