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
//! expressions are literals, compiled once per claim within a size limit). Each claim's
//! parsing, compiling and evaluations draw on one [`CostBudget`], priced by what they
//! really cost and charged while an evaluation runs (`meter`), so that a claim's review
//! spends a bounded time on CEL whatever it holds (docs/devices.md, "Bounds").

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, OnceLock};

use cel::common::ast::{ComprehensionExpr, EntryExpr, Expr, IdedEntryExpr, IdedExpr, LiteralValue};
use cel::common::types::CelBool;
use cel::common::value::{CowVal, Val};
use cel::context::VariableResolver;
use cel::objects::Key;
use cel::parser::PrattParser;
use cel::{Context, Env, Value};

use crate::placement::quantity::Milli;

mod functions;
mod meter;
mod pattern;

use pattern::{COMPILE_PRICE, REGEX_SIZE};

/// Kubernetes' `CELSelectorExpressionMaxLength`: the API server refuses longer ones.
const MAX_EXPRESSION_BYTES: usize = 10 * 1024;
/// Deepest nesting of brackets and conditionals (the parser recurses per level, a few
/// dozen frames each: 24 levels overflow a 2 MiB thread stack in a debug build).
const MAX_NESTING: usize = 8;
/// Most operators, member selections, indexings and calls in one expression (the parser
/// nests a chain of any of them one level deeper per link).
const MAX_OPERATORS: usize = 128;
/// Most syntax-tree cost units one expression may need per device.
const MAX_COST: u64 = 10_000;
/// What a comprehension over a device's attribute map may iterate at most.
const MAP_RANGE: u64 = 64;
/// Most cost units one claim's selectors may spend, parsing and evaluating, over all
/// devices. A unit is about 50 ns of one core (docs/benchmarks.md), so a claim's
/// review spends at most some 30 ms on CEL.
pub const CLAIM_BUDGET: u64 = 600_000;
/// What parsing an expression costs besides its length (an empty one still builds a
/// parser).
const PARSE_PRICE: u64 = 20;
/// Units per byte of an expression parsed (the parser took up to 150 ns a byte).
const PARSE_UNITS_PER_BYTE: u64 = 3;
/// What one evaluation costs besides its syntax tree (setting it up).
const EVALUATION_PRICE: u64 = 10;

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
    #[error("matches a pattern that is not a string literal")]
    PatternNotLiteral,
    #[error("matches {0:?}, which is not a regular expression compiling within {REGEX_SIZE} bytes")]
    Pattern(String),
}

/// A selector compiled and found within bounds.
#[derive(Debug)]
pub struct Selector {
    /// Its syntax tree, instrumented for the meter.
    expression: IdedExpr,
    /// What one evaluation costs by its syntax tree, before it runs.
    cost: u64,
    /// Its `matches` patterns, compiled.
    patterns: Arc<pattern::Patterns>,
}

/// What one claim's parsing and evaluations may still spend, and the patterns they
/// compiled (each once per claim).
#[derive(Debug, Clone)]
pub struct CostBudget {
    left: u64,
    patterns: pattern::Patterns,
}

impl CostBudget {
    fn new(units: u64) -> Self {
        CostBudget {
            left: units,
            patterns: HashMap::new(),
        }
    }

    /// A claim's: [`CLAIM_BUDGET`].
    fn claim() -> Self {
        Self::new(CLAIM_BUDGET)
    }

    /// What is left to spend.
    pub fn left(&self) -> u64 {
        self.left
    }

    fn spend(&mut self, cost: u64) -> Result<(), OverBudget> {
        meter::pace(cost);
        self.left = self.left.checked_sub(cost).ok_or(OverBudget)?;
        Ok(())
    }

    /// `text` compiled, once per claim, each compile charged [`COMPILE_PRICE`].
    fn pattern(&mut self, text: &str) -> Result<Result<Arc<regex::Regex>, CelError>, OverBudget> {
        if let Some(compiled) = self.patterns.get(text) {
            return Ok(Ok(compiled.clone()));
        }
        self.spend(COMPILE_PRICE)?;
        let Ok(compiled) = pattern::compile(text) else {
            let shown: String = text.chars().take(64).collect();
            return Ok(Err(CelError::Pattern(shown)));
        };
        self.patterns.insert(text.into(), compiled.clone());
        Ok(Ok(compiled))
    }
}

impl Default for CostBudget {
    fn default() -> Self {
        Self::claim()
    }
}

#[cfg(test)]
thread_local! {
    /// Selectors compiled and evaluations run on this thread (tests count them).
    pub(crate) static WORK: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Count one compile or evaluation (tests only).
fn count_work() {
    #[cfg(test)]
    WORK.set(WORK.get() + 1);
}

/// The claim's evaluations spent their budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the claim's CEL selectors cost more than {CLAIM_BUDGET} to evaluate against the cluster's devices"
)]
pub struct OverBudget;

