//! The meter (docs/devices.md, "Bounds"): what an evaluation spends, counted while it
//! runs. A selector's syntax tree is instrumented once, when it is compiled: every
//! argument of a call whose work grows with its arguments (comparisons, `+`, `in`,
//! `size`, `contains`, `matches`, ...) passes through `@cost`, which charges the
//! argument's weight (its bytes and elements), and every comprehension's range
//! through `@range`, which charges its weight and the loop body's cost per element
//! before the loop starts. `matches` charges its match by the input's and the
//! pattern's length. Once the allowance is spent every charge fails, so the
//! evaluation ends within what it was allowed (a failure inside `||` or `exists` is
//! absorbed, but the next charge fails too, and the loops were paid for in advance);
//! the caller then refuses the claim, whatever the evaluation returned.

use std::cell::Cell;

use cel::common::ast::{CallExpr, Expr, IdedExpr, LiteralValue, operators};
use cel::common::types::{
    CelBytes, CelInt, CelList, CelMap, CelMapKey, CelString, DYN_TYPE, INT_TYPE,
};
use cel::common::value::{CowVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

/// Bytes of a string one weight unit stands for (a comparison or copy of 64 bytes
/// costs about what interpreting one node does).
const BYTES_PER_UNIT: u64 = 64;
const COST: &str = "@cost";
const RANGE: &str = "@range";

/// Units spent between two yields of the thread (about 50 µs of work).
const UNITS_PER_YIELD: u64 = 1_000;

thread_local! {
    /// The running evaluation's allowance; none outside [`metered`].
    static METER: Cell<Option<u64>> = const { Cell::new(None) };
    /// Units spent on this thread since it last yielded.
    static SINCE_YIELD: Cell<u64> = const { Cell::new(0) };
}

/// Note that `units` were spent on this thread, and every [`UNITS_PER_YIELD`] let the
/// other threads of the machine run: a claim's evaluation is CPU-bound for up to tens
/// of milliseconds, and the pod reviews and probes it shares the cores with should not
/// wait for the scheduler's time slice behind it.
pub(super) fn pace(units: u64) {
    let since = SINCE_YIELD.get().saturating_add(units);
    if since >= UNITS_PER_YIELD {
        std::thread::yield_now();
        SINCE_YIELD.set(0);
    } else {
        SINCE_YIELD.set(since);
    }
}

/// Run `evaluate` with `allowance` units to spend: its result, and the units left
/// (`None`: it ran out).
pub(super) fn metered<T>(allowance: u64, evaluate: impl FnOnce() -> T) -> (T, Option<u64>) {
    let outer = METER.replace(Some(allowance));
    let result = evaluate();
    (result, METER.replace(outer))
}

/// Spend `units` of the running evaluation's allowance; an error once it is spent
/// (and outside an evaluation, which is never allowed anything).
pub(super) fn charge(units: u64) -> Result<(), ExecutionError> {
    pace(units);
    let left = METER.get().and_then(|left| left.checked_sub(units));
    METER.set(left);
    left.map(|_| ())
        .ok_or_else(|| ExecutionError::function_error("cost", "the claim's CEL budget is spent"))
}

/// What handling `value` once costs: one, plus its bytes and elements.
fn weight(value: &dyn Val) -> u64 {
    let bytes = |n: usize| 1 + n as u64 / BYTES_PER_UNIT;
    if let Some(s) = value.downcast_ref::<CelString>() {
        return bytes(s.inner().len());
    }
    if let Some(b) = value.downcast_ref::<CelBytes>() {
        return bytes(b.inner().len());
    }
    if let Some(list) = value.downcast_ref::<CelList>() {
        let items = list.inner().iter().map(|item| weight(item.as_ref()));
        return items.fold(1, u64::saturating_add);
    }
    if let Some(map) = value.downcast_ref::<CelMap>() {
        let entries = map.inner().iter().map(|(key, item)| {
            let key = match key {
                CelMapKey::String(s) => bytes(s.inner().len()),
                _ => 1,
            };
            key.saturating_add(weight(item.as_ref()))
        });
        return entries.fold(1, u64::saturating_add);
    }
    1
}

/// The number of elements a comprehension over `value` visits.
fn elements(value: &dyn Val) -> u64 {
    if let Some(list) = value.downcast_ref::<CelList>() {
        return list.inner().len() as u64;
    }
    if let Some(map) = value.downcast_ref::<CelMap>() {
        return map.inner().len() as u64;
    }
    0
}

/// Declare `@cost` and `@range` (names no source can spell) on `env`.
pub(super) fn declare(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_overload(COST, COST, vec![DYN_TYPE], cost)?;
    env.add_overload(RANGE, RANGE, vec![DYN_TYPE, INT_TYPE], range)
}

/// `@cost(x)`: `x`, its weight charged.
fn cost<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let value = args
        .into_iter()
        .next()
        .ok_or_else(ExecutionError::missing_argument_or_target)?;
    charge(weight(&*value))?;
    Ok(value)
}

