//! `simulate --timeline` (docs/simulate.md, "Quota over time"): the trace replayed over
//! time — each GPU pod arrives at its `creation_time` and runs for as long as it ran —
//! through namespaces with GPU quotas, to see what a quota strands and what a cohort
//! would win, before turning either on.
//!
//! Every decision is the product's own: admission is `quota::admit`, the quota queue's
//! order is `quota::queue::plan`, borrowing is `quota::cohort` through the same
//! `QuotaView`s, placement is `place_with_host` with the configured policy, and reclaim
//! is `quota::cohort::reclaim`. What is modelled around them (tenants, quotas, a
//! controller's retries) is in [`tenancy`] and docs/simulate.md.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::placement::models::{ModelSource, WantedModels};
use crate::placement::quantity::Milli;
use crate::placement::{Assignment, Placer, place_with_host};
use crate::quota::ChargedAt;
use crate::quota::admit::{AdmitRules, UntypedPods};
use crate::quota::cohort::{self, Borrower, CohortTerms, Pool, Reclaim, Share};
use crate::quota::queue::{QueueRules, Turn, Waiting, plan};
use crate::quota::view::QuotaView;
use crate::quota::{Charge, Costs, ModelAmounts, OnExceed, admit};

use super::free_time::{FreeHours, FreeTime};
use super::replay::{SimNode, SimPod};
pub(super) use super::tenancy::{Tenancy, TimedPod, tenancy};

/// How the namespaces' quotas treat a pod past them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum QuotaMode {
    /// Refused; its controller creates it again after a back-off.
    Deny,
    /// Waits in its namespace's line (a pod of one model; others as `Deny`).
    Queue,
    /// `Queue`, and every namespace in one cohort (no limits, `reclaim: Evict`).
    Cohort,
}

/// A controller's back-off after a refused create: 1 s, doubling, at most [`MAX_BACKOFF`]
/// (the Job controller's after a failed API call).
fn backoff(attempt: u32) -> u64 {
    (1u64 << attempt.min(6)).min(MAX_BACKOFF)
}

const MAX_BACKOFF: u64 = 60;
/// From this attempt on the back-off is [`MAX_BACKOFF`]: the pod is *parked*, its retries
/// counted but not played one by one, until room appears (see `Replay::unpark`).
const PARKED: u32 = 6;

/// What one mode's replay measured.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub(super) struct TimelineResult {
    pub(super) pods: usize,
    pub(super) started: usize,
    /// Pods no quota (nor cohort) could ever take: refused at once, not replayed.
    pub(super) too_big: usize,
    /// Pods that never started: still waiting on quota when nothing was left to finish,
    /// or admitted and never placed (`no_node`).
    pub(super) never_started: usize,
    /// Of those, pods the quota admitted that no node could take (model, CPU, memory).
    pub(super) no_node: usize,
    /// Pods that waited on quota before they first started.
    pub(super) waited: usize,
    pub(super) wait_p50_s: u64,
    pub(super) wait_p99_s: u64,
    pub(super) wait_max_s: u64,
    /// GPU-hours during which GPUs sat idle while pods waited on quota (the smaller of
    /// the idle GPUs and the waiting pods' demand, over time).
    pub(super) stranded_gpu_hours: f64,
    /// Free GPU-hours by cause (`placement::free`): on GPUs no task of the mix could
    /// start on, usable while pods that accept the model waited on quota, and idle.
    pub(super) free_gpu_hours: FreeHours,
    pub(super) evictions: usize,
    /// GPU-hours of work the evicted pods lost.
    pub(super) evicted_gpu_hours: f64,
    /// Creates refused and made again (`Deny`, and multi-model pods under `Queue`).
    pub(super) retries: u64,
    pub(super) seconds: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// (pod, attempt): created, or created again after a refusal.
    Create(usize, u32),
    /// (pod, run): its run ends (ignored if the run was evicted).
    Finish(usize, u64),
}

#[derive(Debug, Clone)]
struct Run {
    node: usize,
    assignment: Assignment,
    model: String,
    started: u64,
    borrowing: bool,
}

enum Attempt {
    Started,
    OverQuota,
    NoNode,
}

