//! API mode, `defrag.mode: DryRun | Evict` (docs/defrag.md, "In the cluster"): every
//! GPU pod pending for `defrag.pendingSeconds` whose placement is `Fragmented` is planned
//! for, and one whose models have too little free in all while a pod that accepts
//! several runs on them (`model_change_helps`: a move to another model may make room).
//! `DryRun` tells it the plan (or why there is none) in an Event; `Evict` carries the
//! plan out (`mover`), one plan at a time, each made around the GPUs the plans
//! carried out before it hold, and follows it until the pending pod is bound or the
//! holds lapse. Plans are counted in
//! `gpu_admission_defrag_plans_total{outcome}`.
//!
//! The planner needs more of the cluster than the cache keeps (every pod's CPU and
//! memory, the PodDisruptionBudgets, the pods' controllers): watches keep it
//! ([`LiveWorld`]), and a pass that has a pod to plan for copies it; nothing is listed
//! per pass. Planning is bounded: at most [`PODS_PER_PASS`] pods a pass, a pass every
//! [`Planner::EVERY`], a pod planned again at most every [`REPLAN`], and only the replica
//! that holds the controller Lease plans. Finding the fragmented pods is bounded too: one
//! pod judged a read of the cache, for at most [`JUDGE_BUDGET`] a pass.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use foldhash::HashMap;
use kube::runtime::events::EventType;

use crate::cache::{ClusterCache, PodKey};
use crate::config::{Config, DefragMode};
use crate::defrag::{PlanOut, model_change_helps};
use crate::explain::{Code, Judge, Judged};
use crate::metrics::{Metrics, OutcomeLabels};
use crate::placement::defrag::{DEFAULT_BUDGET, Limits};
use crate::placement::learn::LearningPlacer;
use crate::quota::pending::now_second;
use crate::snapshot::{LiveWorld, Snapshot};

use super::leadership::Leader;
use super::pod_events::PodEvents;
use super::skeleton::{Controller, Failures, PassError};

use super::mover::{Carried, Ended, KubeHands, Move, carry_out};

/// Pods planned for in one pass at most.
const PODS_PER_PASS: usize = 8;
/// A pod's plan is worked out again at most this often (the cluster drifts).
const REPLAN: Duration = Duration::from_secs(60);
/// A pass judges pending pods for at most this long, one pod a read.
const JUDGE_BUDGET: Duration = Duration::from_millis(100);

/// Why a pass planned nothing, or a plan carried out stopped for want of an answer.
#[derive(Debug, thiserror::Error)]
enum PlanningError {
    #[error("planning failed: {0}")]
    Join(tokio::task::JoinError),
    /// An eviction the API server did not answer (the plan was aborted, its holds freed).
    #[error("{0}")]
    Evict(String),
}

/// What a pod is told: its plan, or why there is none.
enum Told {
    Planned(Box<PlanOut>),
    Unplanned(String),
}

/// A plan carried out, followed until its pending pod binds or its holds lapse.
struct Running {
    pod: PodKey,
    uid: Box<str>,
    started: Instant,
    until: i64,
}

/// The planner: one per process, acting only while it holds the controller Lease.
pub(crate) struct Planner {
    cache: ClusterCache,
    /// What the planner reads beyond the cache, kept by watches.
    world: LiveWorld,
    client: kube::Client,
    placer: Arc<LearningPlacer>,
    config: Arc<Config>,
    metrics: Arc<Metrics>,
    events: PodEvents,
    leader: Leader,
    /// When each pod was last planned for, and what it was told.
    planned: HashMap<PodKey, (Instant, String)>,
    /// When each due pod was last judged: the pods a pass did not reach come first in
    /// the next.
    judged: HashMap<PodKey, Instant>,
    /// `Evict`: the plans carried out, not yet ended.
    running: Vec<Running>,
    /// `Evict`: the controllers a pod of which was moved, and when.
    cooling: HashMap<String, Instant>,
}

impl Planner {
    pub(crate) fn new(
        cache: ClusterCache,
        world: LiveWorld,
        client: kube::Client,
        placer: Arc<LearningPlacer>,
        config: Arc<Config>,
        metrics: Arc<Metrics>,
        leader: Leader,
    ) -> Self {
        Planner {
            cache,
            world,
            events: PodEvents::new(client.clone()),
            client,
            placer,
            config,
            metrics,
            leader,
            planned: HashMap::default(),
            judged: HashMap::default(),
            running: Vec::new(),
            cooling: HashMap::default(),
        }
    }

