//! DRA's CEL selectors, evaluated (docs/devices.md): which devices a request's and its
//! DeviceClass's selectors match decides the model a claim is charged for. Evaluated by
//! a real CEL implementation (the `cel` crate) with Kubernetes' device environment:
//! `device.driver`, `device.attributes["<domain>"].<name>` (strings, integers, booleans,
//! versions) and `device.capacity["<domain>"].<name>` (quantities). An expression that
//! fails on a device (a missing attribute, a type error) does not match it, as the
//! scheduler never allocates a device its selector cannot evaluate.
//!
//! A tenant writes these expressions, so every one is bounded before it runs: its
//! length (Kubernetes' own limit), its nesting, a cost worked out from its syntax tree
//! (comprehensions cost their range times their body and do not nest; regular
//! expressions are literals that compile small), and each claim's evaluations share
//! one [`Budget`].

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue};
use cel::extractors::This;
use cel::objects::Key;
use cel::{Context, Env, ExecutionError, Program, Value};

use crate::placement::quantity::Milli;

/// Kubernetes' `CELSelectorExpressionMaxLength`: the API server refuses longer ones.
pub const MAX_EXPRESSION_BYTES: usize = 10 * 1024;
/// Deepest nesting of brackets and conditionals (the parser recurses per level, a few
/// dozen frames each: 24 levels overflow a 2 MiB thread stack in a debug build).
const MAX_NESTING: usize = 8;
/// Most operators, member selections, indexings and calls in one expression (the parser
/// nests a chain of any of them one level deeper per link).
const MAX_OPERATORS: usize = 128;
/// Most syntax-tree cost units one expression may need per device.
pub const MAX_COST: u64 = 10_000;
/// What a comprehension over a device's attribute map may iterate at most.
const MAP_RANGE: u64 = 64;
/// Most program size of a regular expression (the regex crate's limit, in bytes).
const REGEX_SIZE: usize = 64 * 1024;
/// Most cost units one claim's selectors may spend over all devices.
pub const CLAIM_BUDGET: u64 = 600_000;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CelError {
    #[error("is longer than {MAX_EXPRESSION_BYTES} bytes")]
    TooLong,
    #[error(
        "nests deeper than {MAX_NESTING} levels or chains more than {MAX_OPERATORS} operators, selections and calls"
    )]
    TooDeep,
    #[error("does not parse as CEL: {0}")]
    Parse(String),
    #[error("costs more than {MAX_COST} to evaluate on one device")]
    TooCostly,
    #[error("nests a comprehension in another")]
    NestedComprehension,
    #[error("matches a pattern that is not a string literal compiling within {REGEX_SIZE} bytes")]
    Pattern,
}

/// A selector compiled and found within bounds.
#[derive(Debug)]
pub struct Selector {
    program: Program,
    cost: u64,
}

/// What one claim's evaluations may still spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget(pub u64);

impl Default for Budget {
    fn default() -> Self {
        Budget(CLAIM_BUDGET)
    }
}

/// The claim's evaluations spent their budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the claim's CEL selectors cost more than {CLAIM_BUDGET} to evaluate against the cluster's devices"
)]
pub struct OverBudget;

impl Budget {
    fn spend(&mut self, cost: u64) -> Result<(), OverBudget> {
        self.0 = self.0.checked_sub(cost).ok_or(OverBudget)?;
        Ok(())
    }
}

impl Selector {
    /// Compile `expression`, charging its parsing to `budget` (by its length).
    pub fn compile_within(
        expression: &str,
        budget: &mut Budget,
    ) -> Result<Result<Self, CelError>, OverBudget> {
        budget.spend(1 + expression.len() as u64 / 8)?;
        Ok(Self::compile(expression))
    }

