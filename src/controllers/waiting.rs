//! API mode: every pending GPU pod says why it waits (docs/explain.md, "On the pod").
//! The teller judges pending pods with `explain`'s rules on the cache and keeps the
//! verdict on the pod: a `gpu-admission.io/Waiting` condition (reason: the code;
//! message: its numbers), and an Event when the code changes. A pod that no longer waits
//! (bound, placed, or it would fit now) has the condition set to False.
//!
//! Its cost is bounded by construction: a pass judges for at most [`JUDGE_BUDGET`] (a
//! pod per short read of the cache, the pods never judged first), writes at most
//! [`WRITES_PER_PASS`] conditions (half for pods that wait, half for pods bound since,
//! when both have more: [`shared`]), a pod at most every [`MIN_GAP`], and rewords an
//! unchanged code at most every [`REWORD_EVERY`]. Only the replica holding the
//! controller Lease tells, so a pod gets one Event per change, not one per replica.

use std::sync::Arc;
use std::time::{Duration, Instant};

use foldhash::HashMap;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use serde_json::json;

use super::leadership::Leader;
use super::pod_events::PodEvents;
use super::skeleton::{Controller, Failures, PassError, bounded};
use crate::cache::pod::{WAITING_CONDITION, WaitingShown, key_parts, message_fingerprint};
use crate::cache::{ClusterCache, PodKey};
use crate::config::Config;
use crate::placement::Placer;
use crate::placement::learn::LearningPlacer;
use crate::placement::mig::MigResources;

use crate::explain::{Code, Explanation, Judge, Judged};

/// How much time one pass may spend judging pods.
const JUDGE_BUDGET: Duration = Duration::from_millis(100);
/// Conditions written in one pass at most.
const WRITES_PER_PASS: usize = 20;
/// Conditions written at once.
const IN_FLIGHT: usize = 8;
/// A pod's condition is written at most this often.
const MIN_GAP: Duration = Duration::from_secs(5);
/// A code unchanged whose numbers moved (its place in line, the free GPUs) is reworded
/// at most this often.
const REWORD_EVERY: Duration = Duration::from_secs(30);
/// A gated pod whose quota has room is let go by the releaser within moments: it is told
/// `QueuedBehind` only once it has waited this long, not in passing.
const QUEUE_GRACE_SECONDS: i64 = 5;
/// The longest message written (the API server allows 32 KiB; `kubectl describe` shows
/// one line).
const MESSAGE_LIMIT: usize = 1_000;

/// What a pod should show: why it waits, or that it does not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WaitingVerdict {
    pub(crate) waits: bool,
    pub(crate) code: Code,
    pub(crate) message: String,
}

impl WaitingVerdict {
    /// The verdict `explanation` gives: the code of the stage that stops the pod, its
    /// numbers, and the first thing that would change it.
    pub(crate) fn of(explanation: &Explanation) -> Self {
        let stops = explanation
            .stages
            .iter()
            .find(|s| s.code == explanation.code);
        let mut message = stops.map(|s| s.message.clone()).unwrap_or_default();
        if let Some(what_if) = explanation.counterfactuals.first() {
            message += "; would change it: ";
            message += &what_if.message;
        }
        WaitingVerdict {
            waits: !explanation.code.passes(),
            code: explanation.code,
            message: truncate(message),
        }
    }

    /// A bound pod no longer waits.
    fn bound(node: &str) -> Self {
        WaitingVerdict {
            waits: false,
            code: Code::Placed,
            message: format!("bound to node {node}"),
        }
    }
}

fn truncate(mut message: String) -> String {
    if message.len() > MESSAGE_LIMIT {
        let mut end = MESSAGE_LIMIT;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    message
}

/// What to write on a pod, if anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Write {
    pub(crate) verdict: WaitingVerdict,
    /// The status flips (or the condition is new): its transition time is now.
    pub(crate) transition: bool,
    /// The code changed on a waiting pod: tell it in an Event too.
    pub(crate) event: bool,
}

/// What the pod shows against what it should, given when it was last written (by this
/// replica): the write that brings it up to date, when one is due.
pub(crate) fn decide(
    shown: Option<&WaitingShown>,
    verdict: &WaitingVerdict,
    last_write: Option<Duration>,
) -> Option<Write> {
    let since = |gap: Duration| last_write.is_none_or(|ago| ago >= gap);
    let write = |transition, event| Write {
        verdict: verdict.clone(),
        transition,
        event,
    };
    match shown {
        // A pod that never waited needs no condition saying it does not.
        None if !verdict.waits => None,
        None => Some(write(true, true)),
        Some(shown) if shown.waits != verdict.waits => {
            since(MIN_GAP).then(|| write(true, verdict.waits))
        }
        Some(_) if !verdict.waits => None,
        Some(shown) if *shown.reason != *verdict.code.name() => {
            since(MIN_GAP).then(|| write(false, true))
        }
        Some(shown) if shown.message != message_fingerprint(&verdict.message) => {
            since(REWORD_EVERY).then(|| write(false, false))
        }
        Some(_) => None,
    }
}

