//! The layout's rules, held against the source (docs/design.md, "Layers"): no import
//! cycle between the crate's top-level modules, nor between the files of one module; the
//! pure core imports nothing above it and names no runtime, server or client; nothing
//! below the command line reads `cli`; every spawned task runs in a span; nothing under
//! the cache's lock calls the backend, and only listed files change the cache or list the
//! API server; no production file over 600 lines, no
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

/// Which top-level modules each top-level module names through `crate::` (a path, or
/// a `use crate::{...}` group).
fn top_level_imports() -> BTreeMap<String, BTreeSet<String>> {
    let mut imports: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, text) in production_sources() {
        let from = module_of(&rel).to_string();
        for (at, _) in text.match_indices("crate::") {
            for to in first_segments(&text[at + "crate::".len()..]) {
                if !to.is_empty() && to != from {
                    imports.entry(from.clone()).or_default().insert(to);
                }
            }
        }
    }
    imports
}

#[test]
fn no_import_cycle_between_top_level_modules() {
    let imports = top_level_imports();
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
            "controllers",
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
    // The command line is the top edge: what it configures below it is defined below
    // it (a listener's limits in `server`), never read from `cli`.
    let below_the_cli = [
        "controllers",
        "server",
        "wire",
        "admission",
        "extender",
        "backend",
        "cache",
        "quota",
        "dra",
        "placement",
        "certs",
    ];
    let wrong: Vec<_> = (below_the_cli.iter())
        .filter(|m| imports.get(**m).is_some_and(|to| to.contains("cli")))
        .collect();
    assert!(wrong.is_empty(), "{wrong:?} import cli");
}

/// The doors — the webhooks (`admission`), the extender's verbs (`extender`) — are
/// leaves: a rule one of them shares with another door, explain, the planner or a
/// controller lives below them (the quota's questions are `NamespaceQuota`'s), so no
/// module imports a verb's file. Only the HTTP layer (`server`), which routes requests
/// to them, and the wiring at the top (`serve`, `lib`, `main`) name them.
#[test]
fn no_module_imports_a_door() {
    let doors = ["admission", "extender"];
    let callers = ["server", "serve", "lib", "main"];
    for (from, to) in top_level_imports() {
        let wrong: Vec<_> = to.iter().filter(|m| doors.contains(&m.as_str())).collect();
        let allowed = callers.contains(&from.as_str()) || doors.contains(&from.as_str());
        assert!(
            allowed || wrong.is_empty(),
            "{from} imports the door(s) {wrong:?}: a rule they share belongs below them"
        );
    }
    // The scan sees a door named through a group, as `explain` once did.
    let text = "use crate::{cache::X, extender::plan::eligibility};";
    assert!(first_segments(&text["use crate::".len()..]).contains(&"extender".to_string()));
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

/// The first path segments a `use` tree names: `a::b` gives `a`, `{a::b, c, d as e}`
/// gives `a`, `c` and `d`.
fn first_segments(tree: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let Some(group) = tree.trim_start().strip_prefix('{') else {
        return vec![ident(tree)];
    };
    let mut depth = 0;
    let mut items = vec![String::new()];
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(String::new());
                continue;
            }
            _ => {}
        }
        items.last_mut().unwrap().push(c);
    }
    items.iter().map(|item| ident(item)).collect()
}

/// The names a module root re-exports, each with the child file it comes from:
/// `pub use admit::{Charge, admit};` maps `Charge` and `admit` to `admit`.
fn re_exports(root: &str, children: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for (at, _) in root.match_indices("use ") {
        let rest = &root[at + "use ".len()..];
        let child = first_segments(rest).remove(0);
        if !children.contains(&child) {
            continue;
        }
        let tree = &rest[child.len()..];
        let Some(tree) = tree.strip_prefix("::") else {
            continue;
        };
        let end = tree.find(';').unwrap_or(tree.len());
        let leaves = tree[..end]
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty() && *w != "as" && *w != "self");
        for leaf in leaves {
            names.insert(leaf.to_string(), child.clone());
        }
    }
    names
}

