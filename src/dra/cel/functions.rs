//! Kubernetes' quantity and semver functions, on our representations of them:
//! quantities are integers (thousandths), versions strings. Declared once in the
//! environment, so an evaluation builds no function table of its own.

use std::cmp::Ordering;

use cel::common::types::{CelBool, CelDouble, CelInt, CelString};
use cel::{DeclarationError, Env, ExecutionError};

use crate::placement::quantity::Milli;

/// Declare the functions on `env`.
pub(super) fn declare(env: &mut Env) -> Result<(), DeclarationError> {
    cel::add_overload!(env, fn quantity: (CelString) -> Result<CelInt>)?;
    cel::add_overload!(env, fn is_quantity: (CelString) -> CelBool)?;
    cel::add_overload!(env, fn semver: (CelString) -> Result<CelString>)?;
    cel::add_overload!(env, fn is_semver: (CelString) -> CelBool)?;
    cel::add_member_overload!(env, fn compare_quantities: (CelInt, CelInt) -> CelInt,
        name = "compareTo")?;
    cel::add_member_overload!(env, fn compare_versions: (CelString, CelString) -> Result<CelInt>,
        name = "compareTo")?;
    cel::add_member_overload!(env, fn greater_quantity: (CelInt, CelInt) -> CelBool,
        name = "isGreaterThan")?;
    cel::add_member_overload!(env, fn greater_version: (CelString, CelString) -> Result<CelBool>,
        name = "isGreaterThan")?;
    cel::add_member_overload!(env, fn less_quantity: (CelInt, CelInt) -> CelBool,
        name = "isLessThan")?;
    cel::add_member_overload!(env, fn less_version: (CelString, CelString) -> Result<CelBool>,
        name = "isLessThan")?;
    cel::add_member_overload!(env, fn as_integer: (CelInt) -> CelInt)?;
    cel::add_member_overload!(env, fn is_integer: (CelInt) -> CelBool)?;
    cel::add_member_overload!(env, fn as_approximate_float: (CelInt) -> CelDouble)?;
    cel::add_member_overload!(env, fn sign: (CelInt) -> CelInt)?;
    cel::add_member_overload!(env, fn major: (CelString) -> Result<CelInt>)?;
    cel::add_member_overload!(env, fn minor: (CelString) -> Result<CelInt>)?;
    cel::add_member_overload!(env, fn patch: (CelString) -> Result<CelInt>)?;
    Ok(())
}

fn quantity(text: &CelString) -> Result<CelInt, ExecutionError> {
    let milli = parse_milli(text.inner())
        .ok_or_else(|| ExecutionError::function_error("quantity", "not a quantity"))?;
    Ok(CelInt::from(milli))
}

fn is_quantity(text: &CelString) -> CelBool {
    CelBool::from(parse_milli(text.inner()).is_some())
}

fn parse_milli(text: &str) -> Option<i64> {
    i64::try_from(Milli::parse(text).ok()?.0).ok()
}

fn semver(text: &CelString) -> Result<CelString<'static>, ExecutionError> {
    version(text)?;
    Ok(CelString::from(text.inner().to_string()))
}

fn is_semver(text: &CelString) -> CelBool {
    CelBool::from(Version::parse(text.inner()).is_some())
}

fn version(text: &CelString) -> Result<Version, ExecutionError> {
    Version::parse(text.inner())
        .ok_or_else(|| ExecutionError::function_error("semver", "not a semantic version"))
}

fn order(a: &CelString, b: &CelString) -> Result<Ordering, ExecutionError> {
    Ok(version(a)?.cmp(&version(b)?))
}

fn compare_quantities(a: &CelInt, b: &CelInt) -> CelInt {
    CelInt::from(a.inner().cmp(b.inner()) as i64)
}

fn compare_versions(a: &CelString, b: &CelString) -> Result<CelInt, ExecutionError> {
    Ok(CelInt::from(order(a, b)? as i64))
}

fn greater_quantity(a: &CelInt, b: &CelInt) -> CelBool {
    CelBool::from(a.inner() > b.inner())
}

fn greater_version(a: &CelString, b: &CelString) -> Result<CelBool, ExecutionError> {
    Ok(CelBool::from(order(a, b)? == Ordering::Greater))
}

fn less_quantity(a: &CelInt, b: &CelInt) -> CelBool {
    CelBool::from(a.inner() < b.inner())
}

fn less_version(a: &CelString, b: &CelString) -> Result<CelBool, ExecutionError> {
    Ok(CelBool::from(order(a, b)? == Ordering::Less))
}

fn as_integer(milli: &CelInt) -> CelInt {
    CelInt::from(milli.inner() / 1000)
}

fn is_integer(milli: &CelInt) -> CelBool {
    CelBool::from(milli.inner() % 1000 == 0)
}

fn as_approximate_float(milli: &CelInt) -> CelDouble {
    CelDouble::from(*milli.inner() as f64 / 1000.0)
}

fn sign(milli: &CelInt) -> CelInt {
    CelInt::from(milli.inner().signum())
}

fn major(v: &CelString) -> Result<CelInt, ExecutionError> {
    Ok(CelInt::from(version(v)?.numbers[0] as i64))
}

fn minor(v: &CelString) -> Result<CelInt, ExecutionError> {
    Ok(CelInt::from(version(v)?.numbers[1] as i64))
}

fn patch(v: &CelString) -> Result<CelInt, ExecutionError> {
    Ok(CelInt::from(version(v)?.numbers[2] as i64))
}

/// `major.minor.patch[-pre][+build]`; a pre-release sorts before its release.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Version {
    numbers: [u64; 3],
    pre: Option<String>,
}

impl Version {
    pub(super) fn parse(text: &str) -> Option<Version> {
        let text = text.split_once('+').map_or(text, |(v, _)| v);
        let (core, pre) = match text.split_once('-') {
            Some((core, pre)) if !pre.is_empty() => (core, Some(pre.to_string())),
            Some(_) => return None,
            None => (text, None),
        };
        let mut numbers = [0u64; 3];
        let mut parts = core.split('.');
        for number in &mut numbers {
            let part = parts.next()?;
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            *number = part.parse().ok()?;
        }
        parts.next().is_none().then_some(Version { numbers, pre })
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        let pre = match (&self.pre, &other.pre) {
            (None, None) => Ordering::Equal,
            (None, Some(_)) => Ordering::Greater,
            (Some(_), None) => Ordering::Less,
            (Some(a), Some(b)) => a.cmp(b),
        };
        self.numbers.cmp(&other.numbers).then(pre)
    }
}
