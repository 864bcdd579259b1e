//! Node evaluations kept between placements (docs/design.md, "Placement").
//!
//! Whether a pod fits a node and the policy's score for it depend only on the node's
//! GPUs, the request and the placer (policy, gpu-manager compatibility and, for `fgd`,
//! the mix). The cluster cache stamps every node with a *version* that changes whenever
//! its GPUs change, and a small *slot* number of its own (`ClusterState`), so
//! [`place_versioned`] keeps each evaluation per (placer, request), in the node's slot,
//! with the version it was made for: between two filter calls only the nodes that
//! changed are fitted and scored again, and reading the others is a walk through a
//! dense array. The choice is exactly [`place`]'s: the same scores compared in the same
//! order with the same tie-break, and the winner's GPUs fitted again.

use std::sync::Arc;

use super::fit::Misfit;
use super::fragment::TaskMix;
use super::node::NodeGpus;
use super::policy::{Outcome, Placer, Policy, Ranked, better, place};
use super::request::GpuRequest;

/// Most (placer, request) pairs kept: a cluster's pods come in a few shapes.
const TABLES: usize = 16;

/// Where a node's evaluations are kept, and which state of the node they are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    /// Small and dense: the node's index in every table. Another node may get it once
    /// this one is gone.
    pub(crate) slot: u32,
    /// Names one state of one node (never 0): never given to another state or node.
    pub(crate) version: u64,
}

/// Evaluations of nodes for recent (placer, request) pairs, by node slot.
#[derive(Default)]
pub(crate) struct PlacementMemo {
    tables: Vec<Table>,
    /// Counts lookups, to evict the least recently used table.
    clock: u64,
}

impl std::fmt::Debug for PlacementMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlacementMemo")
            .field("tables", &self.tables.len())
            .finish()
    }
}

/// What a node's evaluation depends on besides the node itself.
struct Key {
    policy: Policy,
    gpu_manager_compat: bool,
    /// `fgd` only (the other policies never read the mix). Held, so that the pointer
    /// cannot be reused by another mix while the table lives.
    mix: Option<Arc<TaskMix>>,
    request: GpuRequest,
}

impl Key {
    fn of(placer: &Placer, request: &GpuRequest) -> Key {
        Key {
            policy: placer.policy,
            gpu_manager_compat: placer.gpu_manager_compat,
            mix: (placer.policy == Policy::Fgd).then(|| placer.mix.clone()),
            request: request.clone(),
        }
    }

    fn matches(&self, placer: &Placer, request: &GpuRequest) -> bool {
        self.policy == placer.policy
            && self.gpu_manager_compat == placer.gpu_manager_compat
            && self
                .mix
                .as_ref()
                .is_none_or(|mix| Arc::ptr_eq(mix, &placer.mix))
            && self.request == *request
    }

    /// No placer can ask for this key again: its mix was replaced and dropped.
    fn is_stale(&self) -> bool {
        self.mix
            .as_ref()
            .is_some_and(|mix| Arc::strong_count(mix) == 1)
    }
}

/// A node's evaluation: its score if the pod fits, else why not.
type Eval = Result<[f64; 2], Misfit>;

struct Table {
    key: Key,
    /// By slot: the version evaluated (0: none) and its evaluation.
    evals: Vec<(u64, Eval)>,
    used: u64,
}

impl PlacementMemo {
    /// The table for this placer and request, created (evicting the least recently
    /// used) if needed, with room for `slots` slots.
    fn table(&mut self, placer: &Placer, request: &GpuRequest, slots: usize) -> &mut Table {
        self.clock += 1;
        self.tables.retain(|t| !t.key.is_stale());
        let index = match self
            .tables
            .iter()
            .position(|t| t.key.matches(placer, request))
        {
            Some(index) => index,
            None => {
                if self.tables.len() == TABLES
                    && let Some(oldest) = (0..TABLES).min_by_key(|&i| self.tables[i].used)
                {
                    self.tables.swap_remove(oldest);
                }
                self.tables.push(Table {
                    key: Key::of(placer, request),
                    evals: Vec::new(),
                    used: 0,
                });
                self.tables.len() - 1
            }
        };
        let table = &mut self.tables[index];
        table.used = self.clock;
        if table.evals.len() < slots {
            table.evals.resize(slots, (0, Err(Misfit::NotCached)));
        }
        table
    }
}