/// For each module that is a folder (`quota`, `cache/state`, ...), which of its files
/// name which siblings: through `super::`, the module's `crate::` path, or a name the
/// module's root (`mod.rs`, or the `.rs` beside the folder) re-exports from a sibling.
/// The root itself is left out: it declares every child.
fn sibling_imports() -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let sources = production_sources();
    let mut folders: BTreeMap<String, BTreeMap<String, &str>> = BTreeMap::new();
    for (rel, text) in &sources {
        if let Some((folder, file)) = rel.rsplit_once('/') {
            let stem = file.strip_suffix(".rs").unwrap().to_string();
            folders.entry(folder.into()).or_default().insert(stem, text);
        }
    }
    let mut graphs = BTreeMap::new();
    for (folder, files) in &folders {
        let children: BTreeSet<String> = files.keys().filter(|s| *s != "mod").cloned().collect();
        let beside = format!("{folder}.rs");
        let root = (files.get("mod").copied())
            .or_else(|| {
                sources
                    .iter()
                    .find(|(r, _)| *r == beside)
                    .map(|(_, t)| t.as_str())
            })
            .unwrap_or_default();
        let exported = re_exports(root, &children);
        let module_path = format!("crate::{}::", folder.replace('/', "::"));
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for from in &children {
            let text = files[from];
            for prefix in ["super::", module_path.as_str()] {
                for (at, _) in text.match_indices(prefix) {
                    // `super::super::` and a longer `crate::` path are not siblings.
                    if prefix == "super::" && at >= 2 && &text[at - 2..at] == "::" {
                        continue;
                    }
                    for name in first_segments(&text[at + prefix.len()..]) {
                        let to = if children.contains(&name) {
                            Some(name)
                        } else {
                            exported.get(&name).cloned()
                        };
                        if let Some(to) = to.filter(|to| to != from) {
                            graph.entry(from.clone()).or_default().insert(to);
                        }
                    }
                }
            }
        }
        graphs.insert(folder.clone(), graph);
    }
    graphs
}

/// A cycle in `graph`, as the path that closes it, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    for start in graph.keys() {
        let mut seen = BTreeSet::new();
        let mut stack = vec![vec![start.clone()]];
        while let Some(path) = stack.pop() {
            for next in graph.get(path.last().unwrap()).into_iter().flatten() {
                let mut longer = path.clone();
                longer.push(next.clone());
                if next == start {
                    return Some(longer);
                }
                if seen.insert(next.clone()) {
                    stack.push(longer);
                }
            }
        }
    }
    None
}

#[test]
fn no_import_circle_between_the_files_of_a_module() {
    let circles: Vec<String> = sibling_imports()
        .iter()
        .filter_map(|(folder, graph)| {
            Some(format!("{folder}: {}", find_cycle(graph)?.join(" -> ")))
        })
        .collect();
    assert!(
        circles.is_empty(),
        "import circles inside modules: {circles:#?}"
    );
}

#[test]
fn the_sibling_scan_sees_imports_through_groups_and_re_exports() {
    assert_eq!(
        first_segments("{admit::X, cohort, y as z}"),
        ["admit", "cohort", "y"]
    );
    assert_eq!(first_segments("charge::Costs;"), ["charge"]);
    let children: BTreeSet<String> = ["admit".into(), "charge".into()].into();
    let names = re_exports("pub use admit::{Charge, admit as decide};", &children);
    assert_eq!(names.get("Charge").map(String::as_str), Some("admit"));
    assert_eq!(names.get("decide").map(String::as_str), Some("admit"));
    let cycle: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), ["b".to_string()].into()),
        ("b".to_string(), ["a".to_string()].into()),
    ]
    .into();
    assert_eq!(find_cycle(&cycle).unwrap(), ["a", "b", "a"]);
}

