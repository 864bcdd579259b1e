//! The compact projection of a GPU pod that placement needs: a few hundred bytes
//! instead of the whole object.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::placement::models::WantedModels;
use crate::placement::{Assignment, GpuChoice, GpuRequest};

use super::Projection;
use super::plan_hold::PlanHold;
use crate::marks::PLAN_HOLD_ANNOTATION;

/// A pod's identity in the cache: `namespace/name` (unique among live pods).
pub(crate) type PodKey = Arc<str>;

pub fn pod_key(pod: &Pod) -> PodKey {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    format!("{ns}/{name}").into()
}

/// The namespace and name of a [`pod_key`] (a key without a slash: `default`, as
/// `pod_key` names a pod without a namespace).
pub(crate) fn key_parts(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("default", key))
}

/// How the tenant of `namespace` is told of the pod `key` in what it reads on its own
/// pods (Events, conditions, annotations, `/explain`): by name within its namespace,
/// any other namespace's pod as "a pod of another namespace" (which pods run where is
/// not a tenant's to learn; docs/security.md).
pub(crate) fn shown_to(namespace: &str, key: &str) -> String {
    match key_parts(key).0 == namespace {
        true => key.to_string(),
        false => "a pod of another namespace".to_string(),
    }
}

/// Where a pod's GPUs are: its node and, when its annotations say so, the GPU indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedPod {
    pub(crate) uid: Box<str>,
    pub(crate) request: GpuRequest,
    /// `spec.nodeName`, else the extender's predicate-node annotation.
    pub node: Option<Arc<str>>,
    /// `spec.nodeName` is set: the pod is bound and no longer the extender's to place.
    pub bound: bool,
    /// The GPUs the annotations name, when every GPU container has one that parses.
    pub assignment: Option<Assignment>,
    /// Set while the placement is only our own in-memory choice, not yet seen on the
    /// pod object (API mode: the annotation patch has not come back through the watch).
    pub(super) held_since: Option<std::time::Instant>,
    /// Our filter wrote this placement onto the pod and took the quota charge it adds
    /// (kept through the watch's echo of that write), so the bind verb must not charge
    /// it again.
    pub(super) recorded: bool,
    /// The GPU models the pod itself names (annotation, nodeSelector or affinity);
    /// empty when it names none and its namespace's quota decides.
    pub(crate) models: Vec<String>,
    /// The second its admission charge was made, in unix seconds (0 when absent): which
    /// pending quota total it went to (`quota::pending`). `creationTimestamp`, or for a
    /// pod let out of the quota queue the second its release annotation names.
    pub(crate) created: i64,
    /// Waiting in the quota queue (the `gpu-admission.io/quota` gate): charged nothing,
    /// and not the scheduler's to place yet.
    pub(crate) gated: bool,
    /// `spec.priority` (0 when absent): its place in the quota queue.
    pub(crate) priority: i32,
    /// Carries the borrowed annotation (`quota::cohort::BORROWED_ANNOTATION`), which
    /// gpu-admission keeps on the pods of a cohort's borrowers. Shown, never charged by.
    pub(crate) marked_borrowed: bool,
    /// The uid its controlling ownerReference names: which controller a replacement is
    /// of (`plan_hold::Slot`). Claimed by the pod, not proven.
    pub(crate) owner: Option<Box<str>>,
    /// What few pods carry, boxed apart: most pods carry none of it and pay one
    /// pointer for it, and a pod is then 256 bytes, not 328 (jemalloc gives it 256,
    /// not 384: docs/benchmarks.md, "Memory per cached pod").
    seldom: Option<Box<Seldom>>,
}

/// The parts of a [`CachedPod`] that few pods carry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Seldom {
    /// Being deleted (`deletionTimestamp` set): see [`CachedPod::terminating`].
    terminating: Option<i64>,
    /// See [`CachedPod::unscheduled`].
    unscheduled: u64,
    /// See [`CachedPod::claim_names`].
    claim_names: Box<[Box<str>]>,
    /// Its [`WAITING_CONDITION`], as the pod shows it.
    waiting: Option<WaitingShown>,
    /// The defragmentation plan's holds it carries ([`PLAN_HOLD_ANNOTATION`]).
    plan_hold: Option<Arc<PlanHold>>,
}

