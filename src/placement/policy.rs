//! Placement policies: which feasible node (and GPUs) a pod gets.
//!
//! Every policy scores each feasible node; the lowest score wins and ties go to the
//! node name, so a choice is deterministic for a given cluster state.

use std::cmp::Ordering;

use serde::Deserialize;

use super::fit::{Assignment, Misfit, fit};
use super::node::NodeGpus;
use super::request::GpuRequest;

/// The policy used when the config names none.
pub const DEFAULT_POLICY: Policy = Policy::Original;

/// The placement policy (`placement.policy` in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// tkestack gpu-admission's order: least free vcuda-core on the node, then least
    /// free vcuda-memory, then node name; the first node that fits.
    Original,
    /// GPU packing: share a GPU already in use, else use a node already in use, else
    /// an idle node; among equals, the least free capacity left.
    Binpack,
    /// The most free capacity left: spreads load, keeps no node full.
    Spread,
}

impl Policy {
    pub const fn name(self) -> &'static str {
        match self {
            Policy::Original => "original",
            Policy::Binpack => "binpack",
            Policy::Spread => "spread",
        }
    }

    /// Score a feasible placement; lower is better.
    fn score(self, node: &NodeGpus, assignment: &Assignment) -> f64 {
        let before = (node.total_free_core(), node.total_free_memory());
        // fit() only returns assignments that fit, so nothing here saturates.
        let (core, memory) = assignment
            .charges(node.memory_per_gpu)
            .fold((0, 0), |(c, m), (_, u)| (c + u.core, m + u.memory));
        let free_after = pack(
            before.0.saturating_sub(core),
            before.1.saturating_sub(memory),
        );
        match self {
            Policy::Original => pack(before.0, before.1),
            Policy::Binpack => f64::from(packing_tier(node, assignment)) * TIER + free_after,
            Policy::Spread => -free_after,
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Two counts in one exactly-representable number, ordered by the first, then the second.
fn pack(major: u32, minor: u32) -> f64 {
    f64::from(major) * 1e7 + f64::from(minor)
}
const TIER: f64 = 1e15;

/// 0: every chosen GPU is already in use (shared); 1: the node is in use; 2: idle node.
fn packing_tier(node: &NodeGpus, assignment: &Assignment) -> u8 {
    let all_shared = assignment
        .choices
        .iter()
        .flat_map(|c| &c.gpus)
        .all(|&g| node.used.get(usize::from(g)).is_some_and(|u| u.core > 0));
    if all_shared {
        0
    } else if node.used.iter().any(|u| u.core > 0) {
        1
    } else {
        2
    }
}

/// The result of placing one pod over a list of candidate nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The index of the chosen node in the candidate list, and its GPUs.
    pub chosen: Option<(usize, Assignment)>,
    /// Every node that could not take the pod, by index, with the reason.
    pub misfits: Vec<(usize, Misfit)>,
}

/// Place `request` on the best of `nodes` under `policy`. `allowed` rejects nodes the pod
/// may not use at all (model, pool) before any fitting.
pub fn place<'a>(
    policy: Policy,
    request: &GpuRequest,
    nodes: impl IntoIterator<Item = &'a NodeGpus>,
    allowed: impl Fn(&NodeGpus) -> Result<(), Misfit>,
) -> Outcome {
    let mut best: Option<(usize, &NodeGpus, Assignment, f64)> = None;
    let mut misfits = Vec::new();
    for (index, node) in nodes.into_iter().enumerate() {
        let assignment = match allowed(node).and_then(|()| fit(node, request)) {
            Ok(assignment) => assignment,
            Err(misfit) => {
                misfits.push((index, misfit));
                continue;
            }
        };
        let score = policy.score(node, &assignment);
        let better = match &best {
            None => true,
            Some((_, held, _, held_score)) => match score.total_cmp(held_score) {
                Ordering::Less => true,
                Ordering::Equal => node.name < held.name,
                Ordering::Greater => false,
            },
        };
        if better {
            best = Some((index, node, assignment, score));
        }
    }
    Outcome {
        chosen: best.map(|(index, _, assignment, _)| (index, assignment)),
        misfits,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::placement::request::{ContainerGpu, GpuDemand};
    use crate::placement::testing::{node, with_used};

    fn one(demand: GpuDemand) -> GpuRequest {
        GpuRequest {
            containers: vec![ContainerGpu {
                container: 0,
                demand,
            }],
            init_core_units: 0,
        }
    }

    fn chosen_name(policy: Policy, request: &GpuRequest, nodes: &[NodeGpus]) -> Option<String> {
        let outcome = place(policy, request, nodes, |_| Ok(()));
        outcome.chosen.map(|(i, _)| nodes[i].name.to_string())
    }

    #[test]
    fn original_takes_least_free_node_that_fits_then_name() {
        let nodes = vec![
            node("b", 2, 4),
            with_used(node("c", 2, 4), 0, 90, 1),
            node("a", 2, 4),
        ];
        let share = one(GpuDemand::Share {
            core: 10,
            memory: 1,
        });
        assert_eq!(
            chosen_name(Policy::Original, &share, &nodes).as_deref(),
            Some("c")
        );
        let big = one(GpuDemand::Share {
            core: 50,
            memory: 1,
        });
        assert_eq!(
            chosen_name(Policy::Original, &big, &nodes).as_deref(),
            Some("c")
        );
        let two = one(GpuDemand::Whole { gpus: 2 });
        assert_eq!(
            chosen_name(Policy::Original, &two, &nodes).as_deref(),
            Some("a")
        );
    }

    #[test]
    fn binpack_prefers_shared_gpus_then_busy_nodes() {
        let nodes = vec![
            node("idle", 4, 4),
            with_used(node("busy", 4, 4), 0, 100, 4),
            with_used(node("shared", 8, 4), 3, 20, 1),
        ];
        let share = one(GpuDemand::Share {
            core: 30,
            memory: 1,
        });
        assert_eq!(
            chosen_name(Policy::Binpack, &share, &nodes).as_deref(),
            Some("shared")
        );
        let whole = one(GpuDemand::Whole { gpus: 1 });
        assert_eq!(
            chosen_name(Policy::Binpack, &whole, &nodes).as_deref(),
            Some("busy")
        );
    }

    #[test]
    fn spread_takes_the_emptiest_node() {
        let nodes = vec![with_used(node("a", 2, 4), 0, 10, 1), node("b", 2, 4)];
        let share = one(GpuDemand::Share {
            core: 10,
            memory: 1,
        });
        assert_eq!(
            chosen_name(Policy::Spread, &share, &nodes).as_deref(),
            Some("b")
        );
    }

    #[test]
    fn misfits_are_reported_per_node_and_no_choice_when_none_fit() {
        let nodes = vec![
            node("small", 1, 4),
            with_used(node("full", 2, 4), 0, 100, 4),
        ];
        let outcome = place(
            Policy::Original,
            &one(GpuDemand::Whole { gpus: 2 }),
            &nodes,
            |_| Ok(()),
        );
        assert_eq!(outcome.chosen, None);
        assert_eq!(outcome.misfits.len(), 2);
        assert!(outcome.misfits[0].1.is_unresolvable());
        assert!(!outcome.misfits[1].1.is_unresolvable());
    }
}
