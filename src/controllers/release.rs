//! API mode: the releaser of the quota queue (`onExceed: Queue`, docs/quota.md). It
//! lets waiting pods go in the order `quota::queue::plan` gives: for each, it charges
//! the GPUQuota ledger (the same exact, optimistic write as admission) and only then
//! removes the pod's gate, with a JSON Patch whose `test` operations make the removal
//! happen once: if the pod changed, went away or another replica let it go first, the
//! patch fails and the charge is given back. So any number of replicas may release at
//! once and the quota is never passed; at worst a pod is charged twice for the
//! milliseconds between a losing replica's charge and its give-back.

use std::time::{Duration, Instant};

use foldhash::HashMap;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tracing::Instrument;

use crate::cache::pod::{is_gated, key_parts};
use crate::metrics::{NamespaceModelLabels, WaitHistogram};
use crate::quota::pending::{ChargeId, CreatedSecond, format_second, now_second};
use crate::quota::queue::{
    QUOTA_GATE, QueueRules, RELEASED_ANNOTATION, Turn, WaitReason, Waiting, plan,
};
use crate::quota::{Charge, GPUQuota, ModelAmounts};

use super::leadership::Leader;
use super::pod_events::PodEvents;
use super::skeleton::{Controller, Failures, PassError, Recent, bounded};
use crate::backend::quota_writer::{Ask, ChargeOutcome, read_quotas};
use crate::backend::{Backend, ChargeError};

/// A pass runs at least this often, for what no watch event announces (time passing
/// makes a pod overdue).
const TICK: Duration = Duration::from_secs(2);
/// A pod this replica let go is left out of its plans until the watch shows it ungated,
/// or this long: its charge is in the ledger already.
const RECENT: Duration = Duration::from_secs(10);
/// How much of a namespace's line one pass reads (under the cache lock) and plans: pods
/// further back wait for a later pass.
const LINE_HEAD: usize = 1_000;
/// Releases written at once in one pass.
const IN_FLIGHT: usize = 32;
/// Reads of a pod whose ungate failed before its charge is left to expire: about a
/// minute, the pause doubling from 0.25 s to 4 s.
const SETTLE_ATTEMPTS: usize = 19;

/// The pauses between the tries of a give-back or a settle ([`SETTLE_ATTEMPTS`] of
/// them): doubling from 0.25 s to 4 s.
fn retry_pauses() -> impl Iterator<Item = Duration> {
    let first = Duration::from_millis(250);
    std::iter::successors(Some(first), |p| Some((*p * 2).min(Duration::from_secs(4))))
        .take(SETTLE_ATTEMPTS)
}

/// Why letting a pod go did not happen (logged; the pod keeps waiting).
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error(transparent)]
    Charge(#[from] ChargeError),
    #[error("reading the pod failed: {0}")]
    Read(kube::Error),
    #[error("removing the gate failed: {0}")]
    Ungate(kube::Error),
    #[error(
        "the API server did not answer for a minute after a failed ungate; the charge expires with its pending entry"
    )]
    Unsettled,
}

pub struct Releaser {
    backend: Backend,
    client: kube::Client,
    rules: QueueRules,
    events: PodEvents,
    waits: WaitHistogram,
    /// Pods this replica let go lately.
    recent: Mutex<Recent<String>>,
    /// Pods told (an Event) why they wait, while they wait, with what they were told:
    /// the pod ahead they wait behind, or `None` for room.
    told: Mutex<HashMap<String, Option<String>>>,
    /// Whether this replica holds the controller Lease: only that one tells, so a pod
    /// gets one Event per change, not one per replica.
    leader: Leader,
    /// Pods whose ungate failed, while [`Releaser::settle`] finds out what happened: no
    /// pass plans them meanwhile (a second release could keep a second charge).
    settling: Mutex<foldhash::HashSet<String>>,
}

/// A pod's turn at its gate: in one pass the charges are written concurrently, but the
/// gates come off in line order, each after the one before it has come off (or failed
/// to), so that nobody sees a pod let go while one ahead of it still waits.
struct GateTurn {
    /// Resolves (or fails, when dropped) once the pod ahead is through its gate.
    after: Option<oneshot::Receiver<()>>,
    /// Dropped when this pod is through: the pod behind goes.
    _through: oneshot::Sender<()>,
}

