//! The one skeleton the background controllers run in (docs/design.md, "Controllers"):
//! a pass at a time, on a tick and whenever woken, once the cache has listed, only on the
//! replica that holds the controller Lease when the controller acts for all replicas,
//! each pass in a span, until shutdown. A pass that fails is tried again sooner, with a
//! backoff; every pass is counted (`gpu_admission_controller_*`); an API call a pass
//! makes is bounded ([`bounded`]). What a pass decides is the controller's (pure where
//! it can be: `quota::queue::plan`, `quota::pool::reclaim_plan`,
//! `quota::status::reconciled_status`); when it runs is here.

use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, Instant};

use foldhash::HashMap;
use tokio::sync::Notify;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::cache::ClusterCache;
use crate::metrics::ControllerMetrics;

use super::leadership::Leader;

/// A background controller: what one pass does.
pub(crate) trait Controller: Send {
    /// The name its passes' spans and metrics carry.
    const NAME: &'static str;
    /// A pass runs at least this often.
    const EVERY: Duration;

    /// One pass over what it keeps: how many objects it acted on, or, when something
    /// it meant to do failed (it goes on past each failure), what failed.
    fn pass(&mut self) -> impl Future<Output = Result<usize, PassError>> + Send;

    /// The Lease it needs to act (`None`: every replica acts).
    fn lease(&self) -> Option<&Leader> {
        None
    }

    /// A pass skipped because another replica holds the Lease: forget what was this
    /// replica's to finish.
    fn stand_by(&mut self) {}
}

/// A pass that did not do all it set out to. It went on past each failure (one
/// object's trouble holds up no other) and logged each where it happened, naming the
/// object; this is how many there were, and the first.
#[derive(Debug, thiserror::Error)]
#[error("{count} failure(s) in the pass; the first: {first}")]
pub(crate) struct PassError {
    count: usize,
    first: Box<dyn std::error::Error + Send + Sync>,
}

/// The failures of a pass, noted as it goes.
#[derive(Debug, Default)]
pub(crate) struct Failures(Option<PassError>);

impl Failures {
    pub(crate) fn note(&mut self, error: impl Into<Box<dyn std::error::Error + Send + Sync>>) {
        match &mut self.0 {
            Some(failed) => failed.count += 1,
            None => {
                let first = error.into();
                self.0 = Some(PassError { count: 1, first });
            }
        }
    }

    /// The pass's outcome: `acted` when nothing failed.
    pub(crate) fn outcome(self, acted: usize) -> Result<usize, PassError> {
        self.0.map_or(Ok(acted), Err)
    }
}

/// How long one API call of a pass may take before it counts as failed and the pass
/// goes on: the client's own deadline (`api_client`, 70 s) lets the API server's 60 s
/// request timeout play out, which an admission request needs, but a controller's call
/// reads or writes one object and is answered in milliseconds when the API server is
/// well. One that takes 30 s is better tried again on the next pass (with backoff)
/// than waited for, while every object after it in the pass waits too. Lists are not
/// bounded by it (a big cluster's may take longer; the client's deadline bounds each
/// piece of the answer), nor charges (the quota writer's, bounded per request).
pub(crate) const API_CALL_LIMIT: Duration = Duration::from_secs(30);

/// A call cut by [`bounded`].
#[derive(Debug, thiserror::Error)]
#[error("the API server did not answer within {0:?}")]
struct CallTimedOut(Duration);

/// `call`, failed with a [`kube::Error::Service`] (as the client's own deadline fails
/// one) if it has not ended within [`API_CALL_LIMIT`]. A cut write may still be applied,
/// as with any call whose answer is lost: controllers' writes are made safe to repeat.
pub(crate) async fn bounded<T>(
    call: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    match tokio::time::timeout(API_CALL_LIMIT, call).await {
        Ok(answer) => answer,
        Err(_) => Err(kube::Error::Service(Box::new(CallTimedOut(API_CALL_LIMIT)))),
    }
}

/// The first pause after a failed pass; each further failure doubles it, up to the
/// controller's [`Controller::EVERY`].
const FIRST_RETRY: Duration = Duration::from_secs(1);

