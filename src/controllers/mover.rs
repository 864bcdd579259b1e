//! `defrag.mode: Evict` (docs/defrag.md, "Evict"): carrying one plan out. First the
//! plan's holds go onto the pending pod (the freed GPUs for it, each destination for
//! the moved pod's replacement; every replica's extender keeps them), then each move in
//! order: the live pods are read again and the move is made only if it still stands,
//! through the Eviction API (PodDisruptionBudgets are checked once more by the API
//! server). The first move that no longer stands, or whose eviction is refused, ends the
//! plan and frees its holds. So no pod is evicted without a plan, none beyond it, and
//! none the rules would keep.
//!
//! [`carry_out`] is the order of those steps, over [`Hands`] that act on the cluster
//! (`KubeHands`; the tests' record what was asked of them).

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, EvictParams, Patch, PatchParams, Preconditions};

use crate::cache::plan_hold::{PLAN_HOLD_ANNOTATION, PlanHold};
use crate::cache::pod::key_parts;
use crate::snapshot::MOVABLE_ANNOTATION;

use super::skeleton::bounded;

/// A plan ready to be carried out: the pending pod, and the moves with their holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Carried {
    /// The pending pod, `namespace/name`, and its uid.
    pub(crate) pod: String,
    pub(crate) uid: String,
    /// In order. `hold.slots[i]` is the destination of move i.
    pub(crate) moves: Vec<Move>,
    pub(crate) hold: PlanHold,
}

/// One move of a plan: the pod (`namespace/name`), the node it leaves, its uid and its
/// controller's uid, against which the live pod is checked before it is evicted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Move {
    pub(crate) pod: String,
    pub(crate) from: String,
    pub(crate) uid: String,
    pub(crate) owner: String,
}

impl Carried {
    /// Move `index`'s pod as the pending pod's tenant is told of it.
    fn shown(&self, index: usize) -> String {
        let namespace = key_parts(&self.pod).0;
        crate::cache::pod::shown_to(namespace, &self.moves[index].pod)
    }
}

/// Why a move no longer stands when it comes to it. The pods are named as the pending
/// pod's tenant is told of them ([`crate::cache::pod::shown_to`]): the text goes into an
/// Event on its pod.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Stale {
    #[error("pod {0} is gone or was created again")]
    Gone(String),
    #[error("pod {0} is being deleted")]
    Deleting(String),
    #[error("the pending pod {0} was placed or bound meanwhile")]
    Placed(String),
    #[error("the pending pod {0} no longer carries this plan's holds")]
    HoldLost(String),
    #[error("pod {pod} is no longer on node {node}")]
    Moved { pod: String, node: String },
    #[error("pod {0} no longer opts in ({MOVABLE_ANNOTATION})")]
    OptedOut(String),
    #[error("pod {0} has another controller now")]
    OtherController(String),
    #[error("pod {pod} has priority {priority}, above the pending pod's {pending}")]
    Priority {
        pod: String,
        priority: i32,
        pending: i32,
    },
    #[error("reading pod {pod}: {error}")]
    Unread { pod: String, error: String },
}

/// How one eviction ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Evicted {
    Yes,
    /// The API server refused it: a budget allows no disruption (429), or the pod is
    /// gone or changed (404, 409).
    Refused(String),
    /// It could not be asked (network, 5xx): the plan ends all the same.
    Failed(String),
}

/// How a plan ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Every move was made; the holds stand until the pending pod binds or they lapse.
    Moved,
    /// Stopped before move `after` (0: before any), holds freed; why.
    Aborted { after: usize, why: String },
}

/// What carrying a plan out does to the cluster.
pub(crate) trait Hands {
    /// Put the plan's holds on the pending pod; `false` if that could not be done.
    async fn hold(&mut self, plan: &Carried) -> bool;
    /// Read the live pods again: does move `index` still stand?
    async fn recheck(&mut self, plan: &Carried, index: usize) -> Result<(), Stale>;
    async fn evict(&mut self, plan: &Carried, index: usize) -> Evicted;
    /// Take the plan's holds off the pending pod again.
    async fn release(&mut self, plan: &Carried);
}

/// Carry `plan` out: hold, then each move in order, re-checked, then evicted; the
/// first one that fails ends the plan and frees its holds.
pub(crate) async fn carry_out(hands: &mut impl Hands, plan: &Carried) -> Ended {
    if plan.moves.len() != plan.hold.slots.len() || plan.moves.is_empty() {
        let why = "the plan's moves and holds do not match".to_string();
        return Ended::Aborted { after: 0, why };
    }
    if !hands.hold(plan).await {
        // The write may have landed all the same (a timeout): taken off again.
        hands.release(plan).await;
        let why = "its holds could not be written on the pending pod".to_string();
        return Ended::Aborted { after: 0, why };
    }
    for index in 0..plan.moves.len() {
        let why = match hands.recheck(plan, index).await {
            Err(stale) => stale.to_string(),
            Ok(()) => match hands.evict(plan, index).await {
                Evicted::Yes => continue,
                Evicted::Refused(why) | Evicted::Failed(why) => why,
            },
        };
        hands.release(plan).await;
        return Ended::Aborted { after: index, why };
    }
    Ended::Moved
}