impl GateTurn {
    /// One turn per pod, in line order.
    fn line(pods: usize) -> Vec<GateTurn> {
        let mut ahead = None;
        (0..pods)
            .map(|_| {
                let (through, next) = oneshot::channel();
                GateTurn {
                    after: ahead.replace(next),
                    _through: through,
                }
            })
            .collect()
    }

    /// Wait for the pod ahead to be through its gate.
    async fn wait(&mut self) {
        if let Some(after) = self.after.take() {
            let _ = after.await;
        }
    }
}

/// A pod in [`Releaser::settling`] for as long as this lives: until its settle ends,
/// however it ends (a cancelled settle too).
struct Settling<'a> {
    set: &'a Mutex<foldhash::HashSet<String>>,
    key: &'a str,
}

impl<'a> Settling<'a> {
    fn mark(set: &'a Mutex<foldhash::HashSet<String>>, key: &'a str) -> Self {
        set.lock().insert(key.to_string());
        Settling { set, key }
    }
}

impl Drop for Settling<'_> {
    fn drop(&mut self) {
        self.set.lock().remove(self.key);
    }
}

impl Releaser {
    pub fn new(
        backend: Backend,
        client: kube::Client,
        rules: QueueRules,
        waits: WaitHistogram,
        leader: Leader,
    ) -> Self {
        Releaser {
            leader,
            events: PodEvents::new(client.clone()),
            backend,
            client,
            rules,
            waits,
            recent: Mutex::new(Recent::new(RECENT)),
            told: Mutex::default(),
            settling: Mutex::default(),
        }
    }

    /// One pass over every namespace where pods wait: how many were let go, or what
    /// failed (each pod that could not be let go waits for a later pass).
    async fn pass_all(&self) -> Result<usize, PassError> {
        let cache = self.backend.cache();
        let namespaces = cache.read(|state| state.waiting_namespaces());
        let mut released = 0;
        let mut failures = Failures::default();
        for namespace in namespaces {
            released += self.pass_namespace(&namespace, &mut failures).await;
        }
        failures.outcome(released)
    }

    async fn pass_namespace(&self, namespace: &str, failures: &mut Failures) -> usize {
        let now = now_second();
        let recent = self.recent_keys();
        let planned = self.backend.cache().read(|state| {
            let views = state.namespace_quota(namespace).views()?;
            let max_pass_over = self.rules.max_pass_over;
            let mut waiting = state.waiting_line(namespace, now, max_pass_over, LINE_HEAD);
            waiting.retain(|w| !recent.contains(&w.key));
            Ok::<_, crate::quota::StatusError>(plan(namespace, &views, waiting, now, self.rules))
        });
        let turns = match planned {
            Ok(turns) => turns,
            Err(error) => {
                tracing::warn!(%namespace, %error, "cannot plan the quota queue");
                failures.note(error);
                return 0;
            }
        };
        let uncharged =
            |(_, turn): &(Waiting, Turn)| matches!(turn, Turn::LetGo(Charge::Unlimited));
        if turns.iter().any(uncharged) {
            match self.no_quota_covers(namespace).await {
                Ok(true) => {}
                // Planned again, with the quotas the API server has, next pass.
                Ok(false) => return 0,
                Err(error) => {
                    tracing::warn!(%namespace, %error, "cannot confirm that no GPUQuota covers the waiting pods");
                    failures.note(error);
                    return 0;
                }
            }
        }
        let mut releases = Vec::new();
        let mut told = false;
        for (pod, turn) in turns {
            match turn {
                Turn::LetGo(charge) => releases.push((pod, charge)),
                Turn::Wait { place, why } => told |= self.tell(pod, place, why),
            }
        }
        let turns = GateTurn::line(releases.len());
        let outcomes: Vec<Result<bool, ReleaseError>> =
            futures::stream::iter(releases.into_iter().zip(turns))
                .map(|((pod, charge), turn)| self.let_go(namespace, pod, charge, now, turn))
                .buffer_unordered(IN_FLIGHT)
                .collect()
                .await;
        let mut released = 0;
        for outcome in outcomes {
            match outcome {
                Ok(let_go) => released += usize::from(let_go),
                Err(error) => failures.note(error),
            }
        }
        if released > 0 || told {
            // The quota's status (`queued`, `used`) has moved: have it rewritten soon.
            self.backend.cache().usage_moved().notify_one();
        }
        released
    }

