//! Nodes and pods as they arrive, change and leave: each node's GPU use recomputed
//! from the pods on it, its placement stamp renewed, and the model labels counted by
//! the nodes' creation second.

use std::sync::Arc;
use std::time::Instant;

use crate::cache::pod::{CachedPod, PodKey};
use crate::placement::fit::fit_held;
use crate::placement::{Assignment, NodeGpus, Stamp, fit};

use super::{ClusterState, NodeEntry, UNCONFIRMED_HOLD_TTL, namespace_of};

impl ClusterState {
    /// Count (`add`) or uncount a node's model label, by the node's creation second.
    fn count_label(&mut self, label: Option<Arc<str>>, created: i64, add: bool) {
        let Some(label) = label else {
            return;
        };
        let births = self.model_labels.entry(label.clone()).or_default();
        let count = births.entry(created).or_default();
        match add {
            true => *count += 1,
            false => *count = count.saturating_sub(1),
        }
        if *count == 0 {
            births.remove(&created);
        }
        if births.is_empty() {
            self.model_labels.remove(&label);
        }
    }

    // === nodes ===

    pub fn apply_node(&mut self, gpus: NodeGpus) {
        let name = gpus.name.clone();
        let old = self.node(&name).map(|old| (old.model.clone(), old.created));
        let model_changed = old
            .as_ref()
            .is_none_or(|(model, created)| *model != gpus.model || *created != gpus.created);
        if model_changed {
            if let Some((model, created)) = old {
                self.count_label(model, created, false);
            }
            self.count_label(gpus.model.clone(), gpus.created, true);
        }
        self.versions += 1;
        let version = self.versions;
        let entry = self.entry(name.clone());
        let same_shape = entry.gpus.as_ref().is_some_and(|old| {
            old.gpu_count() == gpus.gpu_count() && old.memory_per_gpu == gpus.memory_per_gpu
        });
        match (&mut entry.gpus, same_shape) {
            (Some(old), true) => {
                old.created = gpus.created;
                old.model = gpus.model;
                old.pool = gpus.pool;
                old.mig_slices = gpus.mig_slices;
                old.closed = gpus.closed;
                entry.stamp.version = version;
            }
            _ => {
                entry.gpus = Some(gpus);
                self.recompute(&name);
            }
        }
        if model_changed {
            self.recharge_node(&name);
        }
    }

    pub(crate) fn delete_node(&mut self, name: &str) {
        if let Some((model, created)) = self.node(name).map(|n| (n.model.clone(), n.created)) {
            self.count_label(model, created, false);
        }
        if let Some(entry) = self.nodes.get_mut(name) {
            entry.gpus = None;
        }
        self.recharge_node(name);
        self.drop_empty(name);
    }

    /// Replace all nodes with a complete list (a relist).
    pub(crate) fn replace_nodes(&mut self, nodes: Vec<NodeGpus>) {
        let names: Vec<Arc<str>> = self.nodes.keys().cloned().collect();
        let fresh: std::collections::HashSet<Arc<str>> =
            nodes.iter().map(|n| n.name.clone()).collect();
        for name in names.iter().filter(|n| !fresh.contains(*n)) {
            self.delete_node(name);
        }
        for node in nodes {
            self.apply_node(node);
        }
    }

    // === pods ===

    /// Insert or update a pod as the cluster shows it. A pod object that does not yet
    /// show our hold (the annotation patch is still on its way) keeps it.
    ///
    /// Once a pod is bound with its GPUs known, they stay what they were: gpu-manager
    /// has acted on them, and the pod's owner can still edit its annotations, which
    /// must not move (or free) GPUs in this view.
    pub fn apply_pod(&mut self, key: PodKey, mut pod: CachedPod) {
        let arrives = !self.pods.contains_key(&key);
        if let Some(old) = self.pods.get(&key) {
            let same_pod = old.uid == pod.uid || old.uid.is_empty() || pod.uid.is_empty();
            // The scheduler wrote a new "not scheduled" condition: it gave the pod up, and
            // a placement held for its bind goes with it.
            let given_up = pod.unscheduled() != 0 && pod.unscheduled() != old.unscheduled();
            if old.held_since.is_some() && pod.node.is_none() && same_pod && !given_up {
                pod.node = old.node.clone();
                pod.assignment = old.assignment.clone();
                pod.held_since = old.held_since;
                pod.recorded = old.recorded;
                pod.bound = old.bound;
            }
            // The watch's echo of the placement our filter wrote (same pod, same node):
            // still ours, its charge taken. Annotations we did not write never count.
            if old.recorded && same_pod && pod.node == old.node {
                pod.recorded = true;
            }
            let settled = old.bound && old.assignment.is_some() && old.uid == pod.uid;
            if settled && pod.node == old.node {
                pod.assignment = old.assignment.clone();
            }
        }
        self.put_pod(key.clone(), pod);
        if arrives && !self.claims.is_empty() {
            // A claim that serves this pod's extended resources is charged to the pod.
            let (namespace, name) = key.split_once('/').unwrap_or_default();
            self.recharge_extended(namespace, name);
        }
    }

    pub(crate) fn delete_pod(&mut self, key: &str) {
        let namespace = namespace_of(key);
        self.remember_departure(namespace, key);
        let Some(old) = self.pods.remove(key) else {
            return;
        };
        self.plan_holders.remove(key);
        self.tally.discharge(key, namespace);
        self.waiting.remove(key);
        self.deleting.remove(key);
        if let Some(keys) = self.by_namespace.get_mut(namespace) {
            keys.remove(key);
            if keys.is_empty() {
                self.by_namespace.remove(namespace);
            }
        }
        if let Some(node) = old.node {
            self.unlink(&node, key);
        }
    }

