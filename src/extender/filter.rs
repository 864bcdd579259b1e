//! The filter verb: read the request, reserve a placement in the cache, record it on
//! the pod, answer in the scheduler's terms.

use std::collections::BTreeMap;
use std::sync::Arc;

use foldhash::HashMap;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Node, Pod};

use crate::cache::{
    AnnotationKeys, CachedPod, ClusterCache, ClusterState, FilterDecision, pod_key,
};
use crate::config::Config;
use crate::placement::learn::LearningPlacer;
use crate::placement::models::{WantedModels, pool_admits};
use crate::placement::{Assignment, GpuRequest, Misfit, NodeGpus, place};
use crate::quota::NamespaceLimits;
use crate::quota::ledger::{QuotaView, amount_of, room};
use crate::quota::reserve::views_with_status;

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
            FilterOutcome::Error => "error",
        }
    }
}

/// Filter one pod over the candidate nodes.
pub async fn filter(
    cache: &ClusterCache,
    config: &Config,
    placer: &LearningPlacer,
    args: ExtenderArgs,
) -> (ExtenderFilterResult, FilterOutcome) {
    let projection = cache.projection();
    let ExtenderArgs {
        pod,
        nodes,
        node_names,
    } = args;
    let names: Vec<&str> = match (&node_names, &nodes) {
        (Some(names), _) => names.iter().map(String::as_str).collect(),
        (None, Some(nodes)) => nodes
            .iter()
            .map(|n| n.metadata.name.as_deref().unwrap_or_default())
            .collect(),
        (None, None) => Vec::new(),
    };
    let mut result = ExtenderFilterResult::default();
    let placer = match GpuRequest::from_pod(&pod, &projection.names) {
        Ok(Some(request)) => placer.placer_for(&request),
        Ok(None) => return (pass_all(node_names, nodes), FilterOutcome::Passthrough),
        Err(error) => {
            result.error = format!("pod {}: {error}", pod_key(&pod));
            return (result, FilterOutcome::Error);
        }
    };
    let incoming = match CachedPod::from_pod(&pod, projection) {
        Ok(incoming) => incoming,
        Err(error) => {
            result.error = format!("pod {}: {error}", pod_key(&pod));
            return (result, FilterOutcome::Error);
        }
    };
    if let Some(nodes) = &nodes {
        let given: Vec<NodeGpus> = nodes
            .iter()
            .map(|n| NodeGpus::from_node(n, &projection.names, &projection.labels))
            .collect();
        cache.with_state(|state| given.into_iter().for_each(|n| state.apply_node(n)));
    }
    let key = pod_key(&pod);
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let api_mode = cache.client().is_some();
    let decision = cache.with_state(|state| {
        let limits = NamespaceLimits::of(state.quotas(), namespace);
        let wanted = limits.wanted_models(&pod, config);
        let quota = quota_for_placement(state, namespace, &wanted, &limits, api_mode);
        state.reserve(
            &key,
            incoming,
            &names,
            |request, candidates| {
                place(&placer, request, candidates.iter().copied(), |node| {
                    wanted
                        .admits(node)
                        .and_then(|()| pool_admits(&limits.pools, node))
                        .and_then(|()| quota.room_on(node, request))
                })
            },
            Instant::now(),
        )
    });
    finish(cache, &pod, decision, node_names, nodes).await
}

/// For a pod that accepts several models, the quotas its node's model must have room
/// in (DESIGN §3.3). Single-model pods were charged at admission already.
struct PlacementQuota {
    views: Vec<QuotaView>,
}

impl PlacementQuota {
    fn room_on(&self, node: &NodeGpus, request: &GpuRequest) -> Result<(), Misfit> {
        let Some(model) = node.model.as_deref() else {
            return Ok(());
        };
        if self.views.is_empty() {
            return Ok(());
        }
        room(&self.views, model, amount_of(request)).map_err(|e| Misfit::QuotaFull {
            model: model.to_string(),
            detail: format!("used {} of {} in GPUQuota {}", e.used, e.hard, e.quota),
        })
    }
}

