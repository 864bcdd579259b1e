//! Which pods to move off which node: each candidate node's *deficit* for the pending
//! pod (what it lacks there) and the small sets of movable pods on it whose removal
//! covers it, found with cheap sums first and confirmed by fitting the pod.

use crate::placement::fit::{Misfit, fit};
use crate::placement::node::NodeGpus;
use crate::placement::policy::Placer;
use crate::placement::request::{GpuDemand, GpuRequest};

use super::{Ask, Evaluations, Ground, Resident, host_admits};

/// Amounts by dimension: GPU cores, GPU memory, milli-CPU, MiB of memory.
type Amounts = [u64; 4];

/// A node the pending pod could get once some of its movable pods are gone.
#[derive(Debug)]
pub(super) struct Target {
    node: usize,
    /// What the node lacks for the pending pod (a lower bound per dimension).
    deficit: Amounts,
    /// The movable pods there that free something the pod lacks: index among the
    /// node's residents, and what each frees.
    helpers: Vec<(usize, Amounts)>,
    /// Sets found to cover the deficit at fewer moves: a superset of one never lands
    /// where the set itself did not (its extra moves only take room elsewhere).
    found: Vec<Vec<usize>>,
}

/// Pods (indices among `node`'s residents) whose removal lets the pending pod fit.
#[derive(Debug, Clone)]
pub(super) struct Cover {
    pub(super) node: usize,
    pub(super) movers: Vec<usize>,
    /// vcuda-core of the movers (100 per GPU).
    pub(super) core_moved: u64,
}

/// The pending pod and the placer that fits it.
pub(super) struct Search<'a> {
    pub(super) placer: &'a Placer,
    pub(super) ask: &'a Ask<'a>,
}

impl Search<'_> {
    /// Every node the pod may use and could get with its movable pods gone, smallest
    /// deficit first. One evaluation per node tried.
    pub(super) fn targets<C: Ground>(
        &self,
        cluster: &[C],
        allowed: &impl Fn(&NodeGpus) -> Result<(), Misfit>,
        may_move: &impl Fn(&Resident<C::Pod>) -> bool,
        budget: &mut Evaluations,
    ) -> Vec<Target> {
        let mut targets = Vec::new();
        for (node, candidate) in cluster.iter().enumerate() {
            if allowed(candidate.gpus()).is_err() {
                continue;
            }
            let residents = candidate.residents();
            let movable: Vec<usize> = (0..residents.len())
                .filter(|&i| may_move(&residents[i]))
                .collect();
            if movable.is_empty() {
                continue;
            }
            if !self.could_fit(candidate, &movable) {
                if !budget.glance() {
                    break;
                }
                continue;
            }
            if !budget.spend() {
                break;
            }
            if !self.fits_without(candidate, &movable) {
                continue;
            }
            let (deficit, misfit) = self.deficit(candidate);
            let memory_per_gpu = candidate.gpus().memory_per_gpu;
            let helpers = movable
                .into_iter()
                .map(|i| (i, frees(&residents[i], memory_per_gpu)))
                .filter(|(_, freed)| helps(freed, &deficit, misfit))
                .collect();
            targets.push(Target {
                node,
                deficit,
                helpers,
                found: Vec::new(),
            });
        }
        targets.sort_by_key(|t| (t.deficit, t.node));
        targets
    }

    /// The sets of exactly `size` movable pods, on each target in turn, whose removal
    /// lets the pod fit (one evaluation per set fitted), supersets of smaller covers
    /// left out; no more once `limit` are found.
    pub(super) fn covers<C: Ground>(
        &self,
        cluster: &[C],
        targets: &mut [Target],
        size: usize,
        limit: usize,
        budget: &mut Evaluations,
    ) -> Vec<Cover> {
        let mut covers = Vec::new();
        for target in targets.iter_mut() {
            if budget.spent() || covers.len() >= limit {
                break;
            }
            let candidate = &cluster[target.node];
            let mut found = Vec::new();
            let sets = Sets::new(&target.helpers, &target.deficit, size);
            sets.each(&mut |chosen: &[usize]| {
                let movers: Vec<usize> = chosen.iter().map(|&h| target.helpers[h].0).collect();
                let known = |f: &Vec<usize>| f.iter().all(|m| movers.contains(m));
                if target.found.iter().any(known) {
                    return true;
                }
                if !budget.spend() {
                    return false;
                }
                if self.fits_without(candidate, &movers) {
                    found.push(movers);
                }
                true
            });
            for movers in found {
                let residents = candidate.residents();
                covers.push(Cover {
                    node: target.node,
                    core_moved: movers
                        .iter()
                        .map(|&m| residents[m].request.core_units())
                        .sum(),
                    movers: movers.clone(),
                });
                target.found.push(movers);
            }
        }
        covers
    }

    /// A cheap test that the pod could fit `candidate` once `movers` are gone: as
    /// many free GPU cores, CPU and memory in all as it needs.
    fn could_fit<C: Ground>(&self, candidate: &C, movers: &[usize]) -> bool {
        let residents = candidate.residents();
        let gpus = candidate.gpus();
        let mut core = u64::from(gpus.total_free_core());
        let mut room = candidate.room();
        for &m in movers {
            core += frees(&residents[m], gpus.memory_per_gpu)[0];
            room = room.map(|r| r.plus(&residents[m].host));
        }
        core >= self.ask.request.core_units() && host_admits(room, &self.ask.host).is_ok()
    }

    /// Whether the pod fits `candidate` once `movers` (indices among its residents)
    /// are gone.
    fn fits_without<C: Ground>(&self, candidate: &C, movers: &[usize]) -> bool {
        let mut gpus = candidate.gpus().clone();
        let mut room = candidate.room();
        for &m in movers {
            let resident = &candidate.residents()[m];
            resident.assignment.vacate(&mut gpus);
            room = room.map(|r| r.plus(&resident.host));
        }
        let room_after = room.map(|r| r.minus(&self.ask.host));
        host_admits(room, &self.ask.host).is_ok()
            && self
                .placer
                .assign(&gpus, self.ask.request, room_after.as_ref())
                .is_ok()
    }

    /// What `candidate` lacks for the pod, and whether its GPUs are what it lacks.
    fn deficit<C: Ground>(&self, candidate: &C) -> (Amounts, bool) {
        let host = self.ask.host;
        let (cpu, memory) = candidate.room().map_or((0, 0), |room| {
            (
                host.cpu_milli.saturating_sub(room.cpu_milli),
                host.memory_mib.saturating_sub(room.memory_mib),
            )
        });
        let gpus = candidate.gpus();
        let misfit = fit(gpus, self.ask.request).is_err();
        let (core, gpu_memory) = if misfit {
            gpu_deficit(gpus, self.ask.request)
        } else {
            (0, 0)
        };
        ([core, gpu_memory, cpu, memory], misfit)
    }
}