    pub fn compile(expression: &str) -> Result<Self, CelError> {
        if expression.len() > MAX_EXPRESSION_BYTES {
            return Err(CelError::TooLong);
        }
        check_shape(expression)?;
        let program = env()
            .compile(expression)
            .map_err(|e| CelError::Parse(first_line(&e.to_string())))?;
        let cost = cost(program.expression(), false)?;
        if cost > MAX_COST {
            return Err(CelError::TooCostly);
        }
        Ok(Selector { program, cost })
    }

    /// Whether the selector matches `device` (an evaluation error or a non-boolean
    /// result does not), charged to `budget`.
    pub fn matches(&self, device: &CelDevice, budget: &mut Budget) -> Result<bool, OverBudget> {
        budget.spend(self.cost)?;
        Ok(self.evaluate(device) == Some(true))
    }

    /// The selector's value on `device`: `None` when it fails or is not a boolean.
    pub fn evaluate(&self, device: &CelDevice) -> Option<bool> {
        let mut context = Context::with_env(env_arc());
        add_functions(&mut context);
        context.add_variable_from_value("device", device.value.clone());
        match self.program.execute(&context) {
            Ok(Value::Bool(matched)) => Some(matched),
            _ => None,
        }
    }
}

fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    line.chars().take(200).collect()
}

fn env_arc() -> Arc<Env> {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    ENV.get_or_init(|| Arc::new(Env::stdlib())).clone()
}

fn env() -> &'static Env {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    ENV.get_or_init(env_arc)
}

/// Refuse, before parsing, what would make the parser recurse deeply: nested
/// brackets and conditionals, long chains of binary operators (outside string
/// literals, roughly: a quote toggles).
fn check_shape(expression: &str) -> Result<(), CelError> {
    let (mut depth, mut deepest, mut conditionals, mut operators) = (0usize, 0usize, 0, 0);
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for c in expression.chars() {
        if let Some(q) = quote {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                _ if c == q => quote = None,
                _ => {}
            }
            continue;
        }
        match c {
            '"' | '\'' => quote = Some(c),
            '(' | '[' | '{' => {
                depth += 1;
                deepest = deepest.max(depth);
                operators += 1;
            }
            '.' => operators += 1,
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            '?' => conditionals += 1,
            '+' | '-' | '*' | '/' | '%' | '<' | '>' | '=' | '!' => operators += 1,
            _ => {}
        }
    }
    if deepest + conditionals > MAX_NESTING || operators > MAX_OPERATORS {
        return Err(CelError::TooDeep);
    }
    Ok(())
}

/// The cost of evaluating `expr` once: one per node, a comprehension its range's
/// (estimated) size times its body, a regular expression its pattern's size.
fn cost(expr: &IdedExpr, in_comprehension: bool) -> Result<u64, CelError> {
    let sum = |exprs: &mut dyn Iterator<Item = &IdedExpr>| -> Result<u64, CelError> {
        let mut total = 0u64;
        for e in exprs {
            total = total.saturating_add(cost(e, in_comprehension)?);
        }
        Ok(total)
    };
    let own = match &expr.expr {
        Expr::Comprehension(c) => {
            if in_comprehension {
                return Err(CelError::NestedComprehension);
            }
            let range = cost(&c.iter_range, false)?;
            let size = range_size(&c.iter_range);
            let body = [&c.accu_init, &c.loop_cond, &c.loop_step]
                .into_iter()
                .try_fold(0u64, |t, e| {
                    Ok::<_, CelError>(t.saturating_add(cost(e, true)?))
                })?;
            let result = cost(&c.result, true)?;
            // The accumulator of `map`/`filter` is copied at each step.
            let per_item = body.saturating_add(size);
            range
                .saturating_add(size.saturating_add(1).saturating_mul(per_item))
                .saturating_add(result)
        }
        Expr::Call(call) => {
            let pattern = match call.func_name.as_str() {
                "matches" => Some(pattern_cost(call.args.last())?),
                _ => None,
            };
            let target = call.target.as_deref().into_iter();
            let children = sum(&mut target.chain(call.args.iter()))?;
            children.saturating_add(pattern.unwrap_or(0))
        }
        Expr::List(list) => sum(&mut list.elements.iter())?,
        Expr::Map(map) => sum(&mut map.entries.iter().flat_map(entry_exprs))?,
        Expr::Struct(s) => sum(&mut s.entries.iter().flat_map(entry_exprs))?,
        Expr::Select(select) => cost(&select.operand, in_comprehension)?,
        Expr::Literal(LiteralValue::String(s)) => (s.len() as u64) / 64,
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => 0,
    };
    Ok(own.saturating_add(1))
}