    /// Whether `namespace` really has no GPUQuota, as the API server says, before pods
    /// are let go uncharged: this replica's quota watch may not have delivered a quota
    /// its pod watch already shows pods gated by (so "no quota covers them any more" is
    /// never concluded from a lagging cache). Quotas found go into the cache.
    async fn no_quota_covers(&self, namespace: &str) -> Result<bool, ChargeError> {
        let api: Api<GPUQuota> = Api::namespaced(self.client.clone(), namespace);
        let quotas = read_quotas(&api, self.backend.writer(), namespace, true).await?;
        if !quotas.is_empty() {
            tracing::info!(%namespace, "the quota queue's plan missed quotas the API server has; planning again");
        }
        Ok(quotas.is_empty())
    }

    /// The pods this replica let go that the watch still shows waiting, and those it is
    /// settling; and forget those told why they wait that wait no more.
    fn recent_keys(&self) -> Vec<String> {
        let cache = self.backend.cache();
        let waits = |key: &str| cache.read(|s| s.pod(key).is_some_and(|p| p.gated));
        self.told.lock().retain(|key, _| waits(key));
        let mut recent = self.recent.lock();
        recent.forget(Instant::now(), |key| waits(key));
        let settling = self.settling.lock();
        recent.keys().chain(settling.iter()).cloned().collect()
    }