impl Seldom {
    /// `None` when the pod carries none of it.
    fn boxed(self) -> Option<Box<Seldom>> {
        (self != Seldom::default()).then(|| Box::new(self))
    }
}

/// The pod condition gpu-admission keeps on every pending GPU pod: why it waits
/// (docs/explain.md). Only gpu-admission writes it (`crate::marks`).
pub(crate) use crate::marks::WAITING_CONDITION;

/// A pod's [`WAITING_CONDITION`] as its status shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WaitingShown {
    /// `status: "True"`.
    pub(crate) waits: bool,
    /// The reason: an `explain` code.
    pub(crate) reason: Box<str>,
    /// A fingerprint of the message ([`message_fingerprint`]): the pod keeps the text.
    pub(crate) message: u64,
}

/// The fingerprint [`WaitingShown::message`] keeps of a condition's message.
pub(crate) fn message_fingerprint(message: &str) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::with_seed(0).hash_one(message)
}

/// Annotation keys of the gpu-manager protocol under a configurable prefix.
#[derive(Debug, Clone)]
pub(crate) struct AnnotationKeys {
    pub(crate) node: String,
    pub(crate) assigned: String,
    pub(crate) time: String,
    idx_prefix: String,
}

impl AnnotationKeys {
    pub(crate) fn new(prefix: &str) -> Self {
        AnnotationKeys {
            node: format!("{prefix}/predicate-node"),
            assigned: format!("{prefix}/gpu-assigned"),
            time: format!("{prefix}/predicate-time"),
            idx_prefix: format!("{prefix}/predicate-gpu-idx-"),
        }
    }

    pub(crate) fn gpu_idx(&self, container: u16) -> String {
        format!("{}{container}", self.idx_prefix)
    }
}

/// Why a pod was left out of the cache. Pods without GPUs are simply not kept.
#[derive(Debug, thiserror::Error)]
pub enum SkipReason {
    #[error("pod asks for no GPU")]
    NoGpu,
    #[error("pod has finished")]
    Terminal,
    #[error(transparent)]
    BadRequest(#[from] crate::placement::RequestError),
}

impl CachedPod {
    pub fn from_pod(pod: &Pod, projection: &Projection) -> Result<Self, SkipReason> {
        let (names, keys) = (&projection.names, &projection.keys);
        if is_terminal(pod) {
            return Err(SkipReason::Terminal);
        }
        let mut request = GpuRequest::from_pod(pod, names)?.ok_or(SkipReason::NoGpu)?;
        // Built by pushing, with room for four: a cached pod keeps only what it holds.
        request.containers.shrink_to_fit();
        request.sidecars.shrink_to_fit();
        request.mig.shrink_to_fit();
        let annotations = pod.metadata.annotations.as_ref();
        let annotation = |key: &str| annotations.and_then(|a| a.get(key)).map(String::as_str);
        let node_name = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .filter(|n| !n.is_empty());
        let node = node_name
            .or_else(|| annotation(&keys.node))
            .filter(|n| !n.is_empty())
            .map(Arc::from);
        let assignment = read_assignment(&request, |c| annotation(&keys.gpu_idx(c)));
        Ok(CachedPod {
            uid: pod.metadata.uid.as_deref().unwrap_or_default().into(),
            request,
            node,
            bound: node_name.is_some(),
            assignment,
            held_since: None,
            recorded: false,
            models: WantedModels::of_pod(
                pod,
                &projection.type_annotation,
                &projection.labels.model,
                None,
                &[],
            )
            .models,
            created: charged_second(pod),
            gated: is_gated(pod),
            priority: pod
                .spec
                .as_ref()
                .and_then(|s| s.priority)
                .unwrap_or_default(),
            marked_borrowed: annotation(crate::quota::cohort::BORROWED_ANNOTATION).is_some(),
            owner: controller_uid(pod),
            seldom: Seldom {
                terminating: charged_until(pod),
                unscheduled: unscheduled_fingerprint(pod),
                claim_names: claim_names(pod),
                waiting: waiting_shown(pod),
                plan_hold: plan_hold(pod, projection.hold_seconds).map(Arc::new),
            }
            .boxed(),
        })
    }
}

impl CachedPod {
    /// Whether its charge counts at `now` (unix seconds). A pod being deleted still
    /// runs its containers, holding their GPUs, for as long as its grace period: it counts
    /// until its deletion time plus that grace period has passed, as Kubernetes'
    /// ResourceQuota counts it (docs/design.md, "How long a pod counts"), whatever grace
    /// the tenant gave it.
    pub(super) fn charged_at(&self, now: i64) -> bool {
        self.terminating().is_none_or(|until| now <= until)
    }

