//! API mode: reclaim (docs/quota.md, "Cohorts"). When a member of a cohort with
//! `reclaim: Evict` takes back what it lent, its pods are admitted at once and the
//! cohort's pool is overdrawn; this task evicts borrowing pods of that model, through the
//! Eviction API so PodDisruptionBudgets hold, in the order `quota::cohort::reclaim_plan`
//! gives (lowest priority first, then the most recently created), until the cohort is
//! back within what its members own. Each evicted pod gets an Event naming the namespace
//! that took its GPUs back; one a PodDisruptionBudget protects gets a Warning Event, is
//! left alone for a while, and the next candidate is chosen.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use foldhash::HashMap;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, EvictParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::cache::ClusterState;
use crate::cache::pod::{PodKey, key_parts};
use crate::metrics::{EvictionCounter, ReasonLabels};
use crate::placement::mig;
use crate::quota::QuotaView;
use crate::quota::cohort::{BORROWED_ANNOTATION, borrowing_pods, reclaim_plan};

use super::Backend;
use super::pod_events::PodEvents;

/// Borrowed annotations written at once.
const MARKS_IN_FLIGHT: usize = 16;
/// A pass runs at least this often.
const TICK: Duration = Duration::from_secs(2);
/// A pod evicted (or protected by a PodDisruptionBudget) is left out of the plans this
/// long: its eviction is under way (or it is retried after the others).
const RECENT: Duration = Duration::from_secs(30);

/// One eviction a pass decided on.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Planned {
    pod: PodKey,
    uid: String,
    cohort: String,
    model: String,
    /// The namespaces taking back what they lent.
    by: Vec<String>,
}

pub struct Reclaimer {
    backend: Backend,
    client: kube::Client,
    events: PodEvents,
    evictions: EvictionCounter,
    /// Pods this replica evicted (`true`) or found protected by a budget (`false`), and
    /// when.
    recent: Mutex<HashMap<PodKey, (Instant, bool)>>,
}

impl Reclaimer {
    pub fn new(backend: Backend, client: kube::Client, evictions: EvictionCounter) -> Self {
        Reclaimer {
            events: PodEvents::new(client.clone()),
            backend,
            client,
            evictions,
            recent: Mutex::default(),
        }
    }

    /// Pass after pass, every [`TICK`], until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(TICK);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = shutdown.cancelled() => return,
            }
            if self.backend.cache().is_ready() {
                self.pass().await;
            }
        }
    }

    /// One pass over every cohort; returns how many pods were evicted.
    pub async fn pass(&self) -> usize {
        let (leaving, blocked) = self.recent_keys();
        let planned = self.backend.cache().with_state(|state| {
            plan(
                state,
                |key| leaving.contains(key),
                |key| blocked.contains(key),
            )
        });
        let mut evicted = 0;
        for eviction in planned {
            evicted += usize::from(self.evict(eviction).await);
        }
        let (put, take) = self.backend.cache().with_state(|state| marks(state));
        let marks = put.into_iter().map(|(pod, model)| (pod, Some(model)));
        let marks = marks.chain(take.into_iter().map(|pod| (pod, None)));
        futures::stream::iter(marks)
            .for_each_concurrent(MARKS_IN_FLIGHT, |(pod, model)| async move {
                self.mark(&pod, model).await
            })
            .await;
        evicted
    }

    /// Put the borrowed annotation on `pod` (naming `model`), or take it off.
    async fn mark(&self, pod: &PodKey, model: Option<String>) {
        let (namespace, name) = key_parts(pod);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let patch = serde_json::json!({"metadata": {"annotations": {BORROWED_ANNOTATION: model}}});
        if let Err(error) = pods
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::debug!(%namespace, pod = %name, %error, "cannot update the borrowed annotation");
        }
    }

    /// The pods evicted lately (leaving: no longer counted), and those a budget
    /// protected (still counted, not chosen again for a while).
    fn recent_keys(&self) -> (foldhash::HashSet<PodKey>, foldhash::HashSet<PodKey>) {
        let mut recent = self.recent.lock();
        recent.retain(|_, (at, _)| at.elapsed() < RECENT);
        let of = |evicted: bool| {
            let keys = recent.iter().filter(|(_, (_, e))| *e == evicted);
            keys.map(|(key, _)| key.clone()).collect()
        };
        (of(true), of(false))
    }

    async fn evict(&self, eviction: Planned) -> bool {
        let (namespace, name) = key_parts(&eviction.pod);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let by = eviction.by.join(", ");
        let (cohort, model) = (&eviction.cohort, &eviction.model);
        let (event_type, reason, note) = match pods.evict(name, &EvictParams::default()).await {
            Ok(_) => {
                tracing::info!(%namespace, pod = %name, %cohort, %model, %by, "evicted a borrowing pod");
                let note = format!(
                    "evicted: cohort {cohort} takes back the {model} GPUs this pod borrowed, for namespace {by}"
                );
                (EventType::Normal, "QuotaReclaimed", note)
            }
            Err(kube::Error::Api(status)) if status.code == 429 => {
                tracing::info!(%namespace, pod = %name, %cohort, "a PodDisruptionBudget blocks reclaim");
                let note = format!(
                    "cohort {cohort} takes back its {model} GPUs for namespace {by}, but a PodDisruptionBudget blocks evicting this pod; another borrowing pod is chosen, this one retried later"
                );
                (EventType::Warning, "QuotaReclaimBlocked", note)
            }
            Err(kube::Error::Api(status)) if status.code == 404 => return false,
            Err(error) => {
                tracing::warn!(%namespace, pod = %name, %error, "cannot evict a borrowing pod");
                return false;
            }
        };
        let evicted = event_type == EventType::Normal;
        let outcome = if evicted { "evicted" } else { "blocked" };
        let labels = ReasonLabels { reason: outcome };
        self.evictions.get_or_create(&labels).inc();
        let at = (Instant::now(), evicted);
        self.recent.lock().insert(eviction.pod.clone(), at);
        self.events.publish(
            &eviction.pod,
            &eviction.uid,
            event_type,
            reason,
            "Reclaim",
            &note,
        );
        evicted
    }
}