impl Selector {
    /// Compile `expression`, charging its parsing (by its length) and its patterns'
    /// compiling to `budget`.
    pub(super) fn compile_within(
        expression: &str,
        budget: &mut CostBudget,
    ) -> Result<Result<Self, CelError>, OverBudget> {
        budget.spend(PARSE_PRICE + expression.len() as u64 * PARSE_UNITS_PER_BYTE)?;
        count_work();
        if expression.len() > MAX_EXPRESSION_BYTES {
            return Ok(Err(CelError::TooLong));
        }
        if let Err(error) = check_shape(expression) {
            return Ok(Err(error));
        }
        let parsed = match parser().parse(expression) {
            Ok(parsed) => parsed,
            Err(e) => return Ok(Err(CelError::Parse(first_line(&e.to_string())))),
        };
        let parsed = &parsed;
        let cost = match cost(parsed, false) {
            Ok(cost) if cost <= MAX_COST => cost,
            Ok(_) => return Ok(Err(CelError::TooCostly)),
            Err(error) => return Ok(Err(error)),
        };
        let mut patterns = pattern::Patterns::new();
        for text in literal_patterns(parsed) {
            match budget.pattern(&text)? {
                Ok(compiled) => patterns.insert(text.into(), compiled),
                Err(error) => return Ok(Err(error)),
            };
        }
        Ok(Ok(Selector {
            expression: instrumented(parsed),
            cost,
            patterns: Arc::new(patterns),
        }))
    }

    /// Compile `expression` with a budget of its own (a DeviceClass's selectors).
    pub fn compile(expression: &str) -> Result<Self, CelError> {
        Self::compile_within(expression, &mut CostBudget::claim())
            .unwrap_or(Err(CelError::TooCostly))
    }

    /// Whether the selector matches `device` (an evaluation error or a non-boolean
    /// result does not), charged to `budget`: its syntax tree's cost before it runs,
    /// and what the meter counts while it runs.
    pub fn matches(&self, device: &CelDevice, budget: &mut CostBudget) -> Result<bool, OverBudget> {
        budget.spend(EVALUATION_PRICE + self.cost)?;
        let (value, left) = meter::metered(budget.left, || self.run(device));
        budget.left = left.ok_or(OverBudget)?;
        Ok(value == Some(true))
    }

    /// The selector's value on `device`, with a claim's budget of its own: `None`
    /// when it fails, is not a boolean or spends the budget.
    pub(crate) fn evaluate(&self, device: &CelDevice) -> Option<bool> {
        let mut budget = CostBudget::claim();
        budget.spend(EVALUATION_PRICE + self.cost).ok()?;
        match meter::metered(budget.left, || self.run(device)) {
            (value, Some(_)) => value,
            (_, None) => None,
        }
    }

    fn run(&self, device: &CelDevice) -> Option<bool> {
        count_work();
        let variable = DeviceVariable(device.value.as_ref());
        let mut context = Context::with_env(env_arc());
        context.set_variable_resolver(&variable);
        pattern::with_patterns(&self.patterns, || {
            Value::resolve_val(&self.expression, &context)
                .ok()
                .and_then(|v| v.downcast_ref::<CelBool>().map(|b| *b.inner()))
        })
    }
}

/// `device`, lent to an evaluation without a copy.
struct DeviceVariable<'a>(&'a (dyn Val + 'static));

impl VariableResolver for DeviceVariable<'_> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        (variable == "device").then_some(CowVal::Borrowed(self.0))
    }
}

/// `parsed`, instrumented for the meter (`meter::instrument`): each comprehension's
/// element costs its loop's body, and the accumulator a `map` or `filter` copies.
fn instrumented(parsed: &IdedExpr) -> IdedExpr {
    let mut expression = parsed.clone();
    let per_element = |c: &ComprehensionExpr| {
        let body = [&c.loop_cond, &c.loop_step].into_iter();
        let body = body.map(|e| cost(e, true).unwrap_or(MAX_COST));
        body.fold(range_size(&c.iter_range), u64::saturating_add)
    };
    meter::instrument(
        &mut expression,
        &mut vec!["device".to_string()],
        &per_element,
    );
    expression
}

/// The string literals `expr` matches against, each once.
fn literal_patterns(expr: &IdedExpr) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut stack = vec![expr];
    while let Some(e) = stack.pop() {
        if let Expr::Call(call) = &e.expr
            && call.func_name == "matches"
            && let Some(Expr::Literal(LiteralValue::String(text))) =
                call.args.last().map(|a| &a.expr)
        {
            found.insert(text.inner().to_string());
        }
        stack.extend(children(e));
    }
    found
}