    /// Being deleted (`deletionTimestamp` set): the unix second until which it is still
    /// charged, its deletion time plus its grace period (`i64::MAX` without one), as
    /// Kubernetes' ResourceQuota counts it; see [`CachedPod::charged_at`]. It holds its
    /// GPUs on its node until it is gone.
    pub(crate) fn terminating(&self) -> Option<i64> {
        self.seldom.as_ref()?.terminating
    }

    /// A fingerprint of the scheduler's latest "not scheduled" condition (0: none). When it
    /// changes, the scheduler has given the pod up: a hold the filter made is released.
    pub(super) fn unscheduled(&self) -> u64 {
        self.seldom.as_ref().map_or(0, |s| s.unscheduled)
    }

    /// Its ResourceClaims: those its spec names (`resourceClaims[].resourceClaimName`)
    /// and those made for it from its templates (`status.resourceClaimStatuses`).
    pub(crate) fn claim_names(&self) -> &[Box<str>] {
        self.seldom.as_ref().map_or(&[], |s| &s.claim_names)
    }

    /// Its [`WAITING_CONDITION`], as the pod shows it.
    pub(crate) fn waiting(&self) -> Option<&WaitingShown> {
        self.seldom.as_ref()?.waiting.as_ref()
    }

    /// The defragmentation plan's holds it carries ([`PLAN_HOLD_ANNOTATION`]).
    pub(crate) fn plan_hold(&self) -> Option<&PlanHold> {
        self.seldom.as_ref()?.plan_hold.as_deref()
    }

    /// A test's pod is being deleted, charged until `until`.
    #[cfg(test)]
    pub(super) fn set_terminating(&mut self, until: i64) {
        let mut seldom = self.seldom.take().map(|s| *s).unwrap_or_default();
        seldom.terminating = Some(until);
        self.seldom = seldom.boxed();
    }

    /// A test's scheduler writes a new "not scheduled" condition.
    #[cfg(test)]
    pub(super) fn set_unscheduled(&mut self, fingerprint: u64) {
        let mut seldom = self.seldom.take().map(|s| *s).unwrap_or_default();
        seldom.unscheduled = fingerprint;
        self.seldom = seldom.boxed();
    }
}

/// The plan's holds `pod` carries, when they are read at all (`hold_seconds`: under
/// `defrag.mode: Evict`) and could have been written by the mover for it
/// ([`PlanHold::parse`]).
fn plan_hold(pod: &Pod, hold_seconds: Option<u32>) -> Option<PlanHold> {
    let max = hold_seconds?;
    let text = pod
        .metadata
        .annotations
        .as_ref()?
        .get(PLAN_HOLD_ANNOTATION)?;
    let created = pod.metadata.creation_timestamp.as_ref()?.0.as_second();
    PlanHold::parse(text, max, created)
}

/// Until when a pod being deleted is charged: `deletionTimestamp` (which the API server
/// sets to the request's time plus the grace period) plus `deletionGracePeriodSeconds`,
/// in unix seconds; `i64::MAX` without a grace period; `None` unless it is being deleted.
fn charged_until(pod: &Pod) -> Option<i64> {
    let at = pod.metadata.deletion_timestamp.as_ref()?.0.as_second();
    let grace = pod.metadata.deletion_grace_period_seconds;
    Some(grace.map_or(i64::MAX, |grace| at.saturating_add(grace.max(0))))
}

/// The ResourceClaims of `pod`: those its spec names, and those made for it from its
/// ResourceClaimTemplates (their names are in its status).
pub(crate) fn claim_names(pod: &Pod) -> Box<[Box<str>]> {
    let claims = pod.spec.as_ref().and_then(|s| s.resource_claims.as_deref());
    let named = claims.unwrap_or_default().iter();
    let named = named.filter_map(|c| c.resource_claim_name.as_deref());
    let made = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_deref());
    let made = made.unwrap_or_default().iter();
    let made = made.filter_map(|c| c.resource_claim_name.as_deref());
    let mut names: Vec<Box<str>> = named.chain(made).map(Box::from).collect();
    names.sort();
    names.dedup();
    names.into()
}