/// [`place`] (no CPU or memory tracked) over `nodes`, `stamps[i]` being `nodes[i]`'s,
/// reusing the evaluations `memo` kept from earlier calls. The misfits are gathered only
/// when no node is chosen (a placed pod's answer names its node alone, and most pods
/// are placed): a second walk over `nodes`, reading the evaluations the first one left.
pub(crate) fn place_versioned(
    placer: &Placer,
    request: &GpuRequest,
    nodes: &[&NodeGpus],
    stamps: &[Stamp],
    allowed: impl Fn(&NodeGpus) -> Result<(), Misfit>,
    memo: &mut PlacementMemo,
) -> Outcome {
    let slots = stamps
        .iter()
        .map(|s| s.slot as usize + 1)
        .max()
        .unwrap_or(0);
    let pressure = placer.pressure(request, nodes.iter().copied());
    let table = memo.table(placer, request, slots);
    let mut best: Option<(usize, &NodeGpus, Ranked)> = None;
    for (index, (&node, stamp)) in nodes.iter().zip(stamps).enumerate() {
        if allowed(node).is_err() {
            continue;
        }
        let Some((version, eval)) = table.evals.get_mut(stamp.slot as usize) else {
            continue; // never: the table has every slot
        };
        if *version != stamp.version || stamp.version == 0 {
            *eval = evaluate(placer, request, node);
            *version = stamp.version;
        }
        let Ok(score) = eval else {
            continue;
        };
        // The extender tracks no node CPU: a short model's nodes stay kept.
        let ranked = (pressure.tier(node, None), *score);
        if best
            .as_ref()
            .is_none_or(|(_, held, by)| better(&ranked, node, by, held))
        {
            best = Some((index, node, ranked));
        }
    }
    let Some((index, node, _)) = best else {
        let misfits = nodes
            .iter()
            .zip(stamps)
            .enumerate()
            .filter_map(|(i, (&node, stamp))| {
                let evaluated = || match table.evals.get(stamp.slot as usize) {
                    Some((_, Err(misfit))) => Err(misfit.clone()),
                    _ => Ok(()),
                };
                allowed(node)
                    .and_then(|()| evaluated())
                    .err()
                    .map(|m| (i, m))
            });
        return Outcome {
            chosen: None,
            misfits: misfits.collect(),
        };
    };
    match placer.assign(node, request, None) {
        Ok(assignment) => Outcome {
            chosen: Some((index, assignment)),
            misfits: Vec::new(),
        },
        Err(_) => {
            // A version was reused for another state: never by ClusterState. Forget
            // this table and decide without it.
            debug_assert!(false, "node {} changed without a new version", node.name);
            table.evals.clear();
            place(placer, request, nodes.iter().copied(), allowed)
        }
    }
}

