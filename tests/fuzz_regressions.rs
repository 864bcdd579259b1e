//! The fuzz targets' inputs, replayed on stable in CI (docs/fuzzing.md): every file under
//! `fuzz/seeds/<target>/` and `fuzz/regressions/<target>/` goes through the same calls
//! as the target (`fuzz/src/harness.rs`, compiled here by path) and must not panic.
//!
//! `pod_annotations` inputs are in `arbitrary`'s byte format, which only the fuzz crate
//! can decode; there the test replays each one's `<name>.pod.json` twin (the pod the
//! target built from it, written with `FUZZ_DUMP_POD`) and requires that twin to exist.
#![allow(clippy::unwrap_used)]

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;

#[path = "../fuzz/src/harness.rs"]
#[allow(dead_code)]
mod harness;
mod repo;

/// What one input file is fed to.
enum Input {
    Bytes(fn(&[u8])),
    Pod,
}

fn input(target: &str) -> Input {
    match target {
        "extender_args" => Input::Bytes(harness::extender_args),
        "volcano_predicate" => Input::Bytes(harness::volcano_predicate),
        "admission_review" => Input::Bytes(harness::admission_review),
        "quantity" => Input::Bytes(harness::quantity),
        "config" => Input::Bytes(harness::config),
        "pod_cost" => Input::Bytes(harness::pod_cost),
        "cel_selector" => Input::Bytes(harness::cel_selector),
        "pod_annotations" => Input::Pod,
        other => panic!("no such fuzz target {other:?}"),
    }
}

/// The files of `fuzz/<kind>/<target>/` (none when the directory does not exist).
fn files(kind: &str, target: &str) -> Vec<PathBuf> {
    let dir = PathBuf::from(repo::path(&format!("fuzz/{kind}/{target}")));
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

fn file_name(path: &Path) -> &str {
    path.file_name().unwrap().to_str().unwrap()
}

/// Feed one file to its target; `Err` with the panic message if it panicked.
fn replay(target: &str, path: &Path) -> Result<(), String> {
    let data = std::fs::read(path).unwrap();
    let run = || match input(target) {
        Input::Bytes(check) => check(&data),
        Input::Pod => {
            let pod: Pod = serde_json::from_slice(&data)
                .unwrap_or_else(|e| panic!("{} is not a Pod: {e}", path.display()));
            harness::pod_annotations(&pod);
        }
    };
    catch_unwind(AssertUnwindSafe(run)).map_err(|panic| {
        panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "(non-string panic)".into())
    })
}

/// The files of `kind` to replay for `target`: for `pod_annotations` the `.pod.json`
/// twins (checking every raw input has one), else every file.
fn replayable(kind: &str, target: &str) -> Vec<PathBuf> {
    let all = files(kind, target);
    if target != "pod_annotations" {
        return all;
    }
    let (pods, raw): (Vec<PathBuf>, Vec<PathBuf>) = all
        .into_iter()
        .partition(|p| file_name(p).ends_with(".pod.json"));
    for raw in raw {
        let twin = raw.with_file_name(format!("{}.pod.json", file_name(&raw)));
        assert!(
            twin.is_file(),
            "{} has no {} (FUZZ_DUMP_POD, see docs/fuzzing.md)",
            raw.display(),
            file_name(&twin)
        );
    }
    pods
}

#[test]
fn seeds_do_not_panic() {
    let mut failures = Vec::new();
    for target in harness::TARGETS {
        let seeds = replayable("seeds", target);
        assert!(!seeds.is_empty(), "fuzz/seeds/{target}/ has no inputs");
        for path in seeds {
            if let Err(message) = replay(target, &path) {
                failures.push(format!("{}: {message}", path.display()));
            }
        }
    }
    assert!(failures.is_empty(), "panics:\n{}", failures.join("\n"));
}

#[test]
fn regressions_do_not_panic() {
    let mut failures = Vec::new();
    for target in harness::TARGETS {
        for path in replayable("regressions", target) {
            if let Err(message) = replay(target, &path) {
                failures.push(format!("{}: {message}", path.display()));
            }
        }
    }
    assert!(failures.is_empty(), "panics:\n{}", failures.join("\n"));
}

#[test]
fn every_target_has_a_seed_directory_and_nothing_else_is_there() {
    for kind in ["seeds", "regressions"] {
        let dir = PathBuf::from(repo::path(&format!("fuzz/{kind}")));
        let Ok(entries) = std::fs::read_dir(&dir) else {
            assert_eq!(kind, "regressions", "fuzz/seeds is missing");
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            let name = file_name(&path);
            if name.starts_with('.') {
                continue;
            }
            assert!(
                path.is_dir() && harness::TARGETS.contains(&name),
                "{} is not a fuzz target's directory",
                path.display()
            );
        }
    }
}