/// Whether move `index` of `plan` still stands against the live pending pod and the
/// live moved pod: both the pods the plan was made for, the pending pod unplaced and
/// holding this plan, the moved pod still on its node, opted in, under the same
/// controller, and of priority no higher than the pending pod's.
pub(crate) fn still_stands(
    plan: &Carried,
    index: usize,
    pending: &Pod,
    moved: &Pod,
) -> Result<(), Stale> {
    let step = &plan.moves[index];
    let (key, from) = (&plan.shown(index), &step.from);
    let same = |pod: &Pod, uid: &str| pod.metadata.uid.as_deref() == Some(uid);
    if !same(pending, &plan.uid) {
        return Err(Stale::Gone(plan.pod.clone()));
    }
    if !same(moved, &step.uid) {
        return Err(Stale::Gone(key.clone()));
    }
    for (pod, name) in [(pending, &plan.pod), (moved, key)] {
        if pod.metadata.deletion_timestamp.is_some() {
            return Err(Stale::Deleting(name.clone()));
        }
    }
    fn node(pod: &Pod) -> Option<&str> {
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
    }
    let priority = |pod: &Pod| pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
    if node(pending).is_some() {
        return Err(Stale::Placed(plan.pod.clone()));
    }
    let annotation = |pod: &Pod, name: &str| {
        let annotations = pod.metadata.annotations.as_ref();
        annotations.and_then(|a| a.get(name)).cloned()
    };
    if annotation(pending, PLAN_HOLD_ANNOTATION) != Some(plan.hold.to_text()) {
        return Err(Stale::HoldLost(plan.pod.clone()));
    }
    if node(moved) != Some(from.as_str()) {
        let (pod, node) = (key.clone(), from.clone());
        return Err(Stale::Moved { pod, node });
    }
    if annotation(moved, MOVABLE_ANNOTATION).as_deref() != Some("true") {
        return Err(Stale::OptedOut(key.clone()));
    }
    let owners = moved
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default();
    let controller = owners.iter().find(|o| o.controller == Some(true));
    if controller.map(|o| o.uid.as_str()) != Some(step.owner.as_str()) {
        return Err(Stale::OtherController(key.clone()));
    }
    let (priority, pending) = (priority(moved), priority(pending));
    if priority > pending {
        let pod = key.clone();
        return Err(Stale::Priority {
            pod,
            priority,
            pending,
        });
    }
    Ok(())
}

/// [`Hands`] on the API server.
pub(crate) struct KubeHands {
    pub(crate) client: kube::Client,
}

impl KubeHands {
    fn pods(&self, key: &str) -> (Api<Pod>, String) {
        let (namespace, name) = key_parts(key);
        (
            Api::namespaced(self.client.clone(), namespace),
            name.to_string(),
        )
    }

    /// Read the pod `key`; `shown` is how an error names it.
    async fn read(&self, key: &str, shown: &str) -> Result<Pod, Stale> {
        let (pods, name) = self.pods(key);
        match bounded(pods.get_opt(&name)).await {
            Ok(Some(pod)) => Ok(pod),
            Ok(None) => Err(Stale::Gone(shown.to_string())),
            Err(error) => {
                tracing::warn!(pod = %key, %error, "cannot read a pod of a defragmentation plan");
                Err(Stale::Unread {
                    pod: shown.to_string(),
                    error: "the API server did not answer".to_string(),
                })
            }
        }
    }

    /// Set the hold annotation of the pending pod (`None`: remove it), on its uid.
    async fn annotate(&self, plan: &Carried, text: Option<String>) -> Result<(), kube::Error> {
        let (pods, name) = self.pods(&plan.pod);
        let annotations = serde_json::json!({ PLAN_HOLD_ANNOTATION: text });
        let patch = serde_json::json!({"metadata": {"uid": plan.uid, "annotations": annotations}});
        let params = PatchParams::default();
        bounded(pods.patch(&name, &params, &Patch::Merge(&patch)))
            .await
            .map(drop)
    }
}

impl Hands for KubeHands {
    async fn hold(&mut self, plan: &Carried) -> bool {
        let written = self.annotate(plan, Some(plan.hold.to_text())).await;
        if let Err(error) = &written {
            tracing::warn!(pod = %plan.pod, %error, "cannot hold GPUs for a defragmentation plan");
        }
        written.is_ok()
    }

    async fn recheck(&mut self, plan: &Carried, index: usize) -> Result<(), Stale> {
        let pending = self.read(&plan.pod, &plan.pod).await?;
        let moved = self
            .read(&plan.moves[index].pod, &plan.shown(index))
            .await?;
        still_stands(plan, index, &pending, &moved)
    }

    async fn evict(&mut self, plan: &Carried, index: usize) -> Evicted {
        let key = &plan.moves[index].pod;
        let (pods, name) = self.pods(key);
        let uid = plan.moves[index].uid.clone();
        let key = plan.shown(index);
        let preconditions = Preconditions {
            uid: Some(uid),
            resource_version: None,
        };
        let params = EvictParams {
            delete_options: Some(kube::api::DeleteParams {
                preconditions: Some(preconditions),
                ..Default::default()
            }),
            ..Default::default()
        };
        match bounded(pods.evict(&name, &params)).await {
            Ok(_) => Evicted::Yes,
            Err(kube::Error::Api(status)) if status.code == 429 => Evicted::Refused(format!(
                "evicting {key} was refused: a PodDisruptionBudget allows no disruption now"
            )),
            // The API server's own words name the pod: the reason alone is told.
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {
                tracing::info!(pod = %plan.moves[index].pod, message = %status.message, "eviction refused");
                Evicted::Refused(format!("evicting {key} was refused: {}", status.reason))
            }
            Err(error) => {
                tracing::warn!(pod = %plan.moves[index].pod, %error, "eviction failed");
                Evicted::Failed(format!(
                    "evicting {key} failed: the API server did not answer"
                ))
            }
        }
    }

    async fn release(&mut self, plan: &Carried) {
        if let Err(error) = self.annotate(plan, None).await {
            // The hold lapses at its `until` all the same.
            tracing::warn!(pod = %plan.pod, %error, "cannot free a defragmentation plan's holds");
        }
    }
}

#[cfg(test)]
#[path = "mover_tests.rs"]
mod tests;