/// Whether the pod fits `node` and the policy's score there, as [`place`] computes them.
fn evaluate(placer: &Placer, request: &GpuRequest, node: &NodeGpus) -> Eval {
    let assignment = placer.assign(node, request, None)?;
    Ok(placer.score(node, &assignment, (None, None)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::placement::choice::{ModelPressure, PinnedDemand};
    use crate::placement::fragment::{GpuShape, TaskShape};
    use crate::placement::request::GpuDemand;
    use crate::placement::testing::{node, with_used};

    fn request(demand: GpuDemand) -> GpuRequest {
        GpuRequest::one(demand)
    }

    fn mix() -> Arc<TaskMix> {
        let share = |core| GpuShape::Share { core, memory: core };
        Arc::new(TaskMix::weighted([
            (TaskShape::gpu_only(share(30)), 3.0),
            (TaskShape::gpu_only(share(50)), 2.0),
            (TaskShape::gpu_only(GpuShape::Whole { gpus: 1 }), 2.0),
            (TaskShape::gpu_only(GpuShape::Whole { gpus: 4 }), 1.0),
        ]))
    }

    /// A small deterministic generator (no dependency on a seeded crate here).
    struct Lcg(u64);
    impl Lcg {
        fn below(&mut self, n: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) % n
        }
    }

    #[test]
    fn decides_exactly_as_place_while_nodes_change_between_calls() {
        // Pods pinned to T4 ask for 60% of the demand: T4 is short while its free GPUs
        // are under 60% of all free, and model choice's tier comes and goes.
        let t4 = TaskShape::gpu_only(GpuShape::Whole { gpus: 1 }).with_models(&["T4"]);
        let any = TaskShape::gpu_only(GpuShape::Whole { gpus: 1 });
        let pinned = Arc::new(PinnedDemand::of_counts([(&t4, 3), (&any, 2)]));
        let placers = [
            Placer::new(Policy::Fgd).with_mix(mix()),
            (Placer::new(Policy::Fgd).with_mix(mix())).with_pinned(pinned.clone()),
            Placer::new(Policy::Binpack).with_pinned(pinned.clone()),
            Placer::new(Policy::Fgd)
                .with_mix(mix())
                .with_gpu_manager_compat(false),
            Placer::new(Policy::Binpack),
            Placer::new(Policy::Original),
            Placer::new(Policy::Spread),
        ];
        let requests = [
            request(GpuDemand::Share {
                core: 30,
                memory: 30,
            }),
            request(GpuDemand::Share {
                core: 60,
                memory: 20,
            }),
            request(GpuDemand::Whole { gpus: 1 }),
            request(GpuDemand::Whole { gpus: 4 }),
        ];
        let mut random = Lcg(7);
        // Many equal nodes (ties decided by name), some partly used, of two models the
        // pod accepts (T4, A100) and one it does not.
        let mut nodes: Vec<NodeGpus> = (0..40)
            .map(|i| {
                let mut n = node(&format!("n{:02}", 39 - i), 4 + (i % 2) * 4, 100);
                if i % 3 == 0 {
                    n = with_used(n, i % 4, 20 * (i as u32 % 5), 10);
                }
                let model = match i {
                    5 => "V100",
                    _ if i % 4 == 1 => "A100",
                    _ => "T4",
                };
                n.model = Some(model.into());
                n
            })
            .collect();
        let mut stamps: Vec<Stamp> = (0..40)
            .map(|i| Stamp {
                slot: 39 - i,
                version: u64::from(i) + 1,
            })
            .collect();
        let mut next_version = 41;
        let mut memo = PlacementMemo::default();
        let allowed = |n: &NodeGpus| match n.model.as_deref() {
            Some("V100") => Err(Misfit::ModelNotWanted {
                model: Some("V100".into()),
                wanted: vec!["A100".to_string(), "T4".to_string()].into(),
            }),
            _ => Ok(()),
        };
        let mut tiers = [0, 0];
        for call in 0..600 {
            let placer = &placers[call % placers.len()];
            let request = &requests[random.below(requests.len() as u64) as usize];
            let refs: Vec<&NodeGpus> = nodes.iter().collect();
            tiers[usize::from(
                ModelPressure::of(&pinned, refs.iter().copied())
                    .short()
                    .is_empty(),
            )] += 1;
            let expected = place(placer, request, refs.iter().copied(), allowed).into_versioned();
            let got = place_versioned(placer, request, &refs, &stamps, allowed, &mut memo);
            assert_eq!(got, expected, "call {call}");
            // Charge the choice (as the cluster does), or free a random GPU.
            match got.chosen {
                Some((i, assignment)) if random.below(4) > 0 => assignment.occupy(&mut nodes[i]),
                _ => {
                    let i = random.below(nodes.len() as u64) as usize;
                    let gpu = random.below(nodes[i].gpu_count() as u64) as usize;
                    nodes[i].used[gpu] = Default::default();
                    stamps[i].version = next_version;
                    next_version += 1;
                    continue;
                }
            }
            let i = expected.chosen.unwrap().0;
            stamps[i].version = next_version;
            next_version += 1;
        }
        assert!(memo.tables.len() <= TABLES);
        assert!(
            tiers[0] > 0 && tiers[1] > 0,
            "T4 short, then not: {tiers:?}"
        );
    }

    #[test]
    fn a_replaced_mix_drops_its_tables() {
        let mut memo = PlacementMemo::default();
        let one = node("n", 2, 100);
        let share = request(GpuDemand::Share {
            core: 30,
            memory: 30,
        });
        let stamp = Stamp {
            slot: 0,
            version: 1,
        };
        let placer = Placer::new(Policy::Fgd).with_mix(mix());
        place_versioned(&placer, &share, &[&one], &[stamp], |_| Ok(()), &mut memo);
        assert_eq!(memo.tables.len(), 1);
        drop(placer);
        let placer = Placer::new(Policy::Fgd).with_mix(mix());
        place_versioned(&placer, &share, &[&one], &[stamp], |_| Ok(()), &mut memo);
        assert_eq!(memo.tables.len(), 1, "the old mix's table is gone");
    }
}