fn entry_exprs(entry: &cel::common::ast::IdedEntryExpr) -> Vec<&IdedExpr> {
    match &entry.expr {
        EntryExpr::MapEntry(e) => vec![&e.key, &e.value],
        EntryExpr::StructField(f) => vec![&f.value],
    }
}

/// At most how many items `range` can have: a literal list its elements, anything
/// else (a device's attribute map, a list built by concatenation) its size in nodes or
/// the most attributes a device has.
fn range_size(range: &IdedExpr) -> u64 {
    match &range.expr {
        Expr::List(list) => list.elements.len() as u64,
        _ => nodes(range).max(MAP_RANGE),
    }
}

fn nodes(expr: &IdedExpr) -> u64 {
    cost(expr, false).unwrap_or(u64::MAX)
}

/// A `matches` pattern: a string literal compiling small, costing its length.
fn pattern_cost(pattern: Option<&IdedExpr>) -> Result<u64, CelError> {
    let Some(Expr::Literal(LiteralValue::String(text))) = pattern.map(|p| &p.expr) else {
        return Err(CelError::Pattern);
    };
    let text: &str = text.inner();
    regex::RegexBuilder::new(text)
        .size_limit(REGEX_SIZE)
        .build()
        .map_err(|_| CelError::Pattern)?;
    Ok(20 + text.len() as u64)
}

/// One device as a selector sees it (`device` in the expression).
#[derive(Debug, Clone)]
pub struct CelDevice {
    value: Value,
    /// A hash of what a selector can see: equal devices have equal ones.
    pub fingerprint: u64,
}

impl PartialEq for CelDevice {
    fn eq(&self, other: &Self) -> bool {
        self.fingerprint == other.fingerprint && self.value == other.value
    }
}

/// A device attribute's value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AttributeValue {
    String(String),
    Int(i64),
    Bool(bool),
    /// A semantic version, compared with `semver(...)`.
    Version(String),
}

impl CelDevice {
    /// `attributes` and `capacity` by domain, then name; capacity in thousandths.
    pub fn new(
        driver: &str,
        attributes: &BTreeMap<String, BTreeMap<String, AttributeValue>>,
        capacity: &BTreeMap<String, BTreeMap<String, Milli>>,
    ) -> Self {
        let fingerprint = {
            use std::hash::{Hash, Hasher};
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            (driver, attributes).hash(&mut hasher);
            for (domain, names) in capacity {
                domain.hash(&mut hasher);
                names.iter().for_each(|(n, q)| (n, q.0).hash(&mut hasher));
            }
            hasher.finish()
        };
        let attributes = attributes.iter().map(|(domain, names)| {
            let values = names.iter().map(|(name, value)| {
                let value = match value {
                    AttributeValue::String(s) | AttributeValue::Version(s) => {
                        Value::from(s.as_str())
                    }
                    AttributeValue::Int(i) => Value::Int(*i),
                    AttributeValue::Bool(b) => Value::Bool(*b),
                };
                (Key::from(name.as_str()), value)
            });
            (Key::from(domain.as_str()), map(values))
        });
        let capacity = capacity.iter().map(|(domain, names)| {
            let values = names.iter().map(|(name, quantity)| {
                let milli = i64::try_from(quantity.0).unwrap_or(i64::MAX);
                (Key::from(name.as_str()), Value::Int(milli))
            });
            (Key::from(domain.as_str()), map(values))
        });
        let device = [
            (Key::from("driver"), Value::from(driver)),
            (Key::from("attributes"), map(attributes)),
            (Key::from("capacity"), map(capacity)),
        ];
        CelDevice {
            value: map(device.into_iter()),
            fingerprint,
        }
    }
}