    /// Let `pod` go: charge, then ungate; give the charge back if the gate stays.
    /// `Ok(false)`: not let go, as it should not be (no room after all, or the gate had
    /// gone); an error is logged here, with the pod.
    async fn let_go(
        &self,
        namespace: &str,
        pod: Waiting,
        charge: Charge,
        now: i64,
        turn: GateTurn,
    ) -> Result<bool, ReleaseError> {
        match self
            .charge_and_ungate(namespace, &pod, &charge, now, turn)
            .await
        {
            Ok(true) => {
                self.recent.lock().note(pod.key.clone(), Instant::now());
                let model = pod.wanted.models.first().cloned().unwrap_or_default();
                let labels = NamespaceModelLabels {
                    namespace: namespace.to_string(),
                    model,
                };
                let waited = now.saturating_sub(pod.created).max(0) as f64;
                self.waits.get_or_create(&labels).observe(waited);
                tracing::info!(pod = %pod.key, waited, "let out of the quota queue");
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(error) => {
                tracing::warn!(pod = %pod.key, %error, "cannot let the pod out of the quota queue");
                Err(error)
            }
        }
    }

    /// `Ok(false)`: the ledger had no room after all, or the gate was no longer there.
    async fn charge_and_ungate(
        &self,
        namespace: &str,
        pod: &Waiting,
        charge: &Charge,
        now: CreatedSecond,
        mut turn: GateTurn,
    ) -> Result<bool, ReleaseError> {
        let charged: Option<&ModelAmounts> = match charge {
            Charge::Model { charge, .. } => Some(charge),
            Charge::AtPlacement { .. } | Charge::Unlimited => None,
        };
        let attempt = Attempt::new(&pod.uid, now);
        if let Some(charge) = charged {
            let ask = Ask {
                costs: pod.costs.clone(),
                wanted: pod.wanted.clone(),
                rules: self.rules.admit,
                created: now,
                charge_id: Some(attempt.id.clone()),
                dry_run: false,
            };
            match self.backend.charge(namespace, ask, |_, _| {}).await {
                Ok(ChargeOutcome::Charged { .. }) => {}
                Ok(ChargeOutcome::Denied(_)) => return Ok(false),
                Err(error) => {
                    if error.may_be_stored() {
                        self.take_back(namespace, &pod.key, charge, &attempt, false);
                    }
                    return Err(error.into());
                }
            }
        }
        turn.wait().await;
        let ungated = self.ungate(&pod.key, &attempt.stamp).await;
        drop(turn); // the pod behind goes, whatever settling this one needs
        let Some(charge) = charged else {
            return ungated;
        };
        match ungated {
            Ok(true) => Ok(true),
            Ok(false) => {
                let charged_at = (now, ChargeId::Stored(&attempt.id));
                if let Err(error) = self.backend.give_back(namespace, charge, charged_at).await {
                    // Not left to hold its room until its pending total expires.
                    self.take_back(namespace, &pod.key, charge, &attempt, true);
                    return Err(error.into());
                }
                Ok(false)
            }
            Err(error) => {
                tracing::warn!(pod = %pod.key, %error, "removing the gate failed; settling its charge");
                let _settling = Settling::mark(&self.settling, &pod.key);
                self.settle(namespace, &pod.key, charge, &attempt).await
            }
        }
    }

    /// Take back `attempt`'s charge by its id, retried until the API server answers, in a
    /// task of its own (the line goes on meanwhile; the pod keeps its place and may be
    /// charged again under another id): after a charge write that failed without an
    /// answer (the API server restarting, say: the charge may or may not be `stored`),
    /// or a give-back that failed. The ledger is then as if this attempt never began, in
    /// seconds rather than when its pending total expires (minutes).
    fn take_back(
        &self,
        namespace: &str,
        key: &str,
        charge: &ModelAmounts,
        attempt: &Attempt,
        stored: bool,
    ) {
        let (backend, namespace) = (self.backend.clone(), namespace.to_string());
        let (charge, second, id) = (charge.clone(), attempt.second, attempt.id.clone());
        let span = tracing::info_span!("take_back", pod = %key);
        let task = async move {
            for pause in retry_pauses() {
                let id = match stored {
                    true => ChargeId::Stored(&id),
                    false => ChargeId::Unsure(&id),
                };
                let charged_at = (second, id);
                if backend
                    .give_back(&namespace, &charge, charged_at)
                    .await
                    .is_ok()
                {
                    return;
                }
                tokio::time::sleep(pause).await;
            }
            tracing::warn!(
                "could not take back a charge whose write failed; it holds its room until its pending total expires"
            );
        };
        tokio::spawn(task.instrument(span));
    }

    /// After a failed ungate (the API server restarting, say) the patch may or may not
    /// have been applied: read the pod until the API server answers, then keep the charge
    /// if this attempt let the pod go (its release annotation is this attempt's stamp), or
    /// give it back if the pod still waits, is gone, or was let go by another attempt
    /// (another replica's, on that one's charge). Neither is left to the charge's expiry,
    /// which would hold the room for minutes, nor given back blindly, which could free
    /// room a running pod uses.
    async fn settle(
        &self,
        namespace: &str,
        key: &str,
        charge: &ModelAmounts,
        attempt: &Attempt,
    ) -> Result<bool, ReleaseError> {
        let (_, name) = key_parts(key);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        for pause in retry_pauses() {
            tokio::time::sleep(pause).await;
            match bounded(pods.get_opt(name)).await {
                Ok(Some(fresh)) if attempt.let_go(&fresh) => return Ok(true),
                Ok(_) => {}
                Err(_) => continue,
            }
            let charged_at = (attempt.second, ChargeId::Stored(&attempt.id));
            match self.backend.give_back(namespace, charge, charged_at).await {
                Ok(()) => return Ok(false),
                Err(_) => continue,
            }
        }
        Err(ReleaseError::Unsettled)
    }

    /// Remove the gate and write the release annotation in one JSON Patch that tests the
    /// gate is where the fresh copy has it: `Ok(false)` when it is not there any more.
    async fn ungate(&self, key: &str, stamp: &str) -> Result<bool, ReleaseError> {
        let (namespace, name) = key_parts(key);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let read = bounded(pods.get_opt(name)).await;
        let Some(fresh) = read.map_err(ReleaseError::Read)? else {
            return Ok(false);
        };
        let Some(patch) = ungate_patch(&fresh, stamp) else {
            return Ok(false);
        };
        let params = PatchParams::default();
        match bounded(pods.patch(name, &params, &Patch::Json::<()>(patch))).await {
            Ok(_) => Ok(true),
            // A failed test (the pod changed under us) or a pod that went away.
            Err(kube::Error::Api(status)) if [404, 409, 422].contains(&status.code) => Ok(false),
            Err(error) => Err(ReleaseError::Ungate(error)),
        }
    }

    /// Tell a waiting pod's owner why it waits: an Event on the pod when it starts
    /// waiting (its place then, the model and the usage), published off the pass; the
    /// queue as it is now is `status.queued` and the metrics. True when told now.
    fn tell(&self, pod: Waiting, place: usize, why: WaitReason) -> bool {
        let behind = match &why {
            WaitReason::NoRoom(_) => None,
            WaitReason::Behind { ahead } => Some(ahead.clone()),
        };
        if !self.leader.holds() || self.told.lock().get(&pod.key) == Some(&behind) {
            return false;
        }
        self.told.lock().insert(pod.key.clone(), behind);
        let note = match why {
            WaitReason::NoRoom(denial) => format!("place {place} in the GPU quota queue: {denial}"),
            WaitReason::Behind { ahead } => format!(
                "place {place} in the GPU quota queue, behind {}, which has waited past queue.maxPassOverSeconds and goes first",
                crate::cache::pod::shown_to(crate::cache::pod::key_parts(&pod.key).0, &ahead)
            ),
        };
        let note = note.as_str();
        let reason = "QuotaQueued";
        self.events
            .publish(&pod.key, &pod.uid, EventType::Normal, reason, "Queue", note);
        true
    }
}

/// One try at letting a pod go: the second its charge is made in (its pending total), the
/// charge's id, and the stamp its release annotation gets — that second with a fraction
/// no other attempt has, so whoever reads the pod afterwards can tell which attempt let it
/// go (readers of the annotation take its whole second).
struct Attempt {
    second: CreatedSecond,
    id: String,
    stamp: String,
}

impl Attempt {
    fn new(uid: &str, second: CreatedSecond) -> Self {
        static PROCESS: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
        static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let process = *PROCESS.get_or_init(|| {
            let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            since.map_or(0, |d| d.as_nanos()) ^ u128::from(std::process::id())
        });
        let count = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let fraction = (process.wrapping_add(u128::from(count)) % 1_000_000_000) as i64;
        Attempt {
            second,
            id: crate::quota::pending::release_id(uid, process, count),
            stamp: release_stamp(second, fraction),
        }
    }