struct Replay<'a> {
    mode: QuotaMode,
    /// `queue.maxPassOverSeconds`.
    max_pass_over: i64,
    placer: &'a Placer,
    nodes: Vec<SimNode>,
    pods: &'a [TimedPod],
    tenancy: &'a Tenancy,
    wanted: Vec<WantedModels>,
    used: Vec<ModelAmounts>,
    running: Vec<Option<Run>>,
    runs: Vec<u64>,
    /// Per namespace, the pods in its quota line (`Queue`, `Cohort`), with when they joined.
    lines: Vec<Vec<(usize, u64)>>,
    /// Pods the quota admitted that no node could take yet: tried again as pods finish.
    no_node: Vec<usize>,
    /// Refused pods retrying every [`MAX_BACKOFF`] seconds, with the second of their last
    /// refusal: the next retry after room appears is the one that counts.
    parked: Vec<(usize, u64)>,
    /// Pods waiting on quota (in a line or between refused creates).
    over_quota: Vec<bool>,
    first_start: Vec<Option<u64>>,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    now: u64,
    capacity: u64,
    allocated: u64,
    waiting_demand: u64,
    stranded_milli_seconds: u128,
    free: FreeTime,
    result: TimelineResult,
}

/// Replay `pods` over time on `nodes` under `mode`.
pub(super) fn run(
    mode: QuotaMode,
    placer: &Placer,
    nodes: &[SimNode],
    pods: &[TimedPod],
    tenancy: &Tenancy,
    max_pass_over: i64,
) -> TimelineResult {
    let started = std::time::Instant::now();
    let wanted = pods
        .iter()
        .zip(&tenancy.namespace_of)
        .map(|(p, &k)| wanted_models(&p.pod, &tenancy.default_model[k]))
        .collect();
    let mut replay = Replay {
        mode,
        max_pass_over,
        placer,
        nodes: nodes.to_vec(),
        pods,
        tenancy,
        wanted,
        used: vec![ModelAmounts::new(); tenancy.hard.len()],
        running: vec![None; pods.len()],
        runs: vec![0; pods.len()],
        lines: vec![Vec::new(); tenancy.hard.len()],
        no_node: Vec::new(),
        parked: Vec::new(),
        over_quota: vec![false; pods.len()],
        first_start: vec![None; pods.len()],
        events: BinaryHeap::new(),
        seq: 0,
        now: 0,
        capacity: nodes.iter().map(|n| n.gpus.gpu_count() as u64 * 1000).sum(),
        allocated: 0,
        waiting_demand: 0,
        stranded_milli_seconds: 0,
        free: FreeTime::new(nodes, &placer.mix),
        result: TimelineResult {
            pods: pods.len(),
            ..TimelineResult::default()
        },
    };
    for (i, pod) in pods.iter().enumerate() {
        replay.schedule(pod.arrival, Event::Create(i, 0));
    }
    replay.play();
    replay.finish(started.elapsed().as_secs_f64())
}

/// A pod that names models wants those; one that names none, its namespace's default.
fn wanted_models(pod: &SimPod, default: &str) -> WantedModels {
    match pod.models.as_slice() {
        [] => WantedModels {
            models: vec![default.to_string()],
            source: ModelSource::QuotaDefault,
        },
        models => WantedModels {
            models: models.iter().map(|m| m.to_string()).collect(),
            source: ModelSource::Annotation,
        },
    }
}

const RULES: AdmitRules = AdmitRules {
    untyped: UntypedPods::Allow,
    quota_required: false,
};