/// The strategic merge patch of the pod's status that writes `write` (merged into the
/// conditions by type), for the pod with `uid` only (a pod created again under the same
/// name is another pod: the API server refuses the write).
pub(crate) fn condition_patch(uid: &str, write: &Write, now: &Time) -> serde_json::Value {
    let verdict = &write.verdict;
    let mut condition = json!({
        "type": WAITING_CONDITION,
        "status": if verdict.waits { "True" } else { "False" },
        "reason": verdict.code.name(),
        "message": verdict.message,
    });
    if write.transition {
        condition["lastTransitionTime"] = json!(now);
    }
    json!({
        "metadata": {"uid": uid},
        "status": {"conditions": [condition]},
    })
}

/// A bound pod that still shows it waits.
struct Bound {
    key: PodKey,
    uid: Box<str>,
    shown: WaitingShown,
    verdict: WaitingVerdict,
}

/// The teller: one per process, acting only while it holds the controller Lease.
pub(crate) struct Teller {
    cache: ClusterCache,
    client: kube::Client,
    placer: Arc<LearningPlacer>,
    config: Arc<Config>,
    events: PodEvents,
    leader: Leader,
    /// When each pending pod was last judged (the least recently judged go first).
    judged: HashMap<PodKey, Instant>,
    /// What this replica last wrote on each pod, and when: the watch may not show it yet.
    written: HashMap<PodKey, (WaitingShown, Instant)>,
}

impl Teller {
    pub(crate) fn new(
        cache: ClusterCache,
        client: kube::Client,
        placer: Arc<LearningPlacer>,
        config: Arc<Config>,
        leader: Leader,
    ) -> Self {
        Teller {
            cache,
            events: PodEvents::new(client.clone()),
            client,
            placer,
            config,
            leader,
            judged: HashMap::default(),
            written: HashMap::default(),
        }
    }

    /// The pods to look at: those bound that may still show they wait (no judging
    /// needed), and the pending ones in the order they are judged (never judged first,
    /// then the least recently).
    fn candidates(&mut self) -> (Vec<Bound>, Vec<PodKey>) {
        let (mut bound, mut pending) = (Vec::new(), Vec::new());
        self.cache.read(|state| {
            for (key, pod) in state.pods() {
                if pod.terminating().is_some() {
                    continue;
                }
                match (&pod.node, pod.bound, pod.waiting()) {
                    (Some(node), true, Some(shown)) if shown.waits => bound.push(Bound {
                        key: key.clone(),
                        uid: pod.uid.clone(),
                        shown: shown.clone(),
                        verdict: WaitingVerdict::bound(node),
                    }),
                    (_, true, _) => {}
                    _ => pending.push(key.clone()),
                }
            }
        });
        let live: foldhash::HashSet<&PodKey> = pending.iter().collect();
        self.judged.retain(|key, _| live.contains(key));
        pending.sort_by_key(|key| self.judged.get(key).copied());
        (bound, pending)
    }

    /// Judge `key` on the cache as it is now: its verdict, what it shows and its uid;
    /// `None` when it cannot be judged, or is only passing through the quota queue.
    fn judge(
        &self,
        key: &PodKey,
        (placer, mig): (&Placer, &MigResources),
        now: i64,
    ) -> Option<(WaitingVerdict, Option<WaitingShown>, Box<str>)> {
        self.cache.read(|state| {
            let pod = state.pod(key)?;
            let subject = Judged {
                key,
                pod,
                exists: true,
            };
            let judge = Judge::new(state, placer, mig, &self.config, now);
            let explanation = match judge.explain(&subject) {
                Ok(explanation) => explanation,
                Err(error) => {
                    tracing::debug!(pod = %key, %error, "cannot judge a pending pod");
                    return None;
                }
            };
            let verdict = WaitingVerdict::of(&explanation);
            let in_passing = now - pod.created < QUEUE_GRACE_SECONDS;
            if verdict.code == Code::QueuedBehind && in_passing {
                return None;
            }
            Some((verdict, pod.waiting().cloned(), pod.uid.clone()))
        })
    }