fn quota_for_placement(
    state: &ClusterState,
    namespace: &str,
    wanted: &WantedModels,
    limits: &NamespaceLimits,
    api_mode: bool,
) -> PlacementQuota {
    if wanted.models.len() < 2 || !limits.has_quota {
        return PlacementQuota { views: Vec::new() };
    }
    let quotas: Vec<_> = state.namespace_quotas(namespace).cloned().collect();
    // API mode: status.used is the ledger (reservations included); offline: the pods.
    let views = if api_mode {
        views_with_status(&quotas).ok()
    } else {
        state.quota_views(namespace).ok()
    };
    PlacementQuota {
        views: views.unwrap_or_default(),
    }
}

async fn finish(
    cache: &ClusterCache,
    pod: &Pod,
    decision: FilterDecision,
    node_names: Option<Vec<String>>,
    nodes: Option<Vec<Node>>,
) -> (ExtenderFilterResult, FilterOutcome) {
    let mut result = ExtenderFilterResult::default();
    // Thousands of candidates share a few distinct reasons: write each text once.
    let mut texts: HashMap<&Misfit, Arc<str>> = HashMap::default();
    for (node, misfit) in &decision.misfits {
        let text = texts
            .entry(misfit)
            .or_insert_with(|| misfit.to_string().into())
            .clone();
        failed_map(&mut result, misfit).insert(node.clone(), text);
    }
    let Some(reservation) = decision.reservation else {
        return (
            with_passed(result, &[], node_names, nodes),
            FilterOutcome::Unschedulable,
        );
    };
    let outcome = if reservation.kept {
        FilterOutcome::Kept
    } else {
        let annotations = annotations(
            &cache.projection().keys,
            &reservation.node,
            &reservation.assignment,
        );
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        if let Err(error) = cache.record(namespace, name, annotations).await {
            tracing::warn!(pod = %pod_key(pod), %error, "placement not recorded; rolled back");
            let node = reservation.node.to_string();
            cache.with_state(|state| state.rollback(&pod_key(pod), reservation));
            result.failed_nodes.insert(node, error.to_string());
            return (
                with_passed(result, &[], node_names, nodes),
                FilterOutcome::Error,
            );
        }
        FilterOutcome::Placed
    };
    tracing::info!(pod = %pod_key(pod), node = %reservation.node, outcome = outcome.label(), "placed");
    (
        with_passed(result, &[reservation.node.to_string()], node_names, nodes),
        outcome,
    )
}

fn failed_map<'a>(result: &'a mut ExtenderFilterResult, misfit: &Misfit) -> &'a mut NodeReasons {
    if misfit.is_unresolvable() {
        &mut result.failed_and_unresolvable_nodes
    } else {
        &mut result.failed_nodes
    }
}

/// The gpu-manager annotations for a placement (DESIGN §5.2), written in one patch.
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
    passed: &[String],
    node_names: Option<Vec<String>>,
    nodes: Option<Vec<Node>>,
) -> ExtenderFilterResult {
    if node_names.is_some() {
        result.node_names = Some(passed.to_vec());
    } else if let Some(nodes) = nodes {
        let items = nodes
            .into_iter()
            .filter(|n| {
                passed
                    .iter()
                    .any(|p| Some(p.as_str()) == n.metadata.name.as_deref())
            })
            .collect();
        result.nodes = Some(k8s_openapi::List {
            items,
            ..Default::default()
        });
    }
    result
}

fn pass_all(node_names: Option<Vec<String>>, nodes: Option<Vec<Node>>) -> ExtenderFilterResult {
    let mut result = ExtenderFilterResult::default();
    if node_names.is_some() {
        result.node_names = node_names;
    } else if let Some(items) = nodes {
        result.nodes = Some(k8s_openapi::List {
            items,
            ..Default::default()
        });
    }
    result
}
