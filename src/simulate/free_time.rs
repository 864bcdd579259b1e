//! `--timeline`'s GPU-hours stranded by cause (docs/simulate.md, "Quota over time"):
//! every free GPU of every node in one cause of `placement::free` (the simulated nodes
//! are never closed: no `unavailable`), integrated over the replay's time. A node's
//! usable capacity ([`TaskMix::usable_core`]) is computed again only when a pod starts
//! or stops on it, and the waiting pods are counted per model as they come and go, so
//! time passing costs one step per model.

use std::sync::Arc;

use crate::placement::models::WantedModels;
use crate::placement::{NodeGpus, TaskMix};

use super::replay::SimNode;

/// Free GPU-hours by cause over a replay.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub(super) struct FreeHours {
    pub(super) fragmented: f64,
    pub(super) quota_blocked: f64,
    pub(super) idle: f64,
}

#[derive(Debug)]
pub(super) struct FreeTime {
    /// The nodes' model labels, each once; a representative node of each (for asking
    /// whether a pod accepts the model).
    models: Vec<(Arc<str>, usize)>,
    model_of: Vec<usize>,
    /// Per node, the free vcuda-core some task of the mix could start on.
    usable: Vec<u64>,
    /// Per model, free and usable vcuda-core.
    totals: Vec<(u64, u64)>,
    /// Per model, pods waiting on quota that accept it.
    waiting: Vec<u32>,
    /// vcuda-core × seconds: fragmented, quota-blocked, idle.
    core_seconds: [u128; 3],
}

impl FreeTime {
    pub(super) fn new(nodes: &[SimNode], mix: &TaskMix) -> FreeTime {
        let mut models: Vec<(Arc<str>, usize)> = Vec::new();
        let mut model_of = Vec::with_capacity(nodes.len());
        for (at, node) in nodes.iter().enumerate() {
            let label = node.gpus.model.clone().unwrap_or_else(|| Arc::from(""));
            let index = match models.iter().position(|(m, _)| *m == label) {
                Some(index) => index,
                None => {
                    models.push((label, at));
                    models.len() - 1
                }
            };
            model_of.push(index);
        }
        let mut free = FreeTime {
            totals: vec![(0, 0); models.len()],
            waiting: vec![0; models.len()],
            models,
            model_of,
            usable: vec![0; nodes.len()],
            core_seconds: [0; 3],
        };
        for (at, node) in nodes.iter().enumerate() {
            free.add(at, &node.gpus, mix);
        }
        free
    }

    /// Node `at` is about to change: take its share out of its model's totals.
    pub(super) fn remove(&mut self, at: usize, gpus: &NodeGpus) {
        let total = &mut self.totals[self.model_of[at]];
        total.0 -= u64::from(gpus.total_free_core());
        total.1 -= self.usable[at];
    }

    /// Node `at` has changed: count its share again.
    pub(super) fn add(&mut self, at: usize, gpus: &NodeGpus, mix: &TaskMix) {
        self.usable[at] = u64::from(mix.usable_core(gpus));
        let total = &mut self.totals[self.model_of[at]];
        total.0 += u64::from(gpus.total_free_core());
        total.1 += self.usable[at];
    }

    /// A pod wanting `wanted` starts (`true`) or stops (`false`) waiting on quota.
    pub(super) fn wait(&mut self, wanted: &WantedModels, nodes: &[SimNode], waits: bool) {
        for (index, (_, node)) in self.models.iter().enumerate() {
            if wanted.admits(&nodes[*node].gpus).is_ok() {
                let count = &mut self.waiting[index];
                *count = if waits { *count + 1 } else { *count - 1 };
            }
        }
    }

    /// `seconds` pass as the cluster is.
    pub(super) fn pass(&mut self, seconds: u64) {
        let seconds = u128::from(seconds);
        for (index, (free, usable)) in self.totals.iter().enumerate() {
            self.core_seconds[0] += u128::from(free - usable) * seconds;
            let cause = if self.waiting[index] > 0 { 1 } else { 2 };
            self.core_seconds[cause] += u128::from(*usable) * seconds;
        }
    }

    pub(super) fn hours(&self) -> FreeHours {
        let hours = |core_seconds: u128| core_seconds as f64 / 100.0 / 3600.0;
        FreeHours {
            fragmented: hours(self.core_seconds[0]),
            quota_blocked: hours(self.core_seconds[1]),
            idle: hours(self.core_seconds[2]),
        }
    }
}
