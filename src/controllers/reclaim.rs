//! API mode: reclaim (docs/quota.md, "Cohorts" and "The reclaim bound"). When a member
//! of a cohort with `reclaim: Evict` takes back what it lent, its pods are admitted at
//! once and the cohort's pool is overdrawn; this task takes borrowing pods of that model
//! back, in the order `quota::cohort::reclaim_plan` gives (pods already leaving first,
//! then those no PodDisruptionBudget protected lately; lowest priority, then the most
//! recently created), until the cohort is back within what its members own.
//!
//! A chosen pod is evicted through the Eviction API, so budgets hold, and tried again
//! while a budget refuses. If it is still there `reclaim.timeoutSeconds` after it was
//! first chosen (refused by its budget, or evicted but still in its own long grace
//! period, or deleted by its owner with one), it is deleted with a grace period of at
//! most `reclaim.maxGraceSeconds`: nothing a borrower writes holds a lender's GPUs past
//! that bound. Only the replica holding the controller Lease acts (`leadership`). Each
//! act gets an Event on the pod naming the namespace that took its GPUs back.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use foldhash::HashMap;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, EvictParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::EventType;

use crate::cache::ClusterState;
use crate::cache::pod::{PodKey, key_parts};
use crate::config::ReclaimConfig;
use crate::metrics::{EvictionCounter, ReasonLabels};
use crate::placement::mig;
use crate::quota::QuotaView;
use crate::quota::cohort::{BORROWED_ANNOTATION, Standing};
use crate::quota::pool::{borrowing_pods, reclaim_plan};

use super::leadership::Leader;
use super::pod_events::PodEvents;
use super::skeleton::{Controller, Failures, PassError, Recent, bounded};
use crate::backend::Backend;

/// Borrowed annotations written at once.
const MARKS_IN_FLIGHT: usize = 16;
/// A pass runs at least this often.
const TICK: Duration = Duration::from_secs(2);
/// A chosen pod whose eviction a budget refused is tried again this often.
const RETRY: Duration = Duration::from_secs(5);
/// A pod a budget protected is taken after the others for this long.
const PROTECTED: Duration = Duration::from_secs(30);
/// A pod no plan chose for this long starts its bound again if chosen later: plans
/// that alternate between candidates (one protected, then another) keep each one's
/// clock.
const FORGET: Duration = Duration::from_secs(60);
/// The annotation that tells a borrowing pod's owner how its GPUs may be taken back.
pub(crate) use crate::marks::RECLAIM_ANNOTATION;

/// One pod a pass decided to take back.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Planned {
    pod: PodKey,
    uid: String,
    cohort: String,
    model: String,
    /// The namespaces taking back what they lent.
    by: Vec<String>,
    leaving: bool,
}

/// What this replica did to a pod it chose, since when.
#[derive(Debug, Clone)]
struct Chosen {
    uid: String,
    /// When a plan first chose it: the reclaim bound runs from here.
    since: Instant,
    /// When a plan last chose it.
    planned: Instant,
    /// The last eviction tried, if any.
    tried: Option<Instant>,
    /// A budget refused its eviction (reported once).
    blocked: bool,
    /// Deleted with the capped grace period.
    deleted: bool,
}

/// The act a pass takes on a chosen pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    Evict,
    Delete,
    Wait,
}

impl Chosen {
    fn new(uid: &str, now: Instant) -> Self {
        Chosen {
            uid: uid.to_string(),
            since: now,
            planned: now,
            tried: None,
            blocked: false,
            deleted: false,
        }
    }

    /// What to do now: past the timeout, delete (once); a pod already leaving waits for
    /// it; any other is evicted, again every [`RETRY`] while a budget refuses.
    fn act(&self, leaving: bool, now: Instant, timeout: Duration) -> Act {
        if self.deleted {
            Act::Wait
        } else if now.duration_since(self.since) >= timeout {
            Act::Delete
        } else if leaving || self.tried.is_some_and(|t| now.duration_since(t) < RETRY) {
            Act::Wait
        } else {
            Act::Evict
        }
    }
}