/// Every cohort's members, as views (their use left empty: reclaim counts pods).
fn cohorts(state: &ClusterState) -> BTreeMap<String, Vec<QuotaView>> {
    let mut cohorts: BTreeMap<String, Vec<QuotaView>> = BTreeMap::new();
    for quota in state.quotas() {
        let Some(cohort) = quota.spec.cohort.clone() else {
            continue;
        };
        if let Ok(view) = QuotaView::from_crd(quota) {
            cohorts.entry(cohort).or_default().push(view);
        }
    }
    cohorts
}

/// The models a cohort's members list (MIG profile keys are caps, not lent).
fn models(members: &[QuotaView]) -> Vec<String> {
    let listed = members.iter().flat_map(|m| m.hard.keys());
    let models: BTreeSet<&String> = listed.filter(|m| !mig::is_profile_key(m)).collect();
    models.into_iter().cloned().collect()
}

/// The evictions every cohort calls for now, from the cache's quotas and pods; `leaving`
/// pods (evictions under way) are not counted, `blocked` ones (a budget protected them)
/// are counted but not chosen.
fn plan(
    state: &ClusterState,
    leaving: impl Fn(&PodKey) -> bool,
    blocked: impl Fn(&PodKey) -> bool,
) -> Vec<Planned> {
    let mut planned = Vec::new();
    for (cohort, members) in cohorts(state) {
        for model in models(&members) {
            let pods: Vec<Vec<_>> = members
                .iter()
                .map(|m| {
                    let mut pods = state.charged_pods(&m.namespace, &model);
                    pods.retain(|(key, ..)| !leaving(key));
                    pods
                })
                .collect();
            let plan = reclaim_plan(&members, &model, &pods, &blocked);
            let by: Vec<String> = plan
                .by
                .iter()
                .map(|&i| members[i].namespace.clone())
                .collect();
            for (pod, _) in plan.evict {
                let uid = state
                    .pod(&pod)
                    .map(|p| p.uid.to_string())
                    .unwrap_or_default();
                planned.push(Planned {
                    pod,
                    uid,
                    cohort: cohort.clone(),
                    model: model.clone(),
                    by: by.clone(),
                });
            }
        }
    }
    planned
}

/// The borrowed annotations to put on (pod, model) and to take off: on the pods of each
/// member that `quota::cohort::borrowing_pods` names, off every other pod of a member
/// that carries one.
fn marks(state: &ClusterState) -> (Vec<(PodKey, String)>, Vec<PodKey>) {
    let (mut put, mut take) = (Vec::new(), Vec::new());
    for members in cohorts(state).values() {
        for model in models(members) {
            for member in members {
                let pods = state.charged_pods(&member.namespace, &model);
                let borrowing = borrowing_pods(member, &model, &pods);
                for (key, ..) in pods {
                    let marked = state.pod(&key).is_some_and(|p| p.marked_borrowed);
                    match (borrowing.contains(&key), marked) {
                        (true, false) => put.push((key, model.clone())),
                        (false, true) => take.push(key),
                        _ => {}
                    }
                }
            }
        }
    }
    (put, take)
}