    /// Replace all pods with a complete list (a relist). Recent holds of pods the
    /// list does not hold yet survive; older ones belonged to pods that are gone.
    pub(crate) fn replace_pods(&mut self, pods: Vec<(PodKey, CachedPod)>, now: Instant) {
        let listed: std::collections::HashSet<PodKey> =
            pods.iter().map(|(k, _)| k.clone()).collect();
        let stale: Vec<PodKey> = self
            .pods
            .iter()
            .filter(|(key, pod)| {
                !listed.contains(*key)
                    && pod
                        .held_since
                        .is_none_or(|at| now.duration_since(at) >= UNCONFIRMED_HOLD_TTL)
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in stale {
            self.delete_pod(&key);
        }
        for (key, pod) in pods {
            self.apply_pod(key, pod);
        }
    }

    pub(super) fn put_pod(&mut self, key: PodKey, mut pod: CachedPod) {
        // The node's own name, shared by its pods, rather than a copy per pod.
        if let Some((name, _)) = pod
            .node
            .as_deref()
            .and_then(|n| self.nodes.get_key_value(n))
        {
            pod.node = Some(name.clone());
        }
        let old_node = self.pods.get(&key).and_then(|p| p.node.clone());
        let new_node = pod.node.clone();
        self.index_plan_hold(&key, &pod);
        if self.pods.insert(key.clone(), Box::new(pod)).is_none() {
            let namespace = namespace_of(&key);
            self.by_namespace
                .entry(namespace.into())
                .or_default()
                .insert(key.clone());
        }
        if let Some(old) = old_node.as_ref().filter(|o| Some(*o) != new_node.as_ref()) {
            self.unlink(old, &key);
        }
        self.recharge(&key);
        if let Some(node) = new_node {
            let entry = self.entry(node.clone());
            if !entry.pods.contains(&key) {
                entry.pods.push(key);
            }
            self.recompute(&node);
        }
    }

    fn unlink(&mut self, node: &str, key: &str) {
        if let Some(entry) = self.nodes.get_mut(node) {
            entry.pods.retain(|k| &**k != key);
        }
        self.recompute(node);
        self.drop_empty(node);
    }

    fn drop_empty(&mut self, node: &str) {
        if self
            .nodes
            .get(node)
            .is_some_and(|e| e.gpus.is_none() && e.pods.is_empty())
            && let Some(entry) = self.nodes.remove(node)
        {
            self.free_slots.push(entry.stamp.slot);
        }
    }

    /// The node's entry, created with a slot of its own if new.
    fn entry(&mut self, name: Arc<str>) -> &mut NodeEntry {
        let (free, slots) = (&mut self.free_slots, &mut self.slots);
        self.nodes.entry(name).or_insert_with(|| {
            let slot = free.pop().unwrap_or_else(|| {
                *slots += 1;
                *slots - 1
            });
            NodeEntry {
                gpus: None,
                pods: Vec::new(),
                stamp: Stamp { slot, version: 0 },
            }
        })
    }

    /// Recount a node's GPU use from its pods. Pods whose annotations name GPUs are
    /// charged there; pods without (or with indices the node lacks) are charged where
    /// gpu-manager would put them, so capacity is never silently handed out twice.
    /// What a pod holds for its init containers has no annotation: unless our own
    /// hold placed it, it is placed on the node as it is, after the annotated
    /// pods, so the node holds each pod's whole effective request.
    fn recompute(&mut self, name: &str) {
        let Some(entry) = self.nodes.get_mut(name) else {
            return;
        };
        let Some(gpus) = entry.gpus.as_mut() else {
            return;
        };
        self.versions += 1;
        entry.stamp.version = self.versions;
        gpus.used.iter_mut().for_each(|u| *u = Default::default());
        let mut unindexed = Vec::new();
        let mut unheld = Vec::new();
        for key in &entry.pods {
            let Some(pod) = self.pods.get(key) else {
                continue;
            };
            match &pod.assignment {
                Some(a) if fits_indices(a, gpus.gpu_count()) => {
                    a.occupy(gpus);
                    if !a.holds_init_of(&pod.request) {
                        unheld.push(key.clone());
                    }
                }
                _ => unindexed.push(key.clone()),
            }
        }
        for key in unheld {
            let Some(pod) = self.pods.get(&key) else {
                continue;
            };
            match fit_held(gpus, &pod.request) {
                Ok(held) => Assignment {
                    choices: Vec::new(),
                    held,
                }
                .occupy(gpus),
                Err(misfit) => {
                    tracing::warn!(pod = %key, node = name, %misfit, "pod's init-container GPUs do not fit its node; not charged")
                }
            }
        }
        for key in unindexed {
            let Some(pod) = self.pods.get(&key) else {
                continue;
            };
            match fit(gpus, &pod.request) {
                Ok(a) => a.occupy(gpus),
                Err(misfit) => {
                    tracing::warn!(pod = %key, node = name, %misfit, "pod on node does not fit its GPUs; not charged")
                }
            }
        }
    }
}

pub(super) fn fits_indices(assignment: &Assignment, gpu_count: usize) -> bool {
    let held = assignment.held.iter().flat_map(|h| &h.gpus);
    assignment
        .choices
        .iter()
        .flat_map(|c| &c.gpus)
        .chain(held)
        .all(|&g| usize::from(g) < gpu_count)
}
