//! `matches` (docs/devices.md, "Bounds"): regular expressions are string literals,
//! compiled when their selector is, once per claim, within a size limit, and priced.
//! The interpreter's own `matches` compiled its pattern on every call (a Unicode
//! `\w+` takes some 300 µs), so ours looks the compiled pattern up instead, and
//! charges the match by the lengths of its input and pattern.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use cel::common::types::{CelBool, CelString};
use cel::{DeclarationError, Env, ExecutionError};
use regex::{Regex, RegexBuilder};

use super::meter;

/// Most program size of a regular expression (the regex crate's limit, in bytes):
/// Unicode `\w+` fits, `\w{1,200}` does not. Compiling, or refusing, a pattern within
/// it took at most 0.8 ms (docs/benchmarks.md).
pub(super) const REGEX_SIZE: usize = 64 * 1024;
/// Most memory one pattern's lazy DFA may use while matching.
const REGEX_DFA_SIZE: usize = 256 * 1024;
/// What compiling a pattern costs the claim's budget, whatever the pattern: about the
/// longest a compile within [`REGEX_SIZE`] takes.
pub(super) const COMPILE_PRICE: u64 = 20_000;

/// Why a pattern cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Refused;

/// Compiled patterns by their text.
pub(super) type Patterns = HashMap<Box<str>, Arc<Regex>>;

/// `text` compiled within the limits.
pub(super) fn compile(text: &str) -> Result<Arc<Regex>, Refused> {
    RegexBuilder::new(text)
        .size_limit(REGEX_SIZE)
        .dfa_size_limit(REGEX_DFA_SIZE)
        .build()
        .map(Arc::new)
        .map_err(|_| Refused)
}

thread_local! {
    /// The patterns of the selector being evaluated on this thread.
    static CURRENT: RefCell<Option<Arc<Patterns>>> = const { RefCell::new(None) };
}

/// Run `evaluate` with `patterns` as the ones `matches` may use.
pub(super) fn with_patterns<T>(patterns: &Arc<Patterns>, evaluate: impl FnOnce() -> T) -> T {
    let outer = CURRENT.replace(Some(patterns.clone()));
    let result = evaluate();
    CURRENT.set(outer);
    result
}

/// What matching `input` bytes against `pattern` costs: the regex crate's worst case
/// grows with both (Kubernetes prices it the same way).
fn match_price(input: usize, pattern: usize) -> u64 {
    let (input, pattern) = (input as u64, pattern as u64);
    1 + (input + 1).saturating_mul(pattern + 8) / 64
}

/// Declare `matches`, both forms, on `env` (the `cel` crate is built without its own).
pub(super) fn declare(env: &mut Env) -> Result<(), DeclarationError> {
    cel::add_overload!(env, fn matches: (CelString, CelString) -> Result<CelBool>,
        id = "matches")?;
    cel::add_member_overload!(env, fn matches: (CelString, CelString) -> Result<CelBool>)?;
    Ok(())
}

fn matches(input: &CelString, pattern: &CelString) -> Result<CelBool, ExecutionError> {
    let (input, pattern) = (input.inner(), pattern.inner());
    let compiled = CURRENT.with_borrow(|current| current.as_ref()?.get(pattern).cloned());
    let compiled = compiled
        .ok_or_else(|| ExecutionError::function_error("matches", "pattern not compiled"))?;
    meter::charge(match_price(input.len(), pattern.len()))?;
    Ok(CelBool::from(compiled.is_match(input)))
}