pub struct Reclaimer {
    backend: Backend,
    client: kube::Client,
    events: PodEvents,
    evictions: EvictionCounter,
    bound: ReclaimConfig,
    leader: Leader,
    /// The pods the current plans chose, by key.
    chosen: HashMap<PodKey, Chosen>,
    /// Pods a budget protected lately: taken after the others.
    protected: Recent<PodKey>,
}

impl Reclaimer {
    pub fn new(
        backend: Backend,
        client: kube::Client,
        evictions: EvictionCounter,
        bound: ReclaimConfig,
        leader: Leader,
    ) -> Self {
        Reclaimer {
            events: PodEvents::new(client.clone()),
            leader,
            backend,
            client,
            evictions,
            bound,
            chosen: HashMap::default(),
            protected: Recent::new(PROTECTED),
        }
    }

    /// One pass over every cohort: how many pods were evicted or deleted, or what failed
    /// (the other pods are still taken back, and the failed ones tried next pass).
    async fn pass_all(&mut self) -> Result<usize, PassError> {
        let now = Instant::now();
        self.protected.forget(now, |_| true);
        let protected = &self.protected;
        let planned = self.backend.cache().read(|state| {
            plan(state, |key, leaving| match () {
                _ if leaving => Standing::Leaving,
                _ if protected.contains(key) => Standing::Protected,
                _ => Standing::Evictable,
            })
        });
        self.chosen
            .retain(|_, c| now.duration_since(c.planned) < FORGET);
        let timeout = Duration::from_secs(self.bound.timeout_seconds.into());
        let mut acted = 0;
        let mut failures = Failures::default();
        for planned in planned {
            let chosen = (self.chosen.entry(planned.pod.clone()))
                .and_modify(|c| match c.uid == planned.uid {
                    true => c.planned = now,
                    false => *c = Chosen::new(&planned.uid, now),
                })
                .or_insert_with(|| Chosen::new(&planned.uid, now));
            let act = chosen.act(planned.leaving, now, timeout);
            let done = match act {
                Act::Evict => self.evict(&planned, now).await,
                Act::Delete => self.delete(&planned).await,
                Act::Wait => Ok(false),
            };
            match done {
                Ok(done) => acted += usize::from(done),
                Err(error) => failures.note(error),
            }
        }
        self.mark_borrowers(&mut failures).await;
        failures.outcome(acted)
    }

    /// Put the borrowed annotations on the pods that borrow, and take them off the others.
    async fn mark_borrowers(&self, failures: &mut Failures) {
        let (put, take) = self.backend.cache().read(marks);
        let marks = put.into_iter().map(|(pod, model)| (pod, Some(model)));
        let marks = marks.chain(take.into_iter().map(|pod| (pod, None)));
        let failed: Vec<kube::Error> = futures::stream::iter(marks)
            .map(|(pod, model)| async move { self.mark(&pod, model).await })
            .buffer_unordered(MARKS_IN_FLIGHT)
            .filter_map(|marked| std::future::ready(marked.err()))
            .collect()
            .await;
        failed.into_iter().for_each(|error| failures.note(error));
    }