/// The expressions directly under `expr`.
fn children(expr: &IdedExpr) -> Vec<&IdedExpr> {
    match &expr.expr {
        Expr::Call(call) => call
            .target
            .as_deref()
            .into_iter()
            .chain(&call.args)
            .collect(),
        Expr::Comprehension(c) => {
            vec![
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ]
        }
        Expr::List(list) => list.elements.iter().collect(),
        Expr::Map(map) => map.entries.iter().flat_map(entry_exprs).collect(),
        Expr::Struct(s) => s.entries.iter().flat_map(entry_exprs).collect(),
        Expr::Select(select) => vec![&select.operand],
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => Vec::new(),
    }
}

fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    line.chars().take(200).collect()
}

/// Kubernetes' device environment: CEL's standard library, its quantity and semver
/// functions, our `matches` and the meter's functions.
fn env_arc() -> Arc<Env> {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Env::stdlib();
        let declared = functions::declare(&mut env)
            .and_then(|()| pattern::declare(&mut env))
            .and_then(|()| meter::declare(&mut env));
        if let Err(error) = declared {
            // Never with the `cel` version we build with (a test evaluates every one).
            tracing::error!(%error, "CEL functions not declared");
        }
        Arc::new(env)
    })
    .clone()
}

/// The `cel` crate's hand-written parser, with the standard macros and optional syntax,
/// as its default one (generated by ANTLR) parses: the same syntax tree, 35-70 times
/// faster (its default took up to 5 µs a byte, 50 ms for a 10 KiB list of integers;
/// docs/benchmarks.md). Recursion is bounded before it by `check_shape`.
fn parser() -> PrattParser {
    PrattParser::new()
        .enable_optional_syntax(true)
        .max_recursion_depth(96)
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

fn entry_exprs(entry: &IdedEntryExpr) -> Vec<&IdedExpr> {
    match &entry.expr {
        EntryExpr::MapEntry(e) => vec![&e.key, &e.value],
        EntryExpr::StructField(f) => vec![&f.value],
    }
}

fn entry_exprs_mut(entry: &mut IdedEntryExpr) -> Vec<&mut IdedExpr> {
    match &mut entry.expr {
        EntryExpr::MapEntry(e) => vec![&mut e.key, &mut e.value],
        EntryExpr::StructField(f) => vec![&mut f.value],
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

/// A `matches` pattern: a string literal (compiled with its selector), costing its
/// length per evaluation.
fn pattern_cost(pattern: Option<&IdedExpr>) -> Result<u64, CelError> {
    let Some(Expr::Literal(LiteralValue::String(text))) = pattern.map(|p| &p.expr) else {
        return Err(CelError::PatternNotLiteral);
    };
    Ok(20 + text.inner().len() as u64)
}

/// One device as a selector sees it (`device` in the expression).
#[derive(Debug, Clone)]
pub struct CelDevice {
    /// Built once: every evaluation borrows it.
    value: Box<dyn Val>,
    /// A hash of what a selector can see: equal devices have equal ones.
    pub(super) fingerprint: u64,
}

impl PartialEq for CelDevice {
    fn eq(&self, other: &Self) -> bool {
        self.fingerprint == other.fingerprint && *self.value == *other.value
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
    /// `attributes` and `capacity` by domain, then name; capacity in thousandths. A
    /// device for one claim at a time (`device.allowMultipleAllocations` is false).
    pub fn new(
        driver: &str,
        attributes: &BTreeMap<String, BTreeMap<String, AttributeValue>>,
        capacity: &BTreeMap<String, BTreeMap<String, Milli>>,
    ) -> Self {
        Self::published(driver, attributes, capacity, false)
    }

    /// As [`CelDevice::new`], `shared` saying whether it may be allocated to several
    /// claims at once (`device.allowMultipleAllocations`, Kubernetes 1.34 and later).
    pub(crate) fn published(
        driver: &str,
        attributes: &BTreeMap<String, BTreeMap<String, AttributeValue>>,
        capacity: &BTreeMap<String, BTreeMap<String, Milli>>,
        shared: bool,
    ) -> Self {
        let fingerprint = {
            use std::hash::{Hash, Hasher};
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            (driver, attributes, shared).hash(&mut hasher);
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
            (Key::from("allowMultipleAllocations"), Value::Bool(shared)),
        ];
        let value = Box::<dyn Val>::try_from(map(device.into_iter()));
        CelDevice {
            value: value.unwrap_or_else(|_| Box::new(cel::common::types::CelNull)),
            fingerprint,
        }
    }
}

fn map(entries: impl Iterator<Item = (Key, Value)>) -> Value {
    let entries: HashMap<Key, Value> = entries.collect();
    Value::from(entries)
}

#[cfg(test)]
mod tests;