    /// Whether this attempt let `pod` go: its gate is gone and its release annotation
    /// is this attempt's stamp.
    fn let_go(&self, pod: &Pod) -> bool {
        let annotations = pod.metadata.annotations.as_ref();
        let stamp = annotations.and_then(|a| a.get(RELEASED_ANNOTATION));
        !is_gated(pod) && stamp == Some(&self.stamp)
    }
}

/// `second` (unix seconds) with `nanos` as its fraction, in RFC 3339.
fn release_stamp(second: CreatedSecond, nanos: i64) -> String {
    let at = time::OffsetDateTime::from_unix_timestamp(second)
        .map(|t| t + time::Duration::nanoseconds(nanos));
    let text = at.ok().and_then(|t| {
        t.format(&time::format_description::well_known::Rfc3339)
            .ok()
    });
    text.unwrap_or_else(|| format_second(second))
}

/// The JSON Patch that lets `pod` go, if it carries the gate: the uid and the gate at
/// its index are tested, the gate removed, the release second written.
fn ungate_patch(pod: &Pod, second: &str) -> Option<json_patch::Patch> {
    let gates = pod.spec.as_ref()?.scheduling_gates.as_deref()?;
    let index = gates.iter().position(|g| g.name == QUOTA_GATE)?;
    let gate = format!("/spec/schedulingGates/{index}");
    let annotation = format!(
        "/metadata/annotations/{}",
        RELEASED_ANNOTATION.replace('/', "~1")
    );
    let mut ops = vec![
        serde_json::json!({"op": "test", "path": "/metadata/uid", "value": pod.metadata.uid}),
        serde_json::json!({"op": "test", "path": gate, "value": {"name": QUOTA_GATE}}),
        serde_json::json!({"op": "remove", "path": gate}),
    ];
    if pod.metadata.annotations.is_none() {
        ops.push(serde_json::json!({"op": "add", "path": "/metadata/annotations", "value": {}}));
    }
    ops.push(serde_json::json!({"op": "add", "path": annotation, "value": second}));
    serde_json::from_value(serde_json::Value::Array(ops)).ok()
}

impl Controller for Releaser {
    const NAME: &'static str = "queue_release";
    const EVERY: Duration = TICK;

