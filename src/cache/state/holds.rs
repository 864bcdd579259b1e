//! The filter transaction's half in memory: which pod a call places (`Subject`), the
//! hold on the GPUs chosen for it (`Hold`), keeping a placement a re-filter
//! finds, the expiry of holds the scheduler never bound, and rollback.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cache::pod::{CachedPod, PodKey};
use crate::placement::{
    Assignment, GpuRequest, Misfit, NodeGpus, Outcome, PlacementMemo, Placer, Stamp,
    place_versioned,
};

use foldhash::HashMap;

use super::index::fits_indices;
use super::reserved::Reserved;
use super::{ClusterState, NodeEntry};

/// How long a placement the filter holds in memory waits for the scheduler's bind call.
/// Letting go early is safe (bind places again on the node it is given, or refuses);
/// holding on keeps GPUs idle for a pod the scheduler gave up on.
pub(crate) const HOLD_TTL: Duration = Duration::from_secs(30);

/// A placement the filter made: the node, its GPUs, and what to restore if recording
/// the choice on the pod fails.
#[derive(Debug, Clone)]
pub(crate) struct Hold {
    pub(crate) node: Arc<str>,
    pub(crate) assignment: Assignment,
    /// True when the pod already held this placement (a re-filter): nothing to write.
    pub(crate) kept: bool,
    previous: Option<CachedPod>,
}

/// What one filter call decided: the hold, if any; when there is none, every
/// candidate that could not take the pod, by name (a placed pod's answer names only
/// its node, so nothing gathers reasons nobody reads).
#[derive(Debug)]
pub(crate) struct FilterDecision {
    pub(crate) hold: Option<Hold>,
    pub(crate) misfits: Vec<(Arc<str>, Misfit)>,
}

impl FilterDecision {
    fn none(misfits: Vec<(Arc<str>, Misfit)>) -> Self {
        FilterDecision {
            hold: None,
            misfits,
        }
    }
}

/// What the cache held for a pod before a filter call took it as its subject.
#[derive(Debug)]
pub(crate) struct Held(Option<CachedPod>);

/// Which pod a filter call places.
#[derive(Debug)]
// One per filter call, moved into the cache at once: the size of the offered pod costs
// nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum Subject {
    /// A pod the cluster has, named by the request (API mode). The cache's copy is the
    /// truth; the request's copy is not read.
    Known { uid: Box<str> },
    /// A pod the caller offers (offline mode: the file is the cluster).
    /// Boxed: a pod is ten times the size of a uid.
    Offered(Box<CachedPod>),
}

/// Why a filter call cannot place the pod it names at all (answered as the
/// extender's `Error`, so the scheduler retries the pod later).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PlanError {
    #[error(
        "pod {pod} is not in gpu-admission's view of the cluster (not created, or not seen yet)"
    )]
    NotInCluster { pod: String },
    #[error("pod {pod} has uid {cluster} in the cluster, not {request}")]
    OtherUid {
        pod: String,
        cluster: String,
        request: String,
    },
    #[error("pod {pod} is already bound to node {node}")]
    AlreadyBound { pod: String, node: String },
}

