//! The filter verb: read the request, reserve a placement in the cache, record it on
//! the pod, answer in the scheduler's terms.

use std::collections::BTreeMap;
use std::sync::Arc;

use foldhash::HashMap;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::cache::pod::SkipReason;
use crate::cache::{
    AnnotationKeys, CachedPod, Candidates, ClusterCache, ClusterState, FilterDecision, PodKey,
    Reservation, Subject, pod_key,
};
use crate::config::Config;
use crate::placement::MigResources;
use crate::placement::learn::LearningPlacer;
use crate::placement::mig;
use crate::placement::models::{ModelSource, WantedModels, pool_admits};
use crate::placement::{Assignment, GpuRequest, Misfit, NodeGpus, Outcome, Placer};
use crate::quota::ledger::{AdmitRules, Costs, ModelAmounts, QuotaView, charge_on, room};
use crate::quota::reserve::{Ask, Reserved, views_with_status};
use crate::quota::{GPUQuota, NamespaceLimits};

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
        None => Subject::Offered(offered),
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
        // Quota room is checked at placement only for a pod that accepts several models
        // (the others were charged at admission): only then read the ledger (offline, that
        // counts the namespace's pods).
        let own = state
            .pod(&key)
            .map(|p| p.models.as_slice())
            .unwrap_or_default();
        let several =
            WantedModels::resolve(own, limits.default_type.as_ref(), &limits.models).len() >= 2;
        let quota_applies = limits.has_quota && several;
        let views = match quota_applies {
            true => ledger_views(state, namespace, api_mode),
            false => Ok(Vec::new()),
        };
        let context = Choice {
            quota_applies,
            mig,
            placer: &placer,
            limits: &limits,
            views: &views,
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
        let charge_at_placement = quota_applies.then(|| {
            let node_model = node.and_then(|n| Some(state.node(n)?.model.as_deref()?.to_string()));
            PlacementCharge {
                charge: charge_on(&request, node_model.as_deref().unwrap_or_default(), mig),
                node_model,
                created: pod.map_or(0, |p| p.created),
            }
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

/// What the policy chooses with: the namespace's limits and quotas as the ledger sees
/// them.
struct Choice<'a> {
    /// The pod accepts several models and its namespace has a quota.
    quota_applies: bool,
    mig: &'a MigResources,
    placer: &'a Placer,
    limits: &'a NamespaceLimits,
    views: &'a Result<Vec<QuotaView>, String>,
}

impl Choice<'_> {
    /// The policy's choice among `candidates` for the cluster's copy of the pod.
    fn choose(&self, pod: &CachedPod, candidates: &mut Candidates<'_>) -> Outcome {
        let limits = self.limits;
        let wanted =
            WantedModels::of_own(&pod.models, limits.default_type.as_deref(), &limits.models);
        let quota = PlacementQuota {
            applies: self.quota_applies,
            mig: self.mig,
            views: self.views,
            by_label: Default::default(),
        };
        candidates.place(self.placer, &pod.request, |node| {
            wanted
                .admits(node)
                .and_then(|()| pool_admits(&limits.pools, node))
                .and_then(|()| profile_admits(limits, &wanted, node))
                .and_then(|()| quota.room_on(node, &pod.request))
        })
    }
}

/// A pod charged at admission for a model, not for a MIG profile, may not take a
/// single-strategy slice of a profile its namespace caps: the cap would not see it
/// (a pod that names the profile's node label is charged for it at admission).
fn profile_admits(
    limits: &NamespaceLimits,
    wanted: &WantedModels,
    node: &NodeGpus,
) -> Result<(), Misfit> {
    let Some(label) = node.model.as_deref() else {
        return Ok(());
    };
    // Most namespaces cap no profile: then nothing is read of the node.
    if limits.profile_caps.is_empty() || wanted.models.len() != 1 || wanted.models[0] == label {
        return Ok(());
    }
    let (model, Some(profile)) = mig::split_product(label) else {
        return Ok(());
    };
    let key = mig::profile_key(model, profile);
    if !limits.profile_caps.contains(&key) {
        return Ok(());
    }
    Err(Misfit::QuotaFull {
        detail: format!(
            "the namespace caps MIG profile {key}; a pod using it names the node label {label} as its GPU model"
        ),
        model: key,
    })
}

/// For a pod that accepts several models, the quotas its node's model must have room
/// in: the same rule admission applies to a single-model pod, with the node's model.
struct PlacementQuota<'a> {
    applies: bool,
    mig: &'a MigResources,
    views: &'a Result<Vec<QuotaView>, String>,
    /// The answer for each model label asked about in this call: thousands of
    /// candidates share a handful of labels.
    by_label: std::cell::RefCell<Vec<LabelRoom>>,
}