    /// Put the borrowed annotation on `pod` (naming `model`) with the terms it may be taken
    /// back on, or take both off. A pod gone meanwhile is no failure.
    async fn mark(&self, pod: &PodKey, model: Option<String>) -> Result<(), kube::Error> {
        let (namespace, name) = key_parts(pod);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let terms = model.as_ref().map(|_| reclaim_terms(&self.bound));
        let annotations =
            serde_json::json!({BORROWED_ANNOTATION: model, RECLAIM_ANNOTATION: terms});
        let patch = serde_json::json!({"metadata": {"annotations": annotations}});
        let params = PatchParams::default();
        match bounded(pods.patch(name, &params, &Patch::Merge(&patch))).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(error) => {
                tracing::debug!(%namespace, pod = %name, %error, "cannot update the borrowed annotation");
                Err(error)
            }
        }
    }

    /// Evict `planned` through the Eviction API: `true` when it was, `false` when a
    /// budget refused or the pod is gone; an error when the API server did not answer.
    async fn evict(&mut self, planned: &Planned, now: Instant) -> Result<bool, kube::Error> {
        let (namespace, name) = key_parts(&planned.pod);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let (cohort, model, by) = (&planned.cohort, &planned.model, planned.by.join(", "));
        let outcome = bounded(pods.evict(name, &EvictParams::default())).await;
        if let Some(chosen) = self.chosen.get_mut(&planned.pod) {
            chosen.tried = Some(now);
        }
        match outcome {
            Ok(_) => {
                tracing::info!(%namespace, pod = %name, %cohort, %model, %by, "evicted a borrowing pod");
                self.count("evicted");
                let note = format!(
                    "evicted: cohort {cohort} takes back the {model} GPUs this pod borrowed, for namespace {by}"
                );
                self.tell(planned, EventType::Normal, "QuotaReclaimed", &note);
                Ok(true)
            }
            Err(kube::Error::Api(status)) if status.code == 429 => {
                self.protected.note(planned.pod.clone(), now);
                let chosen = self.chosen.get_mut(&planned.pod);
                if chosen.is_some_and(|c| !std::mem::replace(&mut c.blocked, true)) {
                    tracing::info!(%namespace, pod = %name, %cohort, "a PodDisruptionBudget blocks reclaim");
                    self.count("blocked");
                    let timeout = self.bound.timeout_seconds;
                    let grace = self.bound.max_grace_seconds;
                    let note = format!(
                        "cohort {cohort} takes back its {model} GPUs for namespace {by}, but a PodDisruptionBudget blocks evicting this pod: another borrowing pod is taken if one can be, else this one is deleted {timeout}s after it was chosen, with a grace period of at most {grace}s"
                    );
                    self.tell(planned, EventType::Warning, "QuotaReclaimBlocked", &note);
                }
                Ok(false)
            }
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
            Err(error) => {
                tracing::warn!(%namespace, pod = %name, %error, "cannot evict a borrowing pod");
                Err(error)
            }
        }
    }

    /// Delete `planned` with a grace period of at most `reclaim.maxGraceSeconds` (the
    /// API server shortens the grace of a pod already being deleted, never lengthens
    /// it), on its uid: `true` when it was, `false` when it is gone or another pod has
    /// its name; an error when the API server did not answer.
    async fn delete(&mut self, planned: &Planned) -> Result<bool, kube::Error> {
        let (namespace, name) = key_parts(&planned.pod);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let grace = self.bound.max_grace_seconds;
        let params = DeleteParams {
            grace_period_seconds: Some(grace),
            preconditions: Some(Preconditions {
                uid: Some(planned.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let outcome = bounded(pods.delete(name, &params)).await;
        if let Some(chosen) = self.chosen.get_mut(&planned.pod) {
            chosen.deleted = outcome.is_ok();
        }
        let (cohort, model, by) = (&planned.cohort, &planned.model, planned.by.join(", "));
        let timeout = self.bound.timeout_seconds;
        match outcome {
            Ok(_) => {
                tracing::info!(%namespace, pod = %name, %cohort, %model, %by, grace, "deleted a borrowing pod past the reclaim timeout");
                self.count("deleted");
                let note = format!(
                    "deleted with a grace period of at most {grace}s: cohort {cohort} takes back the {model} GPUs this pod borrowed, for namespace {by}, and it was still here {timeout}s after it was chosen"
                );
                self.tell(planned, EventType::Warning, "QuotaReclaimDeleted", &note);
                Ok(true)
            }
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(false),
            Err(error) => {
                tracing::warn!(%namespace, pod = %name, %error, "cannot delete a borrowing pod");
                Err(error)
            }
        }
    }

    fn count(&self, outcome: &'static str) {
        let labels = ReasonLabels { reason: outcome };
        self.evictions.get_or_create(&labels).inc();
    }

    fn tell(&self, planned: &Planned, type_: EventType, reason: &str, note: &str) {
        let (pod, uid) = (&planned.pod, &planned.uid);
        self.events
            .publish(pod, uid, type_, reason, "Reclaim", note);
    }
}

/// The terms a borrowing pod may be taken back on, as its annotation states them.
pub fn reclaim_terms(bound: &ReclaimConfig) -> String {
    let (timeout, grace) = (bound.timeout_seconds, bound.max_grace_seconds);
    format!(
        "when a lender of the cohort needs these GPUs: evicted (PodDisruptionBudgets respected), and if still running {timeout}s later, deleted with a grace period of at most {grace}s"
    )
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

/// The pods every cohort takes back now, from the cache's quotas and pods, each pod's
/// standing given by `standing(key, leaving)`.
fn plan(state: &ClusterState, standing: impl Fn(&PodKey, bool) -> Standing) -> Vec<Planned> {
    let mut planned = Vec::new();
    let leaving = |key: &PodKey| state.pod(key).is_some_and(|p| p.terminating().is_some());
    for (cohort, members) in cohorts(state) {
        for model in models(&members) {
            let pods: Vec<Vec<_>> = (members.iter())
                .map(|m| state.charged_pods(&m.namespace, &model))
                .collect();
            let plan = reclaim_plan(&members, &model, &pods, |key| standing(key, leaving(key)));
            let by: Vec<String> = (plan.by.iter())
                .map(|&i| members[i].namespace.clone())
                .collect();
            for (pod, _) in plan.evict {
                let uid = state.pod(&pod).map(|p| p.uid.to_string());
                planned.push(Planned {
                    uid: uid.unwrap_or_default(),
                    leaving: leaving(&pod),
                    pod,
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

impl Controller for Reclaimer {
    const NAME: &'static str = "reclaim";
    const EVERY: Duration = TICK;

    async fn pass(&mut self) -> Result<usize, PassError> {
        self.pass_all().await
    }

    fn lease(&self) -> Option<&Leader> {
        Some(&self.leader)
    }

    /// Another replica reclaims: what this one chose is its to finish.
    fn stand_by(&mut self) {
        self.chosen.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bound: a chosen pod is evicted, tried again every few seconds while its
    /// budget refuses, and deleted once the timeout has passed since it was first
    /// chosen, however it is doing; a pod already leaving is left to leave until then.
    #[test]
    fn a_chosen_pod_is_evicted_then_deleted_at_the_timeout_whatever_protects_it() {
        let start = Instant::now();
        let timeout = Duration::from_secs(45);
        let mut chosen = Chosen::new("u", start);
        assert_eq!(chosen.act(false, start, timeout), Act::Evict);
        chosen.tried = Some(start);
        let soon = start + Duration::from_secs(1);
        assert_eq!(
            chosen.act(false, soon, timeout),
            Act::Wait,
            "not retried at once"
        );
        assert_eq!(chosen.act(false, start + RETRY, timeout), Act::Evict);
        assert_eq!(
            chosen.act(true, soon, timeout),
            Act::Wait,
            "leaving on its own"
        );
        let late = start + timeout;
        assert_eq!(
            chosen.act(false, late, timeout),
            Act::Delete,
            "a budget holds it"
        );
        assert_eq!(
            chosen.act(true, late, timeout),
            Act::Delete,
            "a long grace holds it"
        );
        chosen.deleted = true;
        assert_eq!(
            chosen.act(true, late + RETRY, timeout),
            Act::Wait,
            "deleted once"
        );
    }

    #[test]
    fn a_borrowing_pod_is_told_the_bound_it_may_be_taken_back_within() {
        let terms = reclaim_terms(&ReclaimConfig::default());
        assert!(terms.contains("PodDisruptionBudgets respected"), "{terms}");
        assert!(
            terms.contains("45s later") && terms.contains("at most 30s"),
            "{terms}"
        );
    }
}