/// The pure core (`placement`, `quota`, `dra`) runs no async code, serves no HTTP and
/// calls no API: it names no runtime, server or client (kube's derives and resource
/// traits for its own types are fine).
#[test]
fn the_pure_core_names_no_runtime_server_or_client() {
    let forbidden = [
        "tokio",
        "axum",
        "hyper",
        "reqwest",
        "async ",
        ".await",
        "kube::Client",
        "kube::Api",
        "kube::runtime",
        "crate::api_client",
    ];
    let found: Vec<String> = production_sources()
        .into_iter()
        .filter(|(rel, _)| ["placement", "quota", "dra"].contains(&module_of(rel)))
        .flat_map(|(rel, text)| {
            let named = forbidden.iter().filter(|word| text.contains(*word));
            named
                .map(|word| format!("{rel}: {word}"))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(found.is_empty(), "the pure core names {found:?}");
}

/// The text of the call whose argument list opens at `open` (a `(`), to its `)`.
fn call_at(text: &str, open: usize) -> &str {
    let mut depth = 0;
    for (i, c) in text[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 1 => return &text[open..open + i + 1],
            ')' => depth -= 1,
            _ => {}
        }
    }
    &text[open..]
}

/// Every task the product spawns runs in a span, so its lines can be tied to what
/// started it: a `tokio::spawn` is given an instrumented future (directly, or a
/// variable bound to one), and a blocking task or a thread (`std::thread::spawn`, a
/// scoped one) enters a span.
#[test]
fn every_spawned_task_runs_in_a_span() {
    let mut bare = Vec::new();
    for (rel, text) in production_sources() {
        for (at, call) in text.match_indices("tokio::spawn(") {
            let argument = call_at(&text, at + call.len() - 1);
            let name = argument.trim_matches(|c| c == '(' || c == ')').trim();
            let bound = format!("let {name} =");
            let instrumented = argument.contains("instrument")
                || text
                    .split(';')
                    .any(|s| s.contains(&bound) && s.contains(".instrument("));
            if !instrumented {
                bare.push(format!("{rel}: tokio::spawn{argument}"));
            }
        }
        for spawn in ["spawn_blocking(", "thread::spawn(", "scope.spawn("] {
            for (at, call) in text.match_indices(spawn) {
                let argument = call_at(&text, at + call.len() - 1);
                if !argument.contains("in_scope") {
                    bare.push(format!("{rel}: {spawn}{argument}"));
                }
            }
        }
    }
    assert!(bare.is_empty(), "spawned outside a span: {bare:#?}");
}

/// The cache's lock is held for state only: nothing under it calls the backend (the
/// run mode's writes and reads of the API server), whose calls may wait, nor hands the
/// backend to a function that could.
#[test]
fn no_backend_call_runs_under_the_cache_lock() {
    let mut under = Vec::new();
    for (rel, text) in production_sources() {
        for (door, closure) in cache_doors(&text) {
            under.extend(backend_uses(closure).map(|use_| format!("{rel}: {use_} under {door}")));
        }
    }
    assert!(under.is_empty(), "{under:#?}");
}

/// The files outside the cache that may change it, and why: the watch is inside it.
/// The files that hold the cache's writer (`CacheWriter`, from `Backend::writer` or a
/// constructor), besides the cache's own: each records what it decided or wrote.
const WRITERS: [(&str, &str); 9] = [
    (
        "backend/mod.rs",
        "offline charges and admissions join the cache",
    ),
    ("backend/quota_writer.rs", "quotas it wrote or read fresh"),
    ("backend/grants.rs", "quotas its keeper wrote"),
    (
        "controllers/reconcile.rs",
        "quotas it wrote; deletions past their grace",
    ),
    ("controllers/release.rs", "quotas it read fresh to decide"),
    ("controllers/mod.rs", "hands the reconciler its writer"),
    (
        "extender/plan.rs",
        "the placement transaction: hold, record, roll back",
    ),
    ("extender/bind.rs", "a bound pod"),
    (
        "snapshot/mod.rs",
        "fills a snapshot's own cache, then keeps only its reader",
    ),
];

/// Only a `CacheWriter` changes the cache (the compiler holds the rest to its reader's
/// door); these are the files that name one, or take it from the backend.
#[test]
fn only_the_listed_files_hold_the_cache_writer() {
    let mut writers = BTreeSet::new();
    for (rel, text) in production_sources() {
        let holds = text.contains("CacheWriter") || text.contains(".writer()");
        if holds && !rel.starts_with("cache/") {
            writers.insert(rel);
        }
    }
    let listed: BTreeSet<String> = WRITERS.iter().map(|(f, _)| f.to_string()).collect();
    assert_eq!(writers, listed, "files that hold the cache's writer");
}

/// What lists the API server, and why it is not a cost per pass: the command-line
/// tools' one reading of the cluster, and the quota writer's fresh read of quotas when a
/// write conflicts (or a cohort's members must agree). The cache and the planner's world
/// are kept by watches, which list once and then follow.
const LISTERS: [(&str, &str); 2] = [
    (
        "snapshot/source.rs",
        "`explain`/`defrag --kubeconfig`: one listing a command",
    ),
    (
        "backend/quota_writer.rs",
        "a charge read fresh after a conflict",
    ),
];

#[test]
fn only_the_listed_files_list_the_api_server() {
    let call = regex::Regex::new(r"\.list\(\s*&").unwrap();
    let listing: BTreeSet<String> = production_sources()
        .into_iter()
        .filter(|(_, text)| call.is_match(text))
        .map(|(rel, _)| rel)
        .collect();
    let listed: BTreeSet<String> = LISTERS.iter().map(|(f, _)| f.to_string()).collect();
    assert_eq!(listing, listed, "files that list from the API server");
    assert!(
        call.is_match("api\n    .list(&ListParams::default())"),
        "the scan sees a call"
    );
}

/// The calls of the cache's doors in `text` (`cache.read(..)`, `self.cache().write(..)`),
/// each with its argument.
fn cache_doors(text: &str) -> impl Iterator<Item = (&'static str, &str)> + '_ {
    let doors = regex::Regex::new(r"(cache|writer)(\(\))?\)?\s*\.(read|write)\(").unwrap();
    let calls: Vec<_> = doors
        .captures_iter(text)
        .map(|c| {
            let call = c.get(0).unwrap();
            let door = if &c[3] == "read" { "read" } else { "write" };
            (door, call_at(text, call.end() - 1))
        })
        .collect();
    calls.into_iter()
}

/// Every mention of a `backend` in `text` but reaching for its cache: a call on it, or
/// the backend passed on.
fn backend_uses(text: &str) -> impl Iterator<Item = String> + '_ {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices("backend").filter_map(move |(at, _)| {
        let before = text[..at].chars().next_back();
        let after: String = text[at + "backend".len()..]
            .chars()
            .take_while(|c| word(*c) || *c == '.')
            .collect();
        let whole = before.is_none_or(|c| !word(c)) && !after.starts_with(|c: char| word(c));
        (whole && after != ".cache").then(|| format!("backend{after}"))
    })
}