    /// The pods to plan for now: pending past `defrag.pendingSeconds`, neither gated
    /// nor placed nor holding a plan's GPUs, their placement `Fragmented`, not planned
    /// for within [`REPLAN`]; the longest pending first among those never judged, then
    /// the least recently judged. A plan under way defers none of them: each plan is made
    /// around the GPUs the others hold (`ClusterState::held_from_others`). Each pod is
    /// judged in a read of its own, and judging stops after [`JUDGE_BUDGET`]: the cache's
    /// writers (and behind them the webhooks' reads) never wait on a whole pass.
    fn fragmented(&mut self, now: Instant, unix_now: i64) -> Vec<(PodKey, Box<str>)> {
        let pending_since = unix_now - i64::from(self.config.defrag.pending_seconds);
        let placer = self.placer.placer();
        let mig = self.cache.projection().names.mig.clone();
        let mut due: Vec<(i64, PodKey)> = self.cache.read(|state| {
            let pending = state.pods().filter(|(_, p)| {
                !p.bound && p.node.is_none() && !p.gated && p.terminating().is_none()
            });
            let unheld = pending.filter(|(_, p)| p.plan_hold().is_none_or(|h| !h.stands(unix_now)));
            let due = unheld.filter(|(_, p)| p.created <= pending_since);
            due.map(|(k, p)| (p.created, k.clone())).collect()
        });
        due.retain(|(_, k)| {
            (self.planned.get(k)).is_none_or(|(at, _)| now.duration_since(*at) >= REPLAN)
        });
        let start = Instant::now();
        let mut found = Vec::new();
        for key in judging_order(due, &mut self.judged) {
            if found.len() >= PODS_PER_PASS || start.elapsed() >= JUDGE_BUDGET {
                break;
            }
            self.judged.insert(key.clone(), Instant::now());
            let fragmented = self.cache.read(|state| {
                let pod = state.pod(&key)?;
                let judge = Judge::new(state, &placer, &mig, &self.config, unix_now);
                let subject = Judged {
                    key: &key,
                    pod,
                    exists: true,
                };
                let code = judge.placement(&subject).code;
                let plannable = code == Code::Fragmented
                    || (code == Code::InsufficientGpus && model_change_helps(state, &key, pod));
                plannable.then(|| pod.uid.clone())
            });
            if let Some(uid) = fragmented {
                found.push((key, uid));
            }
        }
        let planned = &mut self.planned;
        self.cache
            .read(|s| planned.retain(|k, _| s.pod(k).is_some()));
        found
    }

    /// Plan for `keys` on the cluster as the watches keep it, off the async threads
    /// (copying the world is work too); the pods of the controllers in `cooling` stay put.
    async fn plan(
        &self,
        keys: Vec<String>,
        cooling: BTreeSet<String>,
    ) -> Result<Vec<(String, Told)>, PlanningError> {
        let (cache, world) = (self.cache.clone(), self.world.clone());
        let (placer, config) = (self.placer.placer(), self.config.clone());
        let plan = move || -> Vec<(String, Told)> {
            let limits = Limits {
                max_moves: config.defrag.max_moves,
                budget: DEFAULT_BUDGET,
            };
            let Some(mut snapshot) = Snapshot::live(&cache, &world, placer) else {
                return Vec::new(); // not listed yet: the pass said so already
            };
            snapshot.world.cooling = cooling;
            let mut answers = Vec::new();
            for key in keys {
                let report = crate::defrag::plan_in(&snapshot, limits, Some(&key));
                let answer = match report {
                    Ok(mut report) => match (report.plans.pop(), report.unplanned.pop()) {
                        (Some(plan), _) => Told::Planned(Box::new(plan)),
                        (None, Some(no)) => Told::Unplanned(no.reason),
                        (None, None) => continue,
                    },
                    Err(error) => Told::Unplanned(format!("{error:#}")),
                };
                answers.push((key, answer));
            }
            answers
        };
        let span = tracing::Span::current();
        tokio::task::spawn_blocking(move || span.in_scope(plan))
            .await
            .map_err(PlanningError::Join)
    }

    fn count_plan(&self, outcome: &'static str) {
        let labels = OutcomeLabels { outcome };
        self.metrics.defrag_plans.get_or_create(&labels).inc();
    }

    /// Tell `key` (once per distinct note) and remember when it was planned for.
    fn tell(
        &mut self,
        key: PodKey,
        uid: &str,
        (kind, reason): (EventType, &str),
        note: String,
        now: Instant,
    ) {
        let same = (self.planned.get(&key)).is_some_and(|(_, said)| *said == note);
        if !same {
            (self.events).publish(&key, uid, kind, reason, "Plan", &note);
        }
        self.planned.insert(key, (now, note));
    }