/// When the next pass comes after failed ones: `None` on schedule (a tick, a wake);
/// else after a pause that doubles with each failure, up to `every`.
#[derive(Debug)]
struct Backoff {
    every: Duration,
    pause: Option<Duration>,
}

impl Backoff {
    fn new(every: Duration) -> Self {
        Backoff { every, pause: None }
    }

    /// A pass failed: the pause before the next.
    fn failed(&mut self) -> Duration {
        let pause = self.pause.map_or(FIRST_RETRY, |p| p * 2).min(self.every);
        *self.pause.insert(pause)
    }

    fn reset(&mut self) {
        self.pause = None;
    }
}

/// What every controller runs with: the cache it waits on and reads, the metrics its
/// passes are counted in, and the shutdown it stops at.
#[derive(Clone)]
pub(crate) struct Harness {
    pub(crate) cache: ClusterCache,
    pub(crate) metrics: ControllerMetrics,
    pub(crate) shutdown: CancellationToken,
}

/// Run `controller` pass after pass until shutdown: at least every
/// [`Controller::EVERY`] after the last pass, whenever `wake` is notified (something
/// it keeps changed), and after a failed pass sooner, with a backoff during which a
/// wake waits.
pub(crate) async fn run<C: Controller>(
    mut controller: C,
    wake: Option<Arc<Notify>>,
    harness: Harness,
) {
    let Harness {
        cache,
        metrics,
        shutdown,
    } = harness;
    metrics.start(C::NAME);
    let mut ticker = tokio::time::interval(C::EVERY);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // A controller nobody wakes waits on a Notify nobody notifies.
    let wake = wake.unwrap_or_default();
    let mut backoff = Backoff::new(C::EVERY);
    loop {
        match backoff.pause {
            // Shutdown first: no pass starts once it has begun.
            None => tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
                _ = wake.notified() => {}
            },
            Some(pause) => tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            },
        }
        if !cache.is_ready() {
            continue;
        }
        if controller.lease().is_some_and(|lease| !lease.holds()) {
            controller.stand_by();
            backoff.reset(); // what failed was this replica's to finish
            continue;
        }
        let span = tracing::debug_span!("pass", controller = C::NAME);
        let started = tokio::time::Instant::now();
        let outcome = controller.pass().instrument(span.clone()).await;
        let seconds = started.elapsed().as_secs_f64();
        metrics.pass(C::NAME, outcome.is_ok(), seconds, unix_now());
        ticker.reset(); // the next tick is EVERY after this pass
        match outcome {
            Ok(acted) => {
                backoff.reset();
                tracing::debug!(parent: &span, acted, seconds, "pass done");
            }
            Err(error) => {
                let retry_in = backoff.failed();
                tracing::warn!(controller = C::NAME, %error, ?retry_in, "controller pass failed");
            }
        }
    }
}

fn unix_now() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |d| d.as_secs() as i64)
}

/// Keys a controller acted on lately, each kept for `keep` after it was noted: the
/// pods a releaser let go that the watch may not show yet, the pods a budget protected.
#[derive(Debug)]
pub(crate) struct Recent<K> {
    keep: Duration,
    noted: HashMap<K, Instant>,
}

impl<K: Hash + Eq + Clone> Recent<K> {
    pub(crate) fn new(keep: Duration) -> Self {
        Recent {
            keep,
            noted: HashMap::default(),
        }
    }

    pub(crate) fn note(&mut self, key: K, now: Instant) {
        self.noted.insert(key, now);
    }

    pub(crate) fn contains(&self, key: &K) -> bool {
        self.noted.contains_key(key)
    }

    /// Forget the keys noted `keep` or longer before `now`, and those `still` refuses.
    pub(crate) fn forget(&mut self, now: Instant, still: impl Fn(&K) -> bool) {
        let keep = self.keep;
        (self.noted).retain(|key, at| now.duration_since(*at) < keep && still(key));
    }

    pub(crate) fn keys(&self) -> impl Iterator<Item = &K> {
        self.noted.keys()
    }
}

#[cfg(test)]
#[path = "skeleton_tests.rs"]
mod tests;