/// Whether the quota queue holds `pod` (its scheduling gates include
/// [`QUOTA_GATE`](crate::quota::queue::QUOTA_GATE)).
pub(crate) fn is_gated(pod: &Pod) -> bool {
    let gates = pod
        .spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_deref());
    let gates = gates.unwrap_or_default();
    gates
        .iter()
        .any(|g| g.name == crate::quota::queue::QUOTA_GATE)
}

/// The second the pod's admission charge was made: the one its release annotation
/// names when it was let out of the quota queue (only gpu-admission writes it: the
/// validating webhook refuses it from anyone else), else its `creationTimestamp`.
fn charged_second(pod: &Pod) -> i64 {
    let annotations = pod.metadata.annotations.as_ref();
    let released = annotations.and_then(|a| a.get(crate::quota::queue::RELEASED_ANNOTATION));
    let released = released.and_then(|text| crate::quota::pending::parse_second(text).ok());
    released.unwrap_or_else(|| created_second(pod))
}

/// `creationTimestamp` in unix seconds; 0 when absent.
pub(super) fn created_second(pod: &Pod) -> i64 {
    pod.metadata
        .creation_timestamp
        .as_ref()
        .map_or(0, |t| t.0.as_second())
}

/// A fingerprint of the `PodScheduled=False` condition kube-scheduler writes when an
/// attempt fails (it rewrites it only when something in it changes); 0 when absent.
fn unscheduled_fingerprint(pod: &Pod) -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    let Some(condition) = conditions
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
    else {
        return 0;
    };
    let mut hasher = foldhash::fast::FixedState::with_seed(0).build_hasher();
    condition.reason.hash(&mut hasher);
    condition.message.hash(&mut hasher);
    condition
        .last_transition_time
        .as_ref()
        .map(|t| t.0.as_second())
        .hash(&mut hasher);
    hasher.finish().max(1)
}

/// The pod's [`WAITING_CONDITION`], when it has one.
fn waiting_shown(pod: &Pod) -> Option<WaitingShown> {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    let condition = conditions
        .into_iter()
        .flatten()
        .find(|c| c.type_ == WAITING_CONDITION)?;
    Some(WaitingShown {
        waits: condition.status == "True",
        reason: condition.reason.as_deref().unwrap_or_default().into(),
        message: message_fingerprint(condition.message.as_deref().unwrap_or_default()),
    })
}

/// The uid of the pod's controlling ownerReference.
fn controller_uid(pod: &Pod) -> Option<Box<str>> {
    let owners = pod.metadata.owner_references.as_deref().unwrap_or_default();
    let controller = owners.iter().find(|o| o.controller == Some(true))?;
    Some(controller.uid.as_str().into())
}

fn is_terminal(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// GPU indices from the predicate-gpu-idx annotations; `None` unless every GPU container
/// has a well-formed one with the right number of GPUs. The annotations cover the app
/// containers only: what the pod holds for its init containers is left for the node's
/// accounting to place (`ClusterState::recompute`).
fn read_assignment<'a>(
    request: &GpuRequest,
    annotation: impl Fn(u16) -> Option<&'a str>,
) -> Option<Assignment> {
    let mut choices = Vec::with_capacity(request.containers.len());
    for container in &request.containers {
        let text = annotation(container.container)?;
        let gpus: Vec<u8> = text
            .split(',')
            .map(|part| part.trim().parse::<u8>())
            .collect::<Result<_, _>>()
            .ok()?;
        let expected = match container.demand {
            crate::placement::GpuDemand::Share { .. } => 1,
            crate::placement::GpuDemand::Whole { gpus } => gpus as usize,
        };
        if gpus.len() != expected {
            return None;
        }
        choices.push(GpuChoice {
            container: container.container,
            demand: container.demand,
            gpus,
        });
    }
    Some(Assignment {
        choices,
        held: Vec::new(),
    })
}