impl Replay<'_> {
    fn schedule(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.events.push(Reverse((at, self.seq, event)));
    }

    fn play(&mut self) {
        while let Some(Reverse((at, _, event))) = self.events.pop() {
            self.advance(at);
            match event {
                Event::Create(pod, attempt) => self.create(pod, attempt),
                Event::Finish(pod, run) if self.runs[pod] == run => self.finish_pod(pod),
                Event::Finish(..) => {}
            }
        }
    }

    /// Time passes: count what idles while pods wait on quota.
    fn advance(&mut self, to: u64) {
        let idle = self.capacity.saturating_sub(self.allocated);
        let stranded = u128::from(idle.min(self.waiting_demand));
        self.stranded_milli_seconds += stranded * u128::from(to.saturating_sub(self.now));
        self.free.pass(to.saturating_sub(self.now));
        self.now = to;
    }

    fn namespace(&self, pod: usize) -> usize {
        self.tenancy.namespace_of[pod]
    }

    fn demand(&self, pod: usize) -> Milli {
        Milli(self.pods[pod].pod.demand_milli)
    }

    fn create(&mut self, pod: usize, attempt: u32) {
        if attempt == 0 && self.too_big(pod) {
            self.result.too_big += 1;
            return;
        }
        if self.queued(pod) {
            // Created gated: the releaser decides, in line order, with the others waiting.
            let k = self.namespace(pod);
            self.set_over_quota(pod, true);
            self.lines[k].push((pod, self.now));
            self.let_go(k);
            return;
        }
        match self.attempt(pod) {
            Attempt::Started => {}
            Attempt::NoNode => {
                // Past the quota now: waiting for a node is not waiting on quota.
                self.set_over_quota(pod, false);
                self.no_node.push(pod);
            }
            Attempt::OverQuota => {
                self.set_over_quota(pod, true);
                if attempt >= PARKED {
                    self.parked.push((pod, self.now));
                } else {
                    self.result.retries += 1;
                    self.schedule(self.now + backoff(attempt), Event::Create(pod, attempt + 1));
                }
            }
        }
    }

    /// Whether the pod waits in its namespace's line when the quota has no room: under
    /// `Queue` a pod of one model (others are judged at creation, as under `Deny`).
    fn queued(&self, pod: usize) -> bool {
        let at = ChargedAt::of(&self.wanted[pod].models);
        self.mode != QuotaMode::Deny && matches!(at, ChargedAt::Admission { .. })
    }

    /// No quota of its namespace could ever take the pod (with its cohort, what all
    /// members own): refused at once, as the product refuses it at creation.
    fn too_big(&self, pod: usize) -> bool {
        let k = self.namespace(pod);
        let demand = self.demand(pod);
        let cohort = self.mode == QuotaMode::Cohort;
        !self.wanted[pod].models.iter().any(|model| {
            let own = |k: usize| {
                self.tenancy.hard[k]
                    .get(model)
                    .copied()
                    .unwrap_or_default()
                    .0
            };
            let most = match cohort {
                true => (0..self.tenancy.hard.len()).map(own).sum(),
                false => own(k),
            };
            demand.0 <= most
        })
    }

    fn set_over_quota(&mut self, pod: usize, waits: bool) {
        if self.over_quota[pod] != waits {
            self.over_quota[pod] = waits;
            let demand = self.demand(pod).0;
            match waits {
                true => self.waiting_demand += demand,
                false => self.waiting_demand -= demand,
            }
            self.free.wait(&self.wanted[pod], &self.nodes, waits);
        }
    }

    /// Admit the pod and place it, as the webhooks and the extender would now.
    fn attempt(&mut self, pod: usize) -> Attempt {
        let k = self.namespace(pod);
        let views = self.views(k);
        let demand = self.demand(pod);
        let costs = Costs::from_charges(
            self.wanted[pod]
                .models
                .iter()
                .map(|m| (m.clone(), [(m.clone(), demand)].into()))
                .collect(),
        );
        let models = match admit("", &views, &self.wanted[pod], &costs, RULES) {
            Ok(Charge::Model { model, .. }) => vec![model],
            Ok(Charge::AtPlacement { models, .. }) => models,
            Ok(Charge::Unlimited) => self.wanted[pod].models.clone(),
            Err(_) => return Attempt::OverQuota,
        };
        let sim = &self.pods[pod].pod;
        let outcome = place_with_host(self.placer, &sim.request, &sim.host, &self.nodes, |n| {
            n.admits_models(sim, &models)
        });
        let Some((node, assignment)) = outcome.chosen else {
            return Attempt::NoNode;
        };
        let model = self.nodes[node]
            .gpus
            .model
            .as_deref()
            .unwrap_or_default()
            .to_string();
        self.start(pod, node, assignment, model);
        Attempt::Started
    }

    fn start(&mut self, pod: usize, node: usize, assignment: Assignment, model: String) {
        let k = self.namespace(pod);
        let demand = self.demand(pod);
        let chosen = &mut self.nodes[node];
        self.free.remove(node, &chosen.gpus);
        assignment.occupy(&mut chosen.gpus);
        chosen.room = chosen.room.minus(&self.pods[pod].pod.host);
        self.free.add(node, &chosen.gpus, &self.placer.mix);
        let used = self.used[k].entry(model.clone()).or_default();
        used.0 += demand.0;
        let hard = self.tenancy.hard[k]
            .get(&model)
            .copied()
            .unwrap_or_default();
        let borrowing = used.0 > hard.0;
        self.allocated += demand.0;
        self.set_over_quota(pod, false);
        if self.first_start[pod].is_none() {
            self.first_start[pod] = Some(self.now - self.pods[pod].arrival);
        }
        self.runs[pod] += 1;
        let finish = self.now + self.pods[pod].runtime;
        self.schedule(finish, Event::Finish(pod, self.runs[pod]));
        self.running[pod] = Some(Run {
            node,
            assignment,
            model: model.clone(),
            started: self.now,
            borrowing,
        });
        if self.mode == QuotaMode::Cohort {
            self.reclaim(&model);
        }
    }

    /// Take the pod off its node and out of its namespace's usage; its run, if any.
    fn stop(&mut self, pod: usize) -> Option<Run> {
        let run = self.running[pod].take()?;
        let k = self.namespace(pod);
        let demand = self.demand(pod);
        let node = &mut self.nodes[run.node];
        self.free.remove(run.node, &node.gpus);
        run.assignment.vacate(&mut node.gpus);
        node.room = node.room.plus(&self.pods[pod].pod.host);
        self.free.add(run.node, &node.gpus, &self.placer.mix);
        if let Some(used) = self.used[k].get_mut(&run.model) {
            used.0 -= demand.0;
        }
        self.allocated -= demand.0;
        Some(run)
    }

    fn finish_pod(&mut self, pod: usize) {
        let k = self.namespace(pod);
        self.stop(pod);
        // Room appeared: the scheduler tries its pending pods again, the releaser the line.
        for waiting in std::mem::take(&mut self.no_node) {
            if let Attempt::NoNode | Attempt::OverQuota = self.attempt(waiting) {
                self.no_node.push(waiting);
            }
        }
        match self.mode {
            QuotaMode::Deny => {}
            QuotaMode::Queue => self.let_go(k),
            QuotaMode::Cohort => (0..self.lines.len()).for_each(|k| self.let_go(k)),
        }
        let cohort = self.mode == QuotaMode::Cohort;
        self.unpark(|j| cohort || j == k);
    }

    /// Room appeared for the parked pods of the namespaces `affected` says: each retries
    /// at its next back-off tick, the refused retries before it counted.
    fn unpark(&mut self, affected: impl Fn(usize) -> bool) {
        let parked = std::mem::take(&mut self.parked);
        for (pod, since) in parked {
            if !affected(self.namespace(pod)) {
                self.parked.push((pod, since));
                continue;
            }
            let ticks = (self.now - since).div_ceil(MAX_BACKOFF).max(1);
            self.result.retries += ticks;
            self.schedule(since + ticks * MAX_BACKOFF, Event::Create(pod, PARKED));
        }
    }

    /// Let go what the quota queue's planner lets go in namespace `k`, pass after pass
    /// while a pass lets one go (the releaser's next pass comes within seconds).
    fn let_go(&mut self, k: usize) {
        while self.let_go_pass(k) {}
    }

    /// One pass of the releaser; whether it let a pod go.
    fn let_go_pass(&mut self, k: usize) -> bool {
        if self.lines[k].is_empty() {
            return false;
        }
        let mut released = false;
        let waiting: Vec<Waiting> = self.lines[k]
            .iter()
            .map(|&(pod, since)| Waiting {
                key: format!("{pod:08}"),
                uid: String::new(),
                priority: 0,
                created: since as i64,
                wanted: self.wanted[pod].clone(),
                costs: Costs::single(
                    self.wanted[pod].models[0].clone(),
                    [(self.wanted[pod].models[0].clone(), self.demand(pod))].into(),
                ),
            })
            .collect();
        let rules = QueueRules {
            max_pass_over: self.max_pass_over,
            admit: RULES,
        };
        let turns = plan("", &self.views(k), waiting, self.now as i64, rules);
        for (waiting, turn) in turns {
            let Turn::LetGo(_) = turn else { continue };
            let Ok(pod) = waiting.key.parse::<usize>() else {
                continue;
            };
            match self.attempt(pod) {
                Attempt::Started => self.lines[k].retain(|&(p, _)| p != pod),
                Attempt::NoNode => {
                    self.lines[k].retain(|&(p, _)| p != pod);
                    self.set_over_quota(pod, false);
                    self.no_node.push(pod);
                }
                Attempt::OverQuota => continue,
            }
            released = true;
        }
        released
    }

    /// Namespace `k`'s quota as admission sees it now (with its cohort's pools).
    fn views(&self, k: usize) -> Vec<QuotaView> {
        let cohort = (self.mode == QuotaMode::Cohort).then(|| CohortTerms {
            name: "all".into(),
            reclaim: Reclaim::Evict,
            pools: self.tenancy.hard[k]
                .keys()
                .map(|model| (model.clone(), Pool::of(&self.shares(model))))
                .collect(),
            ..CohortTerms::default()
        });
        vec![QuotaView {
            namespace: format!("ns-{k}"),
            name: "default".into(),
            hard: self.tenancy.hard[k].clone(),
            used: self.used[k].clone(),
            on_exceed: match self.mode {
                QuotaMode::Deny => OnExceed::Deny,
                _ => OnExceed::Queue,
            },
            cohort,
        }]
    }

    /// Every namespace's standing for `model`, in namespace order.
    fn shares(&self, model: &str) -> Vec<Share> {
        let amount = |amounts: &ModelAmounts| amounts.get(model).copied().unwrap_or_default();
        (0..self.tenancy.hard.len())
            .map(|k| Share {
                hard: amount(&self.tenancy.hard[k]),
                used: amount(&self.used[k]),
                ..Share::default()
            })
            .collect()
    }

    /// A member took back what it lent: evict borrowing pods of `model` until the pool is
    /// whole; each evicted pod is created again by its controller and waits in line.
    fn reclaim(&mut self, model: &str) {
        let shares = self.shares(model);
        if Pool::of(&shares).overdrawn() == 0 {
            return;
        }
        let candidates: Vec<Borrower<usize>> = self
            .running
            .iter()
            .enumerate()
            .filter_map(|(pod, run)| {
                let run = run.as_ref().filter(|r| r.borrowing && r.model == model)?;
                Some(Borrower {
                    key: pod,
                    member: self.namespace(pod),
                    priority: 0,
                    admitted: run.started as i64,
                    amount: self.demand(pod),
                    standing: cohort::Standing::Evictable,
                })
            })
            .collect();
        let evicted: Vec<usize> = cohort::reclaim(&shares, &candidates)
            .iter()
            .map(|b| b.key)
            .collect();
        for pod in evicted {
            let Some(run) = self.stop(pod) else { continue };
            self.runs[pod] += 1;
            self.result.evictions += 1;
            let lost = u128::from(self.now - run.started) * u128::from(self.demand(pod).0);
            self.result.evicted_gpu_hours += lost as f64 / 3_600_000.0;
            self.set_over_quota(pod, true);
            let k = self.namespace(pod);
            self.lines[k].push((pod, self.now));
        }
    }

    fn finish(mut self, seconds: f64) -> TimelineResult {
        let mut waits: Vec<u64> = self.first_start.iter().flatten().copied().collect();
        waits.sort_unstable();
        let waited: Vec<u64> = waits.iter().copied().filter(|&w| w > 0).collect();
        let at = |q: f64| -> u64 {
            let i = ((waited.len() as f64 * q).ceil() as usize).saturating_sub(1);
            waited.get(i).copied().unwrap_or(0)
        };
        let result = &mut self.result;
        result.started = waits.len();
        result.never_started = result.pods - result.started - result.too_big;
        result.no_node = self.no_node.len();
        result.waited = waited.len();
        result.wait_p50_s = at(0.5);
        result.wait_p99_s = at(0.99);
        result.wait_max_s = waited.last().copied().unwrap_or(0);
        result.stranded_gpu_hours = self.stranded_milli_seconds as f64 / 3_600_000.0;
        result.free_gpu_hours = self.free.hours();
        result.seconds = seconds;
        self.result
    }
}

#[cfg(test)]
#[path = "timeline_tests.rs"]
mod tests;
