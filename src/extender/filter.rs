//! The filter verb: read the request, run the placement transaction (`plan`), answer
//! in the scheduler's terms.

use std::sync::Arc;

use foldhash::HashMap;

use crate::backend::Backend;
use crate::cache::pod::SkipReason;
use crate::cache::{CachedPod, pod_key};
use crate::config::Config;
use crate::placement::Misfit;
use crate::placement::learn::LearningPlacer;
use crate::wire::extender::ExtenderArgs;
use crate::wire::filter_result::{ExtenderFilterResult, NodeReasons};

use super::plan::plan;

/// How a filter call ended, for metrics and logs (a bounded set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FilterOutcome {
    /// Not a GPU pod: every node passes unchanged.
    Passthrough,
    Placed,
    /// A re-filter that kept the pod's earlier placement.
    Kept,
    Unschedulable,
    /// Passed to nodes whose GPUs kube-scheduler's DRA plugin allocates (DRA-backed
    /// extended resources): nothing placed or held here.
    Dra,
    /// The pod's GPU request is unreadable, or recording the choice failed.
    Error,
}

impl FilterOutcome {
    pub(crate) const fn label(self) -> &'static str {
        match self {
            FilterOutcome::Passthrough => "passthrough",
            FilterOutcome::Placed => "placed",
            FilterOutcome::Kept => "kept",
            FilterOutcome::Unschedulable => "unschedulable",
            FilterOutcome::Dra => "dra",
            FilterOutcome::Error => "error",
        }
    }
}

/// Filter one pod over the candidate nodes through the placement transaction
/// (`plan`): plan and hold, record (unless the bind verb will), answer. The request is
/// read-only input; in API mode only the pod's identity is read from it.
pub(crate) async fn filter(
    backend: &Backend,
    config: &Config,
    placer: &LearningPlacer,
    args: &ExtenderArgs,
) -> (ExtenderFilterResult, FilterOutcome) {
    let cache = backend.cache();
    let offered = match CachedPod::from_pod(&args.pod, cache.projection()) {
        Ok(offered) => offered,
        Err(SkipReason::NoGpu) => return (pass_all(args), FilterOutcome::Passthrough),
        Err(error) => return error_result(format!("pod {}: {error}", pod_key(&args.pod))),
    };
    let key = pod_key(&args.pod);
    backend.ensure_pod(&key).await;
    let subject = backend.subject(offered);
    let names = args.candidate_names();
    let (plan, decision) = match plan(backend, placer, key, subject, &names) {
        Ok(planned) => planned,
        Err(error) => return error_result(error.to_string()),
    };
    let Some(hold) = decision.hold else {
        let result = failed_nodes(&decision.misfits);
        // No GPU of a device plugin fits: nodes whose GPUs only DRA hands out may.
        let dra = cache.read(|state| state.dra_nodes(&plan.key, &names));
        if !dra.is_empty() {
            tracing::info!(pod = %plan.key, nodes = dra.len(), "left to DRA-backed extended resources");
            return (with_dra_nodes(result, &dra, args), FilterOutcome::Dra);
        }
        return (
            with_passed(result, None, args),
            FilterOutcome::Unschedulable,
        );
    };
    let node = hold.node.clone();
    if hold.kept {
        tracing::info!(pod = %plan.key, %node, "kept its placement");
        return (placed_on(&node, args), FilterOutcome::Kept);
    }
    // With the bind verb, the choice stays held in memory until the scheduler binds.
    let recorded = match backend.filter_records(config.placement.bind_verb) {
        true => plan.record(backend, config, &hold).await,
        false => Ok(()),
    };
    if let Err(refusal) = recorded {
        tracing::warn!(pod = %plan.key, %node, reason = %refusal.reason, "placement not recorded; rolled back");
        plan.undo(backend, hold, refusal.charged).await;
        // A placed decision gathered no other reasons (`FilterDecision`): the chosen
        // node's is the one that counts.
        let mut result = ExtenderFilterResult::default();
        result.failed_nodes.insert(&*node, refusal.reason);
        let outcome = match refusal.unfit {
            true => FilterOutcome::Unschedulable,
            false => FilterOutcome::Error,
        };
        return (with_passed(result, None, args), outcome);
    }
    placer.observe(&plan.request, &plan.models);
    tracing::info!(pod = %plan.key, %node, "placed");
    (placed_on(&node, args), FilterOutcome::Placed)
}

/// The answer for a placed pod: the chosen node alone. The other candidates' reasons
/// are left out: kube-scheduler reads them only when no node is left (its diagnosis
/// for events and preemption), and answering thousands of them for every placed pod
/// costs its serial scheduling cycle (docs/design.md, "The filter's answer").
fn placed_on(node: &str, args: &ExtenderArgs) -> ExtenderFilterResult {
    with_passed(ExtenderFilterResult::default(), Some(node), args)
}

fn error_result(error: String) -> (ExtenderFilterResult, FilterOutcome) {
    let result = ExtenderFilterResult {
        error,
        ..Default::default()
    };
    (result, FilterOutcome::Error)
}

/// Every candidate that could not take the pod, with its reason. Thousands of
/// candidates share a few distinct reasons: each text is written once.
fn failed_nodes(misfits: &[(Arc<str>, Misfit)]) -> ExtenderFilterResult {
    let mut result = ExtenderFilterResult::default();
    let mut texts: HashMap<&Misfit, Arc<str>> = HashMap::default();
    for (node, misfit) in misfits {
        let text = texts
            .entry(misfit)
            .or_insert_with(|| misfit.to_string().into())
            .clone();
        failed_map(&mut result, misfit).insert(node.clone(), text);
    }
    result
}

fn failed_map<'a>(result: &'a mut ExtenderFilterResult, misfit: &Misfit) -> &'a mut NodeReasons {
    if misfit.is_unresolvable() {
        &mut result.failed_and_unresolvable_nodes
    } else {
        &mut result.failed_nodes
    }
}

/// Answer in the form the request used: names when names came, objects otherwise.
fn with_passed(
    mut result: ExtenderFilterResult,
    passed: Option<&str>,
    args: &ExtenderArgs,
) -> ExtenderFilterResult {
    if args.node_names.is_some() {
        result.node_names = Some(passed.into_iter().map(str::to_string).collect());
    } else {
        result.nodes = args.echo(|n| Some(n.name.as_str()) == passed);
    }
    result
}

/// `result` with the nodes `dra` passed (and no longer among the failed).
fn with_dra_nodes(
    mut result: ExtenderFilterResult,
    dra: &[String],
    args: &ExtenderArgs,
) -> ExtenderFilterResult {
    let passed = |(node, _): &(Arc<str>, Arc<str>)| !dra.iter().any(|d| **d == **node);
    result.failed_nodes.0.retain(passed);
    result.failed_and_unresolvable_nodes.0.retain(passed);
    if args.node_names.is_some() {
        result.node_names = Some(dra.to_vec());
    } else {
        result.nodes = args.echo(|n| dra.contains(&n.name));
    }
    result
}

fn pass_all(args: &ExtenderArgs) -> ExtenderFilterResult {
    let mut result = ExtenderFilterResult::default();
    if let Some(names) = &args.node_names {
        result.node_names = Some(names.clone());
    } else {
        result.nodes = args.echo(|_| true);
    }
    result
}