/// `@range(r, per_element)`: `r`, charged its weight and `per_element` for each of
/// its elements (the loop over it is paid for before it starts).
fn range<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let mut args = args.into_iter();
    let (Some(value), Some(per_element)) = (args.next(), args.next()) else {
        return Err(ExecutionError::missing_argument_or_target());
    };
    let per_element = per_element
        .downcast_ref::<CelInt>()
        .map_or(1, |i| *i.inner());
    let loop_cost = elements(&*value).saturating_mul(per_element.max(1) as u64);
    charge(weight(&*value).saturating_add(loop_cost))?;
    Ok(value)
}

/// Instrument `expr` for the meter (above). `variables`: the names bound to values
/// here (`device`, the enclosing comprehensions' variables); `per_element(c)` what a
/// comprehension's body costs once.
pub(super) fn instrument(
    expr: &mut IdedExpr,
    variables: &mut Vec<String>,
    per_element: &impl Fn(&cel::common::ast::ComprehensionExpr) -> u64,
) {
    match &mut expr.expr {
        Expr::Call(call) => {
            if let Some(target) = call.target.as_deref_mut() {
                instrument(target, variables, per_element);
            }
            for arg in &mut call.args {
                instrument(arg, variables, per_element);
            }
            if is_metered(call) {
                if let Some(target) = call.target.as_deref_mut() {
                    wrap(target, variables);
                }
                call.args.iter_mut().for_each(|arg| wrap(arg, variables));
            }
        }
        Expr::Comprehension(c) => {
            let price = per_element(c);
            instrument(&mut c.iter_range, variables, per_element);
            let bound = variables.len();
            variables.extend([c.iter_var.clone()].into_iter().chain(c.iter_var2.clone()));
            for part in [
                &mut c.accu_init,
                &mut c.loop_cond,
                &mut c.loop_step,
                &mut c.result,
            ] {
                instrument(part, variables, per_element);
            }
            variables.truncate(bound);
            let range = std::mem::take(&mut c.iter_range);
            c.iter_range = call(RANGE, vec![range, literal_int(price)]);
        }
        Expr::Select(select) => instrument(&mut select.operand, variables, per_element),
        Expr::List(list) => {
            for element in &mut list.elements {
                instrument(element, variables, per_element);
            }
        }
        Expr::Map(map) => {
            for entry in &mut map.entries {
                for part in super::entry_exprs_mut(entry) {
                    instrument(part, variables, per_element);
                }
            }
        }
        Expr::Struct(s) => {
            for entry in &mut s.entries {
                for part in super::entry_exprs_mut(entry) {
                    instrument(part, variables, per_element);
                }
            }
        }
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
    }
}

/// Whether a call's work grows with its arguments: all but the logical operators,
/// the conditional, indexing (a lookup), our own, and a comprehension's step that
/// appends to its accumulator (kept as the interpreter recognises it, appending in
/// place; the appended element is charged where it is made).
fn is_metered(call: &CallExpr) -> bool {
    let accumulates = matches!(call.args.first().map(|a| &a.expr),
        Some(Expr::Ident(name)) if name.starts_with('@'));
    !accumulates
        && !matches!(
            call.func_name.as_str(),
            operators::CONDITIONAL
                | operators::LOGICAL_AND
                | operators::LOGICAL_OR
                | operators::LOGICAL_NOT
                | operators::NOT_STRICTLY_FALSE
                | operators::INDEX
                | operators::OPT_INDEX
                | operators::OPT_SELECT
                | COST
                | RANGE
        )
}

/// Pass `arg` through `@cost`, unless its weight is known from the syntax tree (a
/// literal) or it names no value (a type, a function's namespace).
fn wrap(arg: &mut IdedExpr, variables: &[String]) {
    let names_value = |root: &str| variables.iter().any(|v| v == root);
    let wrapped = match &arg.expr {
        Expr::Literal(_) => false,
        Expr::Ident(name) => names_value(name),
        Expr::Select(_) => root_ident(arg).is_none_or(names_value),
        _ => true,
    };
    if wrapped {
        let inner = std::mem::take(arg);
        *arg = call(COST, vec![inner]);
    }
}

/// The identifier a chain of selections starts from, if it does.
fn root_ident(expr: &IdedExpr) -> Option<&str> {
    match &expr.expr {
        Expr::Ident(name) => Some(name),
        Expr::Select(select) => root_ident(&select.operand),
        _ => None,
    }
}

fn call(name: &str, args: Vec<IdedExpr>) -> IdedExpr {
    IdedExpr {
        id: 0,
        expr: Expr::Call(CallExpr {
            func_name: name.to_string(),
            target: None,
            args,
        }),
    }
}

fn literal_int(value: u64) -> IdedExpr {
    IdedExpr {
        id: 0,
        expr: Expr::Literal(LiteralValue::Int(
            i64::try_from(value).unwrap_or(i64::MAX).into(),
        )),
    }
}