/// Whether the quota has room on nodes of one model label.
type LabelRoom = (Option<Arc<str>>, Result<(), Misfit>);

impl PlacementQuota<'_> {
    fn room_on(&self, node: &NodeGpus, request: &GpuRequest) -> Result<(), Misfit> {
        if !self.applies {
            return Ok(());
        }
        let known = self
            .by_label
            .borrow()
            .iter()
            .find(|(l, _)| *l == node.model)
            .map(|(_, r)| r.clone());
        if let Some(answer) = known {
            return answer;
        }
        let answer = self.room_for(node.model.as_deref().unwrap_or_default(), request);
        let mut by_label = self.by_label.borrow_mut();
        by_label.push((node.model.clone(), answer.clone()));
        answer
    }

    fn room_for(&self, label: &str, request: &GpuRequest) -> Result<(), Misfit> {
        let full = |model: &str, detail: String| Misfit::QuotaFull {
            model: model.to_string(),
            detail,
        };
        let views = self.views.as_ref().map_err(|e| full(label, e.clone()))?;
        room(views, label, &charge_on(request, label, self.mig)).map_err(|e| {
            full(
                &e.model,
                format!("used {} of {} in GPUQuota {}", e.used, e.hard, e.quota),
            )
        })
    }
}

/// The namespace's quotas as the ledger sees them: API mode, `status.used`
/// (reservations included); offline, counted from the pods.
fn ledger_views(
    state: &ClusterState,
    namespace: &str,
    api_mode: bool,
) -> Result<Vec<QuotaView>, String> {
    if api_mode {
        let quotas: Vec<GPUQuota> = state.namespace_quotas(namespace).cloned().collect();
        views_with_status(&quotas).map_err(|e| e.to_string())
    } else {
        state.quota_views(namespace)
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
        rules: AdmitRules::of(config),
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::placement::testing::node;

    fn wants(label: &str) -> WantedModels {
        WantedModels {
            models: vec![label.into()],
            source: ModelSource::Annotation,
        }
    }

    #[test]
    fn a_capped_mig_profile_is_only_for_pods_that_name_it() {
        let mut slices = node("n", 7, 0);
        slices.model = Some("A100-SXM4-40GB-MIG-1g.5gb".into());
        let capped = NamespaceLimits {
            has_quota: true,
            models: vec!["A100-SXM4-40GB".into()],
            profile_caps: vec!["A100-SXM4-40GB/1g.5gb".into()],
            ..Default::default()
        };
        let refused = profile_admits(&capped, &wants("A100-SXM4-40GB"), &slices).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "namespace GPU quota for A100-SXM4-40GB/1g.5gb has no room (the namespace caps MIG profile A100-SXM4-40GB/1g.5gb; a pod using it names the node label A100-SXM4-40GB-MIG-1g.5gb as its GPU model)"
        );
        assert!(profile_admits(&capped, &wants("A100-SXM4-40GB-MIG-1g.5gb"), &slices).is_ok());
        let uncapped = NamespaceLimits {
            profile_caps: Vec::new(),
            ..capped
        };
        assert!(profile_admits(&uncapped, &wants("A100-SXM4-40GB"), &slices).is_ok());
    }
}