    /// What the pod shows, or what this replica last wrote on it if that is newer than
    /// what the watch brought.
    fn shown(&self, key: &PodKey, from_cache: Option<WaitingShown>) -> Option<WaitingShown> {
        match self.written.get(key) {
            Some((written, _)) => Some(written.clone()),
            None => from_cache,
        }
    }

    fn last_write(&self, key: &PodKey, now: Instant) -> Option<Duration> {
        (self.written.get(key)).map(|(_, at)| now.duration_since(*at))
    }

    async fn write(&self, key: &PodKey, uid: &str, write: &Write) -> Result<(), kube::Error> {
        let (namespace, name) = key_parts(key);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let patch = condition_patch(uid, write, &now);
        let params = PatchParams::default();
        bounded(api.patch_status(name, &params, &Patch::Strategic(&patch))).await?;
        if write.event {
            let code = write.verdict.code.name();
            let note = &write.verdict.message;
            (self.events).publish(key, uid, EventType::Normal, code, "Waiting", note);
        }
        Ok(())
    }
}

impl Controller for Teller {
    const NAME: &'static str = "waiting";
    const EVERY: Duration = Duration::from_secs(1);

    fn lease(&self) -> Option<&Leader> {
        Some(&self.leader)
    }

    fn stand_by(&mut self) {
        self.written.clear();
    }

    async fn pass(&mut self) -> Result<usize, PassError> {
        let start = Instant::now();
        // What this replica wrote is shown by the watch well within this long, or lost.
        self.written
            .retain(|_, (_, at)| start.duration_since(*at) < REWORD_EVERY);
        let (bound, pending) = self.candidates();
        let unix_now = crate::quota::pending::now_second();
        // One learnt mix for the whole pass: every pod is judged against the same.
        let placer = self.placer.placer();
        let mig = self.cache.projection().names.mig.clone();
        let mut cleared = Vec::new();
        for pod in bound {
            let shown = self.shown(&pod.key, Some(pod.shown));
            let last_write = self.last_write(&pod.key, start);
            if let Some(write) = decide(shown.as_ref(), &pod.verdict, last_write) {
                cleared.push((pod.key, pod.uid, write));
            }
        }
        let mut writes = Vec::new();
        for key in pending {
            if start.elapsed() >= JUDGE_BUDGET || writes.len() >= WRITES_PER_PASS {
                break;
            }
            let judged = self.judge(&key, (&placer, &mig), unix_now);
            self.judged.insert(key.clone(), Instant::now());
            let Some((verdict, from_cache, uid)) = judged else {
                continue;
            };
            let shown = self.shown(&key, from_cache);
            if let Some(write) = decide(shown.as_ref(), &verdict, self.last_write(&key, start)) {
                writes.push((key, uid, write));
            }
        }
        let writes = shared(writes, cleared, WRITES_PER_PASS);
        let this = &*self;
        let done = futures::stream::iter(writes)
            .map(|(key, uid, write)| async move {
                let result = this.write(&key, &uid, &write).await;
                (key, write, result)
            })
            .buffer_unordered(IN_FLIGHT)
            .collect::<Vec<_>>()
            .await;
        let mut told = 0;
        let mut failures = Failures::default();
        for (key, write, result) in done {
            match result {
                Ok(()) => {
                    told += 1;
                    let shown = WaitingShown {
                        waits: write.verdict.waits,
                        reason: write.verdict.code.name().into(),
                        message: message_fingerprint(&write.verdict.message),
                    };
                    self.written.insert(key, (shown, Instant::now()));
                }
                // Gone, or another pod under its name: the watch will say.
                Err(kube::Error::Api(status)) if [404, 409].contains(&status.code) => {}
                Err(error) => {
                    tracing::warn!(pod = %key, %error, "cannot write the Waiting condition");
                    failures.note(error);
                }
            }
        }
        failures.outcome(told)
    }
}