#[test]
fn the_span_and_lock_scans_see_what_they_must() {
    let text = "cache.write(|s| { backend.charge(s); f(g(x)) }); backend.cache()\n  .read(|s| 1); \
                (backend.writer()).write(|s| 2)";
    assert_eq!(call_at(text, 11), "(|s| { backend.charge(s); f(g(x)) })");
    let doors: Vec<_> = cache_doors(text).collect();
    assert_eq!(
        doors,
        [
            ("write", "(|s| { backend.charge(s); f(g(x)) })"),
            ("read", "(|s| 1)"),
            ("write", "(|s| 2)")
        ]
    );
    let closure = "(|s| { eligibility(backend, s); self.backend.cache(); backends })";
    assert_eq!(backend_uses(closure).collect::<Vec<_>>(), ["backend"]);
}

/// Private by default: a `pub fn` is the library's interface to its binary, the tests,
/// benches, examples and fuzz harness; at most a tenth of them may go unnamed there
/// (one whose name nothing outside `src/` writes is a `pub(crate)` not yet said).
#[test]
fn most_pub_fns_are_named_outside_the_library() {
    let mut outside = std::fs::read_to_string(repo::path("src/main.rs")).unwrap();
    for dir in ["tests", "benches", "examples", "fuzz"] {
        let mut files = Vec::new();
        let dir = repo::path(dir);
        if Path::new(&dir).is_dir() {
            collect(Path::new(&dir), &mut files);
        }
        for file in files {
            outside += &std::fs::read_to_string(file).unwrap();
        }
    }
    let word = regex::Regex::new(r"\bpub (?:const |async )?fn (\w+)").unwrap();
    let mut names = Vec::new();
    for (rel, text) in production_sources() {
        for name in word.captures_iter(&text).map(|c| c[1].to_string()) {
            names.push((rel.clone(), name));
        }
    }
    let named = |name: &str| {
        let whole = regex::Regex::new(&format!(r"\b{name}\b")).unwrap();
        whole.is_match(&outside)
    };
    let unnamed: Vec<_> = names.iter().filter(|(_, n)| !named(n)).collect();
    assert!(
        unnamed.len() * 10 <= names.len(),
        "{} of {} pub fns are named nowhere outside src/: {unnamed:?}",
        unnamed.len(),
        names.len()
    );
}