/// Lower bounds on the GPU cores and GPU memory the pod's removals must free on `gpus`:
/// a share needs one GPU with its cores and memory free (at least what the freest GPU
/// lacks); `k` whole GPUs need the least used busy GPUs emptied; anything else at
/// least its total cores free on the node.
pub(super) fn gpu_deficit(gpus: &NodeGpus, request: &GpuRequest) -> (u64, u64) {
    let indices = 0..gpus.gpu_count();
    let single = match (request.containers.as_slice(), request.held_for_init()) {
        ([only], held) if held.is_empty() => Some(only.demand),
        _ => None,
    };
    match single {
        Some(GpuDemand::Share { core, memory }) => {
            let most_core = indices.clone().map(|i| gpus.free_core(i)).max();
            let most_memory = indices.map(|i| gpus.free_memory(i)).max();
            (
                u64::from(core.saturating_sub(most_core.unwrap_or(0))),
                u64::from(memory.saturating_sub(most_memory.unwrap_or(0))),
            )
        }
        Some(GpuDemand::Whole { gpus: want }) => {
            let missing = want.saturating_sub(gpus.free_whole_gpus()) as usize;
            let mut busy: Vec<u32> = gpus
                .used
                .iter()
                .map(|u| u.core)
                .filter(|&c| c > 0)
                .collect();
            busy.sort_unstable();
            (busy.iter().take(missing).map(|&c| u64::from(c)).sum(), 0)
        }
        None => (
            request
                .core_units()
                .saturating_sub(u64::from(gpus.total_free_core())),
            0,
        ),
    }
}