    /// `Evict`: end the plans whose pending pod is bound (or gone), or whose holds
    /// lapsed; forget cooldowns past `defrag.cooldownSeconds`.
    fn follow_up(&mut self, unix_now: i64) {
        let cooldown = Duration::from_secs(u64::from(self.config.defrag.cooldown_seconds));
        self.cooling.retain(|_, at| at.elapsed() < cooldown);
        let mut ended = Vec::new();
        self.cache.read(|state| {
            self.running.retain(|run| {
                let pod = state.pod(&run.pod).filter(|p| p.uid == run.uid);
                let outcome = match pod {
                    Some(p) if p.bound => "bound",
                    None => "gone",
                    Some(_) if unix_now >= run.until => "expired",
                    Some(_) => return true,
                };
                ended.push((run.pod.clone(), outcome, run.started.elapsed()));
                false
            });
        });
        for (pod, outcome, took) in ended {
            tracing::info!(%pod, outcome, seconds = took.as_secs_f64(), "defragmentation plan ended");
            if outcome == "bound" {
                self.metrics.defrag_plan_to_bind.observe(took.as_secs_f64());
            }
            if outcome != "gone" {
                self.count_plan(outcome);
            }
        }
    }

    /// `Evict`: carry `plan` out for the pending pod `key`; an error when an eviction
    /// went unanswered (the plan stopped there, as for any other reason).
    async fn carry(
        &mut self,
        key: PodKey,
        uid: &str,
        plan: PlanOut,
        now: Instant,
    ) -> Result<(), PlanningError> {
        let Some(mut hold) = plan.hold.clone() else {
            let note = format!(
                "{}; not carried out: a pod to move names no controller, or MIG slices would have to be held",
                plan.sentence()
            );
            self.tell(key, uid, (EventType::Normal, "DefragPlan"), note, now);
            return Ok(());
        };
        let unix_now = now_second();
        hold.since = unix_now;
        hold.until = unix_now + i64::from(self.config.defrag.hold_seconds);
        let carried = Carried {
            pod: key.to_string(),
            uid: uid.to_string(),
            moves: plan
                .moves
                .iter()
                .map(|m| Move {
                    pod: m.pod.clone(),
                    from: m.from.clone(),
                    uid: m.uid.clone(),
                    owner: m.owner.clone().unwrap_or_default(),
                })
                .collect(),
            hold,
        };
        let mut hands = CountingHands {
            hands: KubeHands {
                client: self.client.clone(),
            },
            metrics: &self.metrics,
            unanswered: None,
        };
        let started = Instant::now();
        let ended = carry_out(&mut hands, &carried).await;
        let unanswered = hands.unanswered.take();
        // The controllers whose pod moved cool down, whether the plan went on or not.
        let moved = match &ended {
            Ended::Moved => carried.moves.len(),
            Ended::Aborted { after, .. } => *after,
        };
        for step in carried.moves.iter().take(moved) {
            self.cooling.insert(step.owner.clone(), Instant::now());
        }
        let sentence = plan.sentence();
        match ended {
            Ended::Moved => {
                self.running.push(Running {
                    pod: key.clone(),
                    uid: uid.into(),
                    started,
                    until: carried.hold.until,
                });
                let seconds = self.config.defrag.hold_seconds;
                tracing::info!(pod = %key, plan = %sentence, "defragmentation plan carried out");
                let note = format!("{sentence}: moved; GPUs held for this pod for {seconds}s");
                self.tell(key, uid, (EventType::Normal, "DefragMoved"), note, now);
            }
            Ended::Aborted { after, why } => {
                self.count_plan("aborted");
                tracing::info!(pod = %key, plan = %sentence, after, %why, "defragmentation plan aborted");
                let note = format!(
                    "{sentence}: stopped after {after} of {} moves, holds freed: {why}",
                    carried.moves.len()
                );
                self.tell(key, uid, (EventType::Warning, "DefragAborted"), note, now);
            }
        }
        unanswered.map_or(Ok(()), |why| Err(PlanningError::Evict(why)))
    }
}

/// The API server's hands, with each eviction counted by outcome.
struct CountingHands<'m> {
    hands: KubeHands,
    metrics: &'m Metrics,
    /// Why an eviction failed for want of an answer, if one did.
    unanswered: Option<String>,
}