    async fn pass(&mut self) -> Result<usize, PassError> {
        self.pass_all().await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Two replicas let one pod go in the same second, one of them without hearing back:
    /// the pod's release annotation tells which attempt let it go, so the other gives its
    /// charge back instead of keeping a second one; readers still take the whole second.
    #[test]
    fn the_release_annotation_tells_which_attempt_let_a_pod_go() {
        let second = 1_790_000_000;
        let (mine, theirs) = (Attempt::new("uid-p", second), Attempt::new("uid-p", second));
        assert_ne!(mine.stamp, theirs.stamp);
        assert_ne!(mine.id, theirs.id);
        for attempt in [&mine, &theirs] {
            let parsed = crate::quota::pending::parse_second(&attempt.stamp).unwrap();
            assert_eq!(parsed, second, "{}", attempt.stamp);
        }
        let pod = |gated: bool, stamp: &str| -> Pod {
            let gates = match gated {
                true => serde_json::json!([{"name": QUOTA_GATE}]),
                false => serde_json::json!([]),
            };
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "annotations": {RELEASED_ANNOTATION: stamp}},
                "spec": {"schedulingGates": gates, "containers": []}
            }))
            .unwrap()
        };
        assert!(theirs.let_go(&pod(false, &theirs.stamp)));
        assert!(
            !mine.let_go(&pod(false, &theirs.stamp)),
            "let go on the other's charge"
        );
        assert!(!mine.let_go(&pod(true, &mine.stamp)), "still waiting");
    }

    #[test]
    fn retries_double_their_pause_up_to_four_seconds_for_about_a_minute() {
        let pauses: Vec<Duration> = retry_pauses().collect();
        assert_eq!(pauses.len(), SETTLE_ATTEMPTS);
        assert_eq!(
            pauses[..5],
            [250, 500, 1000, 2000, 4000].map(Duration::from_millis)
        );
        assert_eq!(pauses.last(), Some(&Duration::from_secs(4)));
        let total: Duration = pauses.iter().sum();
        assert!((50..=70).contains(&total.as_secs()), "{total:?}");
    }

    #[tokio::test]
    async fn a_pod_stops_settling_when_its_settle_ends_or_is_cancelled() {
        let set = Mutex::new(foldhash::HashSet::default());
        {
            let _settling = Settling::mark(&set, "team/a");
            assert!(set.lock().contains("team/a"), "no pass plans it meanwhile");
        }
        assert!(set.lock().is_empty());
        let settle = async {
            let _settling = Settling::mark(&set, "team/b");
            std::future::pending::<()>().await
        };
        let cut = tokio::time::timeout(Duration::from_millis(10), settle).await;
        assert!(cut.is_err());
        assert!(set.lock().is_empty(), "a cancelled settle leaves no mark");
    }

    #[tokio::test]
    async fn gates_come_off_in_line_order_whichever_charge_is_written_first() {
        let through = Mutex::new(Vec::new());
        let pods = GateTurn::line(4).into_iter().enumerate();
        // The later a pod is in line, the sooner its charge is written.
        let released = pods.map(|(place, mut turn)| {
            let through = &through;
            async move {
                tokio::time::sleep(Duration::from_millis(40 - 10 * place as u64)).await;
                turn.wait().await;
                through.lock().push(place);
            }
        });
        futures::stream::iter(released)
            .buffer_unordered(IN_FLIGHT)
            .collect::<Vec<_>>()
            .await;
        assert_eq!(*through.lock(), [0, 1, 2, 3]);
        // A pod that never reaches its gate (its charge denied) lets the next one go.
        let mut line = GateTurn::line(2);
        let mut second = line.pop().unwrap();
        drop(line);
        tokio::time::timeout(Duration::from_secs(5), second.wait())
            .await
            .expect("the pod behind goes");
    }

    #[test]
    fn the_patch_tests_the_gate_where_the_fresh_copy_has_it() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u1"},
            "spec": {"containers": [], "schedulingGates": [
                {"name": "example.com/mine"}, {"name": "gpu-admission.io/quota"}]}
        }))
        .unwrap();
        let patch = ungate_patch(&pod, "2026-11-25T10:00:00Z").unwrap();
        assert_eq!(
            serde_json::to_value(&patch).unwrap(),
            serde_json::json!([
                {"op": "test", "path": "/metadata/uid", "value": "u1"},
                {"op": "test", "path": "/spec/schedulingGates/1", "value": {"name": "gpu-admission.io/quota"}},
                {"op": "remove", "path": "/spec/schedulingGates/1"},
                {"op": "add", "path": "/metadata/annotations", "value": {}},
                {"op": "add", "path": "/metadata/annotations/gpu-admission.io~1quota-released",
                    "value": "2026-11-25T10:00:00Z"}
            ])
        );
        let mut applied = serde_json::to_value(&pod).unwrap();
        json_patch::patch(&mut applied, &patch).unwrap();
        assert_eq!(
            applied["spec"]["schedulingGates"],
            serde_json::json!([{"name": "example.com/mine"}])
        );
        // Applied twice (another replica went first), the test fails: nothing changes.
        let before = applied.clone();
        assert!(json_patch::patch(&mut applied, &patch).is_err());
        assert_eq!(applied, before);
        let ungated: Pod = serde_json::from_value(before).unwrap();
        assert!(ungate_patch(&ungated, "x").is_none(), "no gate, no patch");
    }
}