/// Whether `gpus` has the room [`gpu_deficit`] asks for as it is (its deficit is
/// nothing), without allocating: the cheap test of a destination.
pub(super) fn gpu_room(gpus: &NodeGpus, request: &GpuRequest) -> bool {
    let single = match (request.containers.as_slice(), request.held_for_init()) {
        ([only], held) if held.is_empty() => Some(only.demand),
        _ => None,
    };
    match single {
        Some(GpuDemand::Share { core, memory }) => (0..gpus.gpu_count())
            .any(|i| gpus.free_core(i) >= core && gpus.free_memory(i) >= memory),
        Some(GpuDemand::Whole { gpus: want }) => gpus.free_whole_gpus() >= want,
        None => u64::from(gpus.total_free_core()) >= request.core_units(),
    }
}

/// What moving `resident` off its node frees there.
fn frees<K>(resident: &Resident<K>, memory_per_gpu: u32) -> Amounts {
    let (core, memory) = resident
        .assignment
        .charges(memory_per_gpu)
        .fold((0, 0), |(c, m), (_, u)| {
            (c + u64::from(u.core), m + u64::from(u.memory))
        });
    [
        core,
        memory,
        resident.host.cpu_milli,
        resident.host.memory_mib,
    ]
}

/// Whether freeing `freed` helps with `deficit` (`misfit`: the pod's GPUs do not fit).
fn helps(freed: &Amounts, deficit: &Amounts, misfit: bool) -> bool {
    let gpu = freed[0] > 0 || freed[1] > 0;
    (misfit && gpu) || (deficit[2] > 0 && freed[2] > 0) || (deficit[3] > 0 && freed[3] > 0)
}

/// Sets of `size` helpers whose sums could cover a deficit, enumerated in index order
/// and cut as soon as the largest amounts left cannot make up what is missing.
struct Sets<'a> {
    helpers: &'a [(usize, Amounts)],
    deficit: &'a Amounts,
    size: usize,
    /// `most[i][d]`: the largest amount of dimension `d` among helpers `i..`.
    most: Vec<Amounts>,
}

impl<'a> Sets<'a> {
    fn new(helpers: &'a [(usize, Amounts)], deficit: &'a Amounts, size: usize) -> Sets<'a> {
        let mut most = vec![[0; 4]; helpers.len() + 1];
        for i in (0..helpers.len()).rev() {
            let (next, freed) = (most[i + 1], helpers[i].1);
            most[i] = std::array::from_fn(|d| next[d].max(freed[d]));
        }
        Sets {
            helpers,
            deficit,
            size,
            most,
        }
    }

    /// Call `visit` with each set (indices into the helpers) until it returns false.
    fn each(&self, visit: &mut impl FnMut(&[usize]) -> bool) {
        if self.size == 0 || self.size > self.helpers.len() {
            return;
        }
        let mut chosen = Vec::with_capacity(self.size);
        self.descend(0, [0; 4], &mut chosen, visit);
    }

    /// Extend `chosen` (summing to `sum`) with helpers from `start` on; false to stop.
    fn descend(
        &self,
        start: usize,
        sum: Amounts,
        chosen: &mut Vec<usize>,
        visit: &mut impl FnMut(&[usize]) -> bool,
    ) -> bool {
        let left = self.size - chosen.len();
        let reachable = (0..4).all(|d| {
            let most = self.most[start][d].saturating_mul(left as u64);
            sum[d].saturating_add(most) >= self.deficit[d]
        });
        if !reachable {
            return true;
        }
        if left == 0 {
            return visit(chosen);
        }
        for i in start..=self.helpers.len() - left {
            let amounts = &self.helpers[i].1;
            let next = std::array::from_fn(|d| sum[d] + amounts[d]);
            chosen.push(i);
            let go_on = self.descend(i + 1, next, chosen, visit);
            chosen.pop();
            if !go_on {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_are_cut_by_what_the_largest_amounts_left_can_free() {
        // Need 90 cores: no single helper has them, pairs of 50 + 40 or more do.
        let helpers = [(0, [50, 0, 0, 0]), (1, [40, 0, 0, 0]), (2, [10, 0, 0, 0])];
        let deficit = [90, 0, 0, 0];
        let collect = |size| {
            let mut seen = Vec::new();
            Sets::new(&helpers, &deficit, size).each(&mut |set| {
                seen.push(set.to_vec());
                true
            });
            seen
        };
        assert!(collect(1).is_empty());
        assert_eq!(collect(2), vec![vec![0, 1]]);
        assert_eq!(collect(3), vec![vec![0, 1, 2]]);
        assert!(collect(4).is_empty());
    }
}