impl super::mover::Hands for CountingHands<'_> {
    async fn hold(&mut self, plan: &Carried) -> bool {
        self.hands.hold(plan).await
    }

    async fn recheck(&mut self, plan: &Carried, index: usize) -> Result<(), super::mover::Stale> {
        self.hands.recheck(plan, index).await
    }

    async fn evict(&mut self, plan: &Carried, index: usize) -> super::mover::Evicted {
        let evicted = self.hands.evict(plan, index).await;
        let outcome = match &evicted {
            super::mover::Evicted::Yes => "evicted",
            super::mover::Evicted::Refused(_) => "refused",
            super::mover::Evicted::Failed(why) => {
                self.unanswered = Some(why.clone());
                "failed"
            }
        };
        tracing::info!(pod = %plan.moves[index].pod, outcome, "defragmentation eviction");
        self.metrics
            .defrag_evictions
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
        evicted
    }

    async fn release(&mut self, plan: &Carried) {
        self.hands.release(plan).await;
    }
}

/// The order a pass judges the `due` pods (each with its creation second) in: those
/// never judged first, the longest pending first, then the least recently `judged`;
/// pods no longer due are forgotten.
fn judging_order(
    mut due: Vec<(i64, PodKey)>,
    judged: &mut HashMap<PodKey, Instant>,
) -> Vec<PodKey> {
    let live: foldhash::HashSet<&PodKey> = due.iter().map(|(_, k)| k).collect();
    judged.retain(|key, _| live.contains(key));
    due.sort_by(|a, b| {
        let last = |key: &PodKey| judged.get(key).copied();
        last(&a.1).cmp(&last(&b.1)).then(a.cmp(b))
    });
    due.into_iter().map(|(_, key)| key).collect()
}

impl Controller for Planner {
    const NAME: &'static str = "defrag";
    const EVERY: Duration = Duration::from_secs(10);

    fn lease(&self) -> Option<&Leader> {
        Some(&self.leader)
    }

    async fn pass(&mut self) -> Result<usize, PassError> {
        let now = Instant::now();
        let unix_now = now_second();
        let evict = self.config.defrag.mode == DefragMode::Evict;
        if evict {
            self.follow_up(unix_now);
        }
        if !self.world.listed() {
            tracing::debug!("the world is not listed yet; planning waits");
            return Ok(0);
        }
        let due = self.fragmented(now, unix_now);
        if due.is_empty() {
            return Ok(0);
        }
        let keys: Vec<String> = due.iter().map(|(k, _)| k.to_string()).collect();
        let cooling = self.cooling.keys().cloned().collect();
        let mut failures = Failures::default();
        let answers = match self.plan(keys, cooling).await {
            Ok(answers) => answers,
            Err(error) => {
                tracing::warn!(%error, "cannot plan for the pods a fragmented cluster keeps waiting");
                failures.note(error);
                return failures.outcome(0);
            }
        };
        let uids: HashMap<String, Box<str>> = (due.into_iter())
            .map(|(k, uid)| (k.to_string(), uid))
            .collect();
        let mut acted = 0;
        // The models a plan was carried out for in this pass: the other plans of this
        // pass were made without its holds, so they wait for the next pass.
        let mut carried: BTreeSet<String> = BTreeSet::new();
        for (key, answer) in answers {
            let Some(uid) = uids.get(&key).cloned() else {
                continue;
            };
            let key: PodKey = key.into();
            let plan = match answer {
                Told::Planned(plan) => plan,
                Told::Unplanned(why) => {
                    self.count_plan("unplanned");
                    let kind = (EventType::Normal, "DefragNoPlan");
                    self.tell(key, &uid, kind, format!("no plan: {why}"), now);
                    acted += 1;
                    continue;
                }
            };
            let model = plan.hold.as_ref().map(|h| h.model.clone());
            let carry = evict && !plan.moves.is_empty();
            if carry && model.as_ref().is_some_and(|m| carried.contains(m)) {
                continue; // planned again in the next pass, told nothing meanwhile
            }
            self.count_plan("planned");
            if !carry {
                let note = plan.sentence();
                self.tell(key, &uid, (EventType::Normal, "DefragPlan"), note, now);
            } else {
                carried.extend(model);
                if let Err(error) = self.carry(key, &uid, *plan, now).await {
                    failures.note(error);
                }
            }
            acted += 1;
        }
        failures.outcome(acted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_a_pass_did_not_reach_are_judged_first_in_the_next() {
        let key = |name: &str| PodKey::from(format!("team/{name}"));
        let start = Instant::now();
        let mut judged = HashMap::default();
        judged.insert(key("recent"), start + Duration::from_secs(5));
        judged.insert(key("earlier"), start);
        judged.insert(key("gone"), start);
        let due = vec![
            (30, key("recent")),
            (20, key("new-young")),
            (10, key("new-old")),
            (40, key("earlier")),
        ];
        let order = judging_order(due, &mut judged);
        let names = ["new-old", "new-young", "earlier", "recent"].map(key);
        assert_eq!(order, names);
        assert!(
            !judged.contains_key(&key("gone")),
            "no longer due: forgotten"
        );
    }
}
