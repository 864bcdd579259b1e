//! The filter verb: read the request, reserve a placement in the cache, record it on
//! the pod, answer in the scheduler's terms.

use std::collections::BTreeMap;
use std::sync::Arc;

use foldhash::HashMap;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::cache::pod::SkipReason;
use crate::cache::{
    AnnotationKeys, CachedPod, Candidates, ClusterCache, FilterDecision, PodKey, Reservation,
    Subject, pod_key,
};
use crate::config::Config;
use crate::placement::learn::LearningPlacer;
use crate::placement::models::{ModelSource, WantedModels};
use crate::placement::{Assignment, GpuRequest, Misfit, Outcome, Placer};
use crate::quota::NamespaceLimits;
use crate::quota::ledger::{Costs, ModelAmounts};
use crate::quota::reserve::{Ask, Reserved};

use super::eligible::{self, Charged, Eligibility};

use super::api::{ExtenderArgs, ExtenderFilterResult, NodeReasons};

/// How a filter call ended, for metrics and logs (a bounded set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterOutcome {
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
    pub const fn label(self) -> &'static str {
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

/// Filter one pod over the candidate nodes: plan (choose and hold GPUs in memory,
/// under the cache lock), record (API mode: the quota charge of a pod that accepts
/// several models, then the annotations gpu-manager reads), answer. The request is
/// read-only input; in API mode only the pod's identity is read from it.
pub async fn filter(
    cache: &ClusterCache,
    config: &Config,
    placer: &LearningPlacer,
    args: &ExtenderArgs,
) -> (ExtenderFilterResult, FilterOutcome) {
    let offered = match CachedPod::from_pod(&args.pod, cache.projection()) {
        Ok(offered) => offered,
        Err(SkipReason::NoGpu) => return (pass_all(args), FilterOutcome::Passthrough),
        Err(error) => return error_result(format!("pod {}: {error}", pod_key(&args.pod))),
    };
    let key = pod_key(&args.pod);
    cache.ensure_pod(&key).await;
    // API mode: the cluster's copy of the pod is placed, never the caller's.
    let subject = match cache.client() {
        Some(_) => Subject::Known { uid: offered.uid },
        None => Subject::Offered(Box::new(offered)),
    };
    let names = args.candidate_names();
    let (plan, decision) = match plan(cache, placer, key, subject, &names) {
        Ok(planned) => planned,
        Err(error) => return error_result(error),
    };
    let result = failed_nodes(&decision.misfits);
    let Some(reservation) = decision.reservation else {
        // No GPU of a device plugin fits: nodes whose GPUs only DRA hands out may.
        let dra = cache.with_state(|state| state.dra_nodes(&plan.key, &names));
        if !dra.is_empty() {
            tracing::info!(pod = %plan.key, nodes = dra.len(), "left to DRA-backed extended resources");
            return (with_dra_nodes(result, &dra, args), FilterOutcome::Dra);
        }
        return (
            with_passed(result, None, args),
            FilterOutcome::Unschedulable,
        );
    };
    let node = reservation.node.clone();
    if reservation.kept {
        tracing::info!(pod = %plan.key, %node, "kept its placement");
        return (with_passed(result, Some(&node), args), FilterOutcome::Kept);
    }
    // With the bind verb, the choice stays held in memory until the scheduler binds.
    let recorded = match config.placement.bind_verb {
        true => Ok(()),
        false => record(cache, config, &plan, &reservation).await,
    };
    if let Err(refusal) = recorded {
        tracing::warn!(pod = %plan.key, %node, reason = %refusal.reason, "placement not recorded; rolled back");
        cache.with_state(|state| state.rollback(&plan.key, reservation));
        let mut result = result;
        result.failed_nodes.insert(&*node, refusal.reason);
        return (with_passed(result, None, args), refusal.outcome);
    }
    placer.observe(&plan.request);
    tracing::info!(pod = %plan.key, %node, "placed");
    (
        with_passed(result, Some(&node), args),
        FilterOutcome::Placed,
    )
}

/// What the record step needs to know of the plan.
pub(super) struct Plan {
    pub key: PodKey,
    pub uid: String,
    /// The GPU request of the pod placed: the cluster's copy in API mode.
    pub request: GpuRequest,
    /// The pod accepts several models: its quota charge is taken at placement, for the
    /// model of the node it gets (API mode: written to the ledger before the placement
    /// is recorded).
    pub charge_at_placement: Option<PlacementCharge>,
}

pub(super) struct PlacementCharge {
    /// Per quota key, on the node's model.
    pub charge: ModelAmounts,
    pub node_model: Option<String>,
    /// The pod's creation second (the ledger's pending total it joins).
    pub created: i64,
}

