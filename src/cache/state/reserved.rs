//! What defragmentation plans keep from a pod the filter places (docs/defrag.md,
//! "Holds"): the GPUs a plan freed are kept for its pending pod, and each moved pod's
//! destination for its replacement, until the hold's `until`. The pod a hold is for is
//! placed without it, on its node if it fits there.

use std::sync::Arc;

use foldhash::HashMap;

use crate::cache::plan_hold::{GpusKept, PlanHold};
use crate::cache::pod::{CachedPod, PodKey};
use crate::placement::NodeGpus;

use super::ClusterState;

/// What the standing holds mean for one pod.
#[derive(Debug, Default)]
pub(crate) struct Reserved {
    /// The nodes with GPUs kept from the pod, each as the pod may see it.
    pub(crate) nodes: HashMap<Arc<str>, NodeGpus>,
    /// A node kept for the pod itself: tried first.
    pub(super) preferred: Option<Arc<str>>,
}

impl ClusterState {
    /// Remember (or forget) that the pod `key` carries a plan's holds.
    pub(super) fn index_plan_hold(&mut self, key: &PodKey, pod: &CachedPod) {
        match pod.plan_hold().is_some() {
            true => self.plan_holders.insert(key.clone()),
            false => self.plan_holders.remove(key),
        };
    }

    /// The holds standing at `now` (unix seconds), with the pod that carries each: a
    /// hold stands only while its pod is charged (neither waiting in the quota queue,
    /// charged nothing, nor being deleted) and within its time (`PlanHold::stands`).
    /// Holds were read from the pod only if the mover runs here and could have written
    /// them (`Projection::hold_seconds`).
    pub(crate) fn plan_holds(
        &self,
        now: i64,
    ) -> impl Iterator<Item = (&PodKey, &CachedPod, &PlanHold)> {
        self.plan_holders.iter().filter_map(move |key| {
            let (key, pod) = self.pods.get_key_value(key)?;
            let charged = !pod.gated && pod.terminating().is_none();
            let hold = pod.plan_hold().filter(|h| charged && h.stands(now))?;
            Some((key, &**pod, hold))
        })
    }

    /// What the standing holds keep from the pod `key` at `now`, and the node one of
    /// them keeps for it.
    pub(crate) fn reserved_against(&self, key: &str, now: i64) -> Reserved {
        if self.plan_holders.is_empty() {
            return Reserved::default();
        }
        match self.pods.get(key) {
            Some(subject) => self.reserved(Some((key, subject)), now),
            None => Reserved::default(),
        }
    }

    /// What the standing holds keep from any pod none of them is for: the nodes a new
    /// defragmentation plan is made around, so that it never counts on GPUs another plan
    /// keeps (and a plan under way defers no other).
    pub(crate) fn held_from_others(&self, now: i64) -> HashMap<Arc<str>, NodeGpus> {
        if self.plan_holders.is_empty() {
            return HashMap::default();
        }
        self.reserved(None, now).nodes
    }

    fn reserved(&self, subject: Option<(&str, &CachedPod)>, now: i64) -> Reserved {
        let mut reserved = Reserved::default();
        let takes = |slot: &crate::cache::plan_hold::Slot| {
            subject.is_some_and(|(key, pod)| {
                slot.takes(key, &pod.uid, pod.owner.as_deref(), &pod.request)
            })
        };
        let mut kept: Vec<&GpusKept> = Vec::new();
        for (holder, pod, hold) in self.plan_holds(now) {
            if subject.is_some_and(|(key, _)| &**holder == key) {
                reserved.preferred = Some(hold.target.node.as_str().into());
            } else if !pod.bound && pod.node.is_none() {
                kept.push(&hold.target);
            }
            for slot in &hold.slots {
                if takes(slot) {
                    reserved.preferred = Some(slot.held.node.as_str().into());
                } else if !self.slot_filled(slot, hold.since) {
                    kept.push(&slot.held);
                }
            }
        }
        for held in kept {
            let Some(gpus) = self.node(&held.node) else {
                continue;
            };
            let node = reserved
                .nodes
                .entry(gpus.name.clone())
                .or_insert_with(|| gpus.clone());
            held.occupy(node);
        }
        reserved
    }

    /// Whether a replacement created since the plan began is bound on the slot's node.
    fn slot_filled(&self, slot: &crate::cache::plan_hold::Slot, since: i64) -> bool {
        let Some(entry) = self.nodes.get(&*slot.held.node) else {
            return false;
        };
        entry.pods.iter().any(|key| {
            self.pods.get(key).is_some_and(|p| {
                p.bound
                    && p.created >= since
                    && slot.takes(key, &p.uid, p.owner.as_deref(), &p.request)
            })
        })
    }
}