impl ClusterState {
    /// Choose a node for a pod among `candidates` and hold its GPUs, atomically with
    /// respect to every other call. `subject` says which pod: one the cluster shows (API
    /// mode: the request names it, the cache's copy is what gets placed) or one the
    /// caller offers (offline mode: the file is the cluster, and a new pod joins it
    /// only once placed). A pod that already holds a placement on a candidate keeps
    /// it; one placed elsewhere is released and placed anew, so a re-filter never
    /// charges twice. `choose` runs the placement policy.
    #[cfg(test)]
    pub(crate) fn hold(
        &mut self,
        key: &PodKey,
        subject: Subject,
        candidates: &[&str],
        choose: impl FnMut(&CachedPod, &mut Candidates<'_>) -> Outcome,
        now: Instant,
    ) -> Result<FilterDecision, PlanError> {
        let held = self.take_subject(key, subject)?;
        Ok(self.place_subject(key, held, candidates, choose, now))
    }

    /// [`ClusterState::hold`]'s second half, for a caller that reads the pod in
    /// between (the extender reads the ledger only for pods that need it): `held` is
    /// what [`ClusterState::take_subject`] returned.
    pub(crate) fn place_subject(
        &mut self,
        key: &PodKey,
        held: Held,
        candidates: &[&str],
        mut choose: impl FnMut(&CachedPod, &mut Candidates<'_>) -> Outcome,
        now: Instant,
    ) -> FilterDecision {
        let previous = held.0;
        self.expire_holds(now);
        if let Some(kept) = self.keep_existing(key, candidates) {
            return kept;
        }
        if let Some(mut released) = previous.clone().filter(|p| p.node.is_some()) {
            released.node = None;
            released.assignment = None;
            released.held_since = None;
            released.recorded = false;
            self.put_pod(key.clone(), released);
        }
        let reserved = self.reserved_against(key, crate::quota::pending::now_second());
        let Some(pod) = self.pods.get(key) else {
            return FilterDecision::none(Vec::new());
        };
        // A node a plan keeps for this pod is tried alone first.
        let preferred = reserved.preferred.as_deref();
        let preferred = preferred.filter(|p| candidates.contains(p));
        let mut tried = None;
        if let Some(preferred) = preferred {
            let (nodes, stamps) = gather(&self.nodes, &[preferred], &reserved, &mut Vec::new());
            let mut known = Candidates {
                nodes,
                stamps,
                memo: &mut self.memo,
            };
            let outcome = choose(pod, &mut known);
            tried = outcome
                .chosen
                .is_some()
                .then_some((outcome, known.nodes, Vec::new()));
        }
        let (outcome, known, mut misfits) = match tried {
            Some(tried) => tried,
            None => {
                let mut misfits = Vec::new();
                let (nodes, stamps) = gather(&self.nodes, candidates, &reserved, &mut misfits);
                let mut known = Candidates {
                    nodes,
                    stamps,
                    memo: &mut self.memo,
                };
                let outcome = choose(pod, &mut known);
                (outcome, known.nodes, misfits)
            }
        };
        let Some((index, assignment)) = outcome.chosen else {
            misfits.extend(
                outcome
                    .misfits
                    .into_iter()
                    .map(|(i, m)| (known[i].name.clone(), m)),
            );
            if previous.is_none() {
                // Offered and not placed: the cache keeps only what the cluster has.
                self.delete_pod(key);
            }
            return FilterDecision::none(misfits);
        };
        let node = known[index].name.clone();
        if let Some(mut pod) = self.pods.get(key).cloned() {
            pod.node = Some(node.clone());
            pod.assignment = Some(assignment.clone());
            pod.held_since = Some(now);
            pod.recorded = false;
            self.put_pod(key.clone(), *pod);
            self.holds.push_back((now, key.clone()));
        }
        FilterDecision {
            hold: Some(Hold {
                node,
                assignment,
                kept: false,
                previous,
            }),
            misfits: Vec::new(),
        }
    }

    /// Let go of placements held longer than [`HOLD_TTL`] that no bind (and no
    /// annotation coming back through the watch) confirmed.
    fn expire_holds(&mut self, now: Instant) {
        while let Some((at, _)) = self.holds.front() {
            if now.saturating_duration_since(*at) < HOLD_TTL {
                break;
            }
            let Some((at, key)) = self.holds.pop_front() else {
                break;
            };
            let Some(pod) = self.pods.get(&key) else {
                continue;
            };
            if pod.held_since == Some(at) && !pod.bound {
                tracing::info!(pod = %key, "placement held for a bind that never came; released");
                self.drop_hold(&key);
            }
        }
    }

    /// The binding of a held placement went through: the pod is bound (the watch will
    /// show it; until then the cache keeps the placement as it is).
    pub(crate) fn mark_bound(&mut self, key: &str) {
        if let Some(pod) = self.pods.get_mut(key) {
            pod.bound = true;
        }
    }

    /// The filter wrote the placement held for pod `key` onto the pod, and took the
    /// quota charge it adds (see [`CachedPod::recorded`]).
    /// The watch may have brought the write's echo already (the pod then no longer
    /// `held_since`): the record holds for the placement the pod has either way.
    pub(crate) fn mark_recorded(&mut self, key: &str) {
        if let Some(pod) = self.pods.get_mut(key).filter(|p| p.node.is_some()) {
            pod.recorded = true;
        }
    }

    /// Whether the placement pod `key` holds is one our filter wrote with its charge.
    /// Placement annotations on the pod object alone do not say so: the pod's owner can
    /// put them there, and the bind must then charge.
    pub(crate) fn placement_recorded(&self, key: &str) -> bool {
        self.pod(key)
            .is_some_and(|p| p.node.is_some() && p.recorded)
    }

    /// Let go of the placement held in memory for a pod (its bind failed). A placement
    /// the cluster shows (annotations, or a binding) is not ours to drop.
    pub(crate) fn drop_hold(&mut self, key: &str) {
        let Some(pod) = self
            .pods
            .get(key)
            .filter(|p| p.held_since.is_some() && !p.bound)
        else {
            return;
        };
        let mut released = pod.clone();
        released.node = None;
        released.assignment = None;
        released.held_since = None;
        released.recorded = false;
        let key: PodKey = key.into();
        self.put_pod(key, *released);
    }

    /// Undo a hold whose recording failed: a pod only offered by the call leaves
    /// the cache again; any other loses the hold, as [`drop_hold`](Self::drop_hold)
    /// (not put back as it was before: the watch may have brought news of it meanwhile).
    pub(crate) fn rollback(&mut self, key: &PodKey, hold: Hold) {
        let held = self.pods.get(&**key);
        if !held.is_some_and(|p| p.held_since.is_some() && !p.bound) {
            return;
        }
        match hold.previous {
            Some(_) => self.drop_hold(key),
            None => self.delete_pod(key),
        }
    }

    /// The pod to place, checked: it must be the pod the cluster has (same uid) and not
    /// yet bound. Afterwards the cache holds it under `key`; the result remembers what
    /// the cache held before (nothing for a pod just offered).
    pub(crate) fn take_subject(
        &mut self,
        key: &PodKey,
        subject: Subject,
    ) -> Result<Held, PlanError> {
        self.subject(key, subject).map(Held)
    }

    fn subject(&mut self, key: &PodKey, subject: Subject) -> Result<Option<CachedPod>, PlanError> {
        let held = match subject {
            Subject::Known { uid } => {
                let held = self.pods.get(key).ok_or_else(|| PlanError::NotInCluster {
                    pod: key.to_string(),
                })?;
                if *held.uid != *uid {
                    return Err(PlanError::OtherUid {
                        pod: key.to_string(),
                        cluster: held.uid.to_string(),
                        request: uid.to_string(),
                    });
                }
                held
            }
            Subject::Offered(incoming) => match self.pods.get(key) {
                // The same name with the same (or no) uid: the pod the file holds.
                Some(old)
                    if incoming.uid.is_empty() || old.uid.is_empty() || old.uid == incoming.uid =>
                {
                    old
                }
                // Another pod of that name is in the file: a call naming another uid is
                // not about it, and never replaces it (nor frees what it holds).
                Some(old) => {
                    return Err(PlanError::OtherUid {
                        pod: key.to_string(),
                        cluster: old.uid.to_string(),
                        request: incoming.uid.to_string(),
                    });
                }
                // A pod the file does not have.
                None => {
                    check_unbound(key, &incoming)?;
                    self.put_pod(key.clone(), *incoming);
                    return Ok(None);
                }
            },
        };
        check_unbound(key, held)?;
        Ok(Some((**held).clone()))
    }

    fn keep_existing(&self, key: &PodKey, candidates: &[&str]) -> Option<FilterDecision> {
        let pod = self.pods.get(key)?;
        let node = pod.node.clone()?;
        let assignment = pod.assignment.clone()?;
        let gpus = self.node(&node)?;
        if !candidates.contains(&&*node) || !fits_indices(&assignment, gpus.gpu_count()) {
            return None;
        }
        Some(FilterDecision {
            hold: Some(Hold {
                node,
                assignment,
                kept: true,
                previous: Some((**pod).clone()),
            }),
            misfits: Vec::new(),
        })
    }
}

/// The candidates of a filter call that the cache knows, in the request's order: each
/// node's GPUs (the slice this derefs to) and stamp, and what placement kept from
/// earlier calls.
pub(crate) struct Candidates<'a> {
    nodes: Vec<&'a NodeGpus>,
    stamps: Vec<Stamp>,
    memo: &'a mut PlacementMemo,
}

impl<'a> std::ops::Deref for Candidates<'a> {
    type Target = [&'a NodeGpus];
    fn deref(&self) -> &Self::Target {
        &self.nodes
    }
}

impl Candidates<'_> {
    /// `placement::place` over these candidates, reusing the evaluations of nodes that
    /// have not changed since an earlier call with the same placer and request.
    pub(crate) fn place(
        &mut self,
        placer: &Placer,
        request: &GpuRequest,
        allowed: impl Fn(&NodeGpus) -> Result<(), Misfit>,
    ) -> Outcome {
        place_versioned(
            placer,
            request,
            &self.nodes,
            &self.stamps,
            allowed,
            self.memo,
        )
    }
}

/// The candidates `names` the cache knows, each as the pod may see it (with what
/// plans keep from it: never memoized, stamp version 0), with their stamps; those it
/// does not know go to `misfits`.
fn gather<'a>(
    nodes: &'a HashMap<Arc<str>, NodeEntry>,
    names: &[&str],
    reserved: &'a Reserved,
    misfits: &mut Vec<(Arc<str>, Misfit)>,
) -> (Vec<&'a NodeGpus>, Vec<Stamp>) {
    let mut known = (
        Vec::with_capacity(names.len()),
        Vec::with_capacity(names.len()),
    );
    for name in names {
        let entry = nodes
            .get(*name)
            .and_then(|e| Some((e.gpus.as_ref()?, e.stamp)));
        let Some((gpus, stamp)) = entry else {
            misfits.push((Arc::from(*name), Misfit::NotCached));
            continue;
        };
        match reserved.nodes.get(*name) {
            Some(kept) => {
                known.0.push(kept);
                known.1.push(Stamp {
                    version: 0,
                    ..stamp
                });
            }
            None => {
                known.0.push(gpus);
                known.1.push(stamp);
            }
        }
    }
    known
}

fn check_unbound(key: &PodKey, pod: &CachedPod) -> Result<(), PlanError> {
    match pod.node.as_deref().filter(|_| pod.bound) {
        Some(node) => Err(PlanError::AlreadyBound {
            pod: key.to_string(),
            node: node.to_string(),
        }),
        None => Ok(()),
    }
}