fn map(entries: impl Iterator<Item = (Key, Value)>) -> Value {
    let entries: HashMap<Key, Value> = entries.collect();
    Value::from(entries)
}

/// Kubernetes' quantity and semver functions, on our representations of them:
/// quantities are integers (thousandths), versions strings.
fn add_functions(context: &mut Context) {
    let _ = context.add_function("quantity", quantity);
    let _ = context.add_function("isQuantity", |s: Arc<String>| parse_milli(&s).is_some());
    let _ = context.add_function("semver", semver);
    let _ = context.add_function("isSemver", |s: Arc<String>| Version::parse(&s).is_some());
    let _ = context.add_function("compareTo", compare_to);
    let _ = context.add_function("isGreaterThan", |This(a): This<Value>, b: Value| {
        compare(&a, &b).map(|o| o == Ordering::Greater)
    });
    let _ = context.add_function("isLessThan", |This(a): This<Value>, b: Value| {
        compare(&a, &b).map(|o| o == Ordering::Less)
    });
    let _ = context.add_function("asInteger", |This(milli): This<i64>| milli / 1000);
    let _ = context.add_function("isInteger", |This(milli): This<i64>| milli % 1000 == 0);
    let _ = context.add_function("asApproximateFloat", |This(milli): This<i64>| {
        milli as f64 / 1000.0
    });
    let _ = context.add_function("sign", |This(milli): This<i64>| milli.signum());
    let _ = context.add_function("major", |This(v): This<Arc<String>>| part(&v, 0));
    let _ = context.add_function("minor", |This(v): This<Arc<String>>| part(&v, 1));
    let _ = context.add_function("patch", |This(v): This<Arc<String>>| part(&v, 2));
}

fn quantity(text: Arc<String>) -> Result<i64, ExecutionError> {
    parse_milli(&text).ok_or_else(|| ExecutionError::function_error("quantity", "not a quantity"))
}

fn parse_milli(text: &str) -> Option<i64> {
    i64::try_from(Milli::parse(text).ok()?.0).ok()
}

fn semver(text: Arc<String>) -> Result<Arc<String>, ExecutionError> {
    Version::parse(&text)
        .map(|_| text.clone())
        .ok_or_else(|| ExecutionError::function_error("semver", "not a semantic version"))
}

fn part(version: &str, index: usize) -> Result<i64, ExecutionError> {
    let parsed = Version::parse(version)
        .ok_or_else(|| ExecutionError::function_error("semver", "not a semantic version"))?;
    Ok(parsed.numbers[index] as i64)
}

fn compare_to(This(a): This<Value>, b: Value) -> Result<i64, ExecutionError> {
    compare(&a, &b).map(|o| o as i64)
}

/// Quantities (integers) by value, versions (strings) by semantic version order.
fn compare(a: &Value, b: &Value) -> Result<Ordering, ExecutionError> {
    match (a, b) {
        (Value::Int(a), Value::Int(b)) => Ok(a.cmp(b)),
        (Value::String(a), Value::String(b)) => {
            let (a, b) = (Version::parse(a), Version::parse(b));
            let (Some(a), Some(b)) = (a, b) else {
                return Err(ExecutionError::function_error("compareTo", "not versions"));
            };
            Ok(a.cmp(&b))
        }
        _ => Err(ExecutionError::function_error(
            "compareTo",
            "mismatched types",
        )),
    }
}

/// `major.minor.patch[-pre][+build]`; a pre-release sorts before its release.
#[derive(Debug, PartialEq, Eq)]
struct Version {
    numbers: [u64; 3],
    pre: Option<String>,
}

impl Version {
    fn parse(text: &str) -> Option<Version> {
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

#[cfg(test)]
mod tests;
