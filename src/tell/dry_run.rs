//! API mode, `defrag.mode: DryRun` (docs/defrag.md, "In the cluster"): every GPU pod
//! pending for `defrag.pendingSeconds` whose placement is `Fragmented` is told the
//! defragmentation planner's plan (or why there is none) in an Event, and the plan is
//! counted in `gpu_admission_defrag_plans_total{outcome}`. Nothing is evicted.
//!
//! The planner needs more of the cluster than the cache keeps (every pod's CPU and
//! memory, the PodDisruptionBudgets, the pods' controllers), so a pass that has a pod to
//! plan for lists them from the API server, as `gpu-admission defrag --kubeconfig` does.
//! That is bounded: at most [`PODS_PER_PASS`] pods a pass, a pass every [`Planner::EVERY`],
//! a pod planned again at most every [`REPLAN`], and only the replica that holds the
//! controller Lease plans.

use std::sync::Arc;
use std::time::{Duration, Instant};

use foldhash::HashMap;
use kube::runtime::events::EventType;

use crate::cache::{ClusterCache, PodKey, Projection};
use crate::config::Config;
use crate::explain::{Code, Judge, Subject};
use crate::metrics::{Metrics, OutcomeLabels};
use crate::placement::defrag::{DEFAULT_BUDGET, Limits};
use crate::placement::learn::LearningPlacer;

use crate::backend::controller::Controller;
use crate::backend::leadership::Leader;
use crate::backend::pod_events::PodEvents;

/// Pods planned for in one pass at most.
const PODS_PER_PASS: usize = 8;
/// A pod's plan is worked out again at most this often (the cluster drifts).
const REPLAN: Duration = Duration::from_secs(60);

/// What a pod is told: its plan as one sentence, or why there is none.
enum Answer {
    Planned(String),
    Unplanned(String),
}

/// The dry-run planner: one per process, acting only while it holds the controller Lease.
pub(crate) struct Planner {
    cache: ClusterCache,
    client: kube::Client,
    placer: Arc<LearningPlacer>,
    config: Arc<Config>,
    metrics: Arc<Metrics>,
    events: PodEvents,
    leader: Leader,
    /// When each pod was last planned for, and what it was told.
    planned: HashMap<PodKey, (Instant, String)>,
}

impl Planner {
    pub(crate) fn new(
        cache: ClusterCache,
        client: kube::Client,
        placer: Arc<LearningPlacer>,
        config: Arc<Config>,
        metrics: Arc<Metrics>,
        leader: Leader,
    ) -> Self {
        Planner {
            cache,
            events: PodEvents::new(client.clone()),
            client,
            placer,
            config,
            metrics,
            leader,
            planned: HashMap::default(),
        }
    }

    /// The pods to plan for now: pending past `defrag.pendingSeconds`, neither gated
    /// nor placed, their placement `Fragmented`, not planned for within [`REPLAN`];
    /// the longest pending first.
    fn fragmented(&mut self, now: Instant, unix_now: i64) -> Vec<(PodKey, Box<str>)> {
        let pending_since = unix_now - i64::from(self.config.defrag.pending_seconds);
        let placer = self.placer.placer();
        let mig = self.cache.projection().names.mig.clone();
        let found = self.cache.read(|state| {
            let judge = Judge::new(state, &placer, &mig, &self.config, unix_now);
            let pending = state.pods().filter(|(_, p)| {
                !p.bound && p.node.is_none() && !p.gated && p.terminating.is_none()
            });
            let due = pending
                .filter(|(_, p)| p.created <= pending_since)
                .filter(|(k, _)| {
                    (self.planned.get(*k)).is_none_or(|(at, _)| now.duration_since(*at) >= REPLAN)
                });
            let mut due: Vec<_> = due.collect();
            due.sort_by_key(|(k, p)| (p.created, (*k).clone()));
            let fragmented = due.into_iter().filter(|(key, pod)| {
                let subject = Subject {
                    key,
                    pod,
                    exists: true,
                };
                judge.placement(&subject).code == Code::Fragmented
            });
            let fragmented = fragmented.map(|(k, p)| (k.clone(), p.uid.clone()));
            fragmented.take(PODS_PER_PASS).collect::<Vec<_>>()
        });
        let planned = &mut self.planned;
        self.cache
            .read(|s| planned.retain(|k, _| s.pod(k).is_some()));
        found
    }
}

impl Controller for Planner {
    const NAME: &'static str = "defrag_dry_run";
    const EVERY: Duration = Duration::from_secs(10);

    fn lease(&self) -> Option<&Leader> {
        Some(&self.leader)
    }

    async fn pass(&mut self) -> usize {
        let now = Instant::now();
        let due = self.fragmented(now, crate::quota::pending::now_second());
        if due.is_empty() {
            return 0;
        }
        let objects = match crate::defrag::list_cluster(&self.client).await {
            Ok(objects) => objects,
            Err(error) => {
                tracing::warn!(
                    error = format!("{error:#}"),
                    "cannot read the cluster to plan"
                );
                return 0;
            }
        };
        let config = self.config.clone();
        let keys: Vec<String> = due.iter().map(|(k, _)| k.to_string()).collect();
        let plan = move || -> anyhow::Result<Vec<(String, Answer)>> {
            let limits = Limits {
                max_moves: config.defrag.max_moves,
                budget: DEFAULT_BUDGET,
            };
            let world = crate::defrag::World::read(&objects)?;
            let source = "the API server";
            let projection = Projection::from_config(&config);
            let cache = ClusterCache::from_objects(&objects, source, projection)?;
            let placer = crate::defrag::learned_placer(&cache, &config);
            let mut answers = Vec::new();
            for key in keys {
                let report = crate::defrag::plan_in(&cache, &world, &placer, limits, Some(&key));
                let answer = match report {
                    Ok(report) => match (report.plans.first(), report.unplanned.first()) {
                        (Some(plan), _) => Answer::Planned(plan.sentence()),
                        (None, Some(no)) => Answer::Unplanned(no.reason.clone()),
                        (None, None) => continue,
                    },
                    Err(error) => Answer::Unplanned(format!("{error:#}")),
                };
                answers.push((key, answer));
            }
            Ok(answers)
        };
        let span = tracing::Span::current();
        let planned = tokio::task::spawn_blocking(move || span.in_scope(plan)).await;
        let answers = match planned {
            Ok(Ok(answers)) => answers,
            Ok(Err(error)) => {
                tracing::warn!(error = format!("{error:#}"), "cannot plan");
                return 0;
            }
            Err(error) => {
                tracing::warn!(%error, "planning failed");
                return 0;
            }
        };
        let uids: HashMap<String, Box<str>> = (due.into_iter())
            .map(|(k, uid)| (k.to_string(), uid))
            .collect();
        let mut told = 0;
        for (key, answer) in answers {
            let (outcome, reason, note) = match answer {
                Answer::Planned(sentence) => ("planned", "DefragPlan", sentence),
                Answer::Unplanned(why) => ("unplanned", "DefragNoPlan", format!("no plan: {why}")),
            };
            let labels = OutcomeLabels { outcome };
            self.metrics.defrag_plans.get_or_create(&labels).inc();
            let key: PodKey = key.into();
            let same = (self.planned.get(&key)).is_some_and(|(_, said)| *said == note);
            if !same && let Some(uid) = uids.get(&*key) {
                let (events, action) = (&self.events, "Plan");
                events.publish(&key, uid, EventType::Normal, reason, action, &note);
                told += 1;
            }
            self.planned.insert(key, (now, note));
        }
        told
    }
}