/// Choose and hold a placement for the pod `subject` names among the nodes `names`,
/// under the cache lock: the first half of both the filter and the bind verb.
pub(super) fn plan(
    cache: &ClusterCache,
    placer: &LearningPlacer,
    key: PodKey,
    subject: Subject,
    names: &[&str],
) -> Result<(Plan, FilterDecision), String> {
    let namespace = key
        .split_once('/')
        .map_or("default", |(ns, _)| ns)
        .to_string();
    let namespace = namespace.as_str();
    let api_mode = cache.client().is_some();
    let placer = placer.placer();
    let mig = &cache.projection().names.mig;
    cache.with_state(|state| {
        let limits = NamespaceLimits::of(state.quotas(), namespace);
        let held = state
            .take_subject(&key, subject)
            .map_err(|e| e.to_string())?;
        let uid = state
            .pod(&key)
            .map(|p| p.uid.to_string())
            .unwrap_or_default();
        // The pod as the cluster has it decides what it wants and was charged.
        let default = limits.default_type.as_deref();
        let pod = state.pod(&key);
        let own = pod.map(|p| p.models.as_slice()).unwrap_or_default();
        let wanted = WantedModels::of_own(own, default, &limits.models);
        let charged = match pod {
            Some(pod) => eligible::charged(state, &limits, &wanted, &pod.request, pod.created),
            None => Charged::Free, // nothing to place: `place_subject` says so
        };
        // The ledger is read only when some node's cost may call for it.
        let views = eligible::needs_views(&charged)
            .then(|| eligible::ledger_views(state, namespace, api_mode));
        let eligibility = Eligibility::new(&limits, wanted, charged, mig, views.as_ref());
        let context = Choice {
            placer: &placer,
            eligibility: &eligibility,
        };
        let decision = state.place_subject(
            &key,
            held,
            names,
            |cached, candidates| context.choose(cached, candidates),
            Instant::now(),
        );
        let pod = state.pod(&key);
        let request = pod.map(|p| p.request.clone()).unwrap_or_default();
        let node = decision.reservation.as_ref().map(|r| &*r.node);
        // What the ledger is charged at placement: all of it for a pod that accepts
        // several models, what a dearer node costs beyond its admission charge otherwise.
        let charge_at_placement = node.and_then(|n| {
            let node_model = state.node(n)?.model.as_deref().map(str::to_string);
            let label = node_model.as_deref().unwrap_or_default();
            Some(PlacementCharge {
                charge: eligibility.placement_charge(label, &request)?,
                node_model,
                created: pod.map_or(0, |p| p.created),
            })
        });
        let plan = Plan {
            key,
            uid,
            request,
            charge_at_placement,
        };
        Ok((plan, decision))
    })
}

/// What the policy chooses with: the rules a node must pass for the pod.
struct Choice<'a> {
    placer: &'a Placer,
    eligibility: &'a Eligibility<'a>,
}

impl Choice<'_> {
    /// The policy's choice among `candidates` for the cluster's copy of the pod.
    fn choose(&self, pod: &CachedPod, candidates: &mut Candidates<'_>) -> Outcome {
        candidates.place(self.placer, &pod.request, |node| {
            self.eligibility.admits(node, &pod.request)
        })
    }
}

/// Why a placement could not be recorded: the text goes to the node's reason.
pub(super) struct Refusal {
    pub reason: String,
    pub outcome: FilterOutcome,
}

/// API mode: charge a multi-model pod to its node's model in the GPUQuota ledger (the
/// one the validating webhook reserves in, so no replica can admit past `hard`
/// meanwhile), then write the annotations, with the pod's uid as a precondition.
async fn record(
    cache: &ClusterCache,
    config: &Config,
    plan: &Plan,
    reservation: &Reservation,
) -> Result<(), Refusal> {
    if cache.client().is_none() {
        return Ok(()); // offline: the reservation in memory is the record
    }
    let (namespace, name) = plan.key.split_once('/').unwrap_or(("default", &plan.key));
    if let Some(charge) = &plan.charge_at_placement {
        charge_ledger(cache, config, namespace, charge).await?;
    }
    let annotations = annotations(
        &cache.projection().keys,
        &reservation.node,
        &reservation.assignment,
    );
    cache
        .record(namespace, name, &plan.uid, annotations)
        .await
        .map_err(|error| Refusal {
            reason: error.to_string(),
            outcome: FilterOutcome::Error,
        })
}

/// API mode: charge a multi-model pod to its node's model in the GPUQuota ledger.
pub(super) async fn charge_ledger(
    cache: &ClusterCache,
    config: &Config,
    namespace: &str,
    charge: &PlacementCharge,
) -> Result<(), Refusal> {
    let Some(ledger) = cache.ledger() else {
        return Ok(());
    };
    let ask = Ask {
        wanted: WantedModels {
            models: vec![charge.node_model.clone().unwrap_or_default()],
            source: ModelSource::Annotation,
        },
        costs: Costs::single(
            charge.node_model.clone().unwrap_or_default(),
            charge.charge.clone(),
        ),
        rules: config.admit_rules(),
        created: charge.created,
        dry_run: false,
    };
    match ledger.reserve(cache, namespace, ask).await {
        Ok(Reserved::Yes) => Ok(()),
        Ok(Reserved::Denied(denial)) => Err(Refusal {
            reason: denial.to_string(),
            outcome: FilterOutcome::Unschedulable,
        }),
        Err(error) => Err(Refusal {
            reason: error.to_string(),
            outcome: FilterOutcome::Error,
        }),
    }
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

/// The gpu-manager annotations for a placement (docs/design.md), written in one patch.
pub fn annotations(
    keys: &AnnotationKeys,
    node: &str,
    assignment: &Assignment,
) -> BTreeMap<String, String> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut annotations: BTreeMap<String, String> = assignment
        .choices
        .iter()
        .map(|choice| {
            (
                keys.gpu_idx(choice.container),
                Assignment::indices_text(choice),
            )
        })
        .collect();
    annotations.insert(keys.node.clone(), node.to_string());
    annotations.insert(keys.assigned.clone(), "false".into());
    annotations.insert(keys.time.clone(), nanos.to_string());
    annotations
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