/// At most `limit` of the pending pods' writes and the bound pods' (`cleared`), each
/// kept in its order: each side gets half when both have more, and what one side leaves
/// goes to the other. Hundreds of pods bound at once (a queue let go) never keep a new
/// pod from being told why it waits, nor the other way round.
fn shared<W>(mut pending: Vec<W>, mut cleared: Vec<W>, limit: usize) -> Vec<W> {
    let half = limit / 2;
    let pending_share = pending.len().min(limit - cleared.len().min(half));
    pending.truncate(pending_share);
    cleared.truncate(limit - pending.len());
    pending.extend(cleared);
    pending
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn bound_pods_cleared_at_once_leave_room_to_tell_new_pods_why_they_wait() {
        let pending: Vec<u32> = (0..30).collect();
        let cleared: Vec<u32> = (100..600).collect();
        let writes = shared(pending.clone(), cleared.clone(), 20);
        assert_eq!(writes[..10], pending[..10], "half for the pods that wait");
        assert_eq!(writes[10..], cleared[..10], "half for the bound ones");
        let few = shared(vec![1, 2], cleared.clone(), 20);
        assert_eq!(few.len(), 20, "what one side leaves goes to the other");
        assert_eq!(few[..3], [1, 2, 100]);
        let none_bound = shared(pending.clone(), Vec::new(), 20);
        assert_eq!(none_bound, pending[..20]);
        let only_bound = shared(Vec::<u32>::new(), cleared, 20);
        assert_eq!(only_bound.len(), 20);
    }

    fn verdict(waits: bool, code: Code, message: &str) -> WaitingVerdict {
        WaitingVerdict {
            waits,
            code,
            message: message.into(),
        }
    }

    fn shown(waits: bool, code: Code, message: &str) -> WaitingShown {
        WaitingShown {
            waits,
            reason: code.name().into(),
            message: message_fingerprint(message),
        }
    }

    const LONG_AGO: Option<Duration> = Some(Duration::from_secs(3600));

    #[test]
    fn a_pod_that_starts_waiting_gets_the_condition_and_an_event() {
        let fragmented = verdict(true, Code::Fragmented, "2 GPUs free on 2 nodes");
        let write = decide(None, &fragmented, None).unwrap();
        assert!(write.transition && write.event);
        assert_eq!(write.verdict, fragmented);
    }

    #[test]
    fn a_pod_that_never_waited_gets_nothing() {
        let fits = verdict(false, Code::Fits, "fits now on node a");
        assert_eq!(decide(None, &fits, None), None);
    }

    #[test]
    fn an_unchanged_verdict_is_not_written_again() {
        let queued = verdict(true, Code::QuotaExceeded, "T4: 2 used of 2");
        let on_pod = shown(true, Code::QuotaExceeded, "T4: 2 used of 2");
        assert_eq!(decide(Some(&on_pod), &queued, LONG_AGO), None);
    }

    #[test]
    fn a_new_code_is_written_with_an_event_but_not_twice_within_the_gap() {
        let on_pod = shown(true, Code::QuotaExceeded, "T4: 2 used of 2");
        let fragmented = verdict(true, Code::Fragmented, "2 GPUs free on 2 nodes");
        let write = decide(Some(&on_pod), &fragmented, LONG_AGO).unwrap();
        assert!(
            write.event && !write.transition,
            "still waiting: no transition"
        );
        let just_now = Some(Duration::from_secs(1));
        assert_eq!(decide(Some(&on_pod), &fragmented, just_now), None);
    }

    #[test]
    fn new_numbers_under_the_same_code_are_reworded_rarely_and_quietly() {
        let on_pod = shown(true, Code::QueuedBehind, "3 of 5 in line");
        let moved_up = verdict(true, Code::QueuedBehind, "2 of 5 in line");
        let recently = Some(REWORD_EVERY - Duration::from_secs(1));
        assert_eq!(decide(Some(&on_pod), &moved_up, recently), None);
        let write = decide(Some(&on_pod), &moved_up, LONG_AGO).unwrap();
        assert!(!write.event && !write.transition);
    }

    #[test]
    fn a_pod_that_no_longer_waits_has_the_condition_set_false() {
        let on_pod = shown(true, Code::Fragmented, "2 GPUs free on 2 nodes");
        let bound = WaitingVerdict::bound("node-a");
        let write = decide(Some(&on_pod), &bound, LONG_AGO).unwrap();
        assert!(write.transition && !write.event);
        let patch = condition_patch(
            "u-1",
            &write,
            &Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        );
        let condition = &patch["status"]["conditions"][0];
        assert_eq!(condition["type"], WAITING_CONDITION);
        assert_eq!(condition["status"], "False");
        assert_eq!(condition["reason"], "Placed");
        assert_eq!(condition["message"], "bound to node node-a");
        assert_eq!(condition["lastTransitionTime"], "1970-01-01T00:00:00Z");
        assert_eq!(patch["metadata"]["uid"], "u-1", "for this pod only");
        // Once shown False, nothing more.
        let on_pod = shown(false, Code::Placed, "bound to node node-a");
        assert_eq!(decide(Some(&on_pod), &bound, LONG_AGO), None);
    }

    #[test]
    fn a_message_is_bounded_on_a_character_boundary() {
        let long = "é".repeat(MESSAGE_LIMIT);
        let cut = truncate(long);
        assert!(cut.len() <= MESSAGE_LIMIT && cut.chars().all(|c| c == 'é'));
    }
}
