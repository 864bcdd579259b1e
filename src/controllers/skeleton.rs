//! The one skeleton the background controllers run in (docs/design.md, "Controllers"):
//! a pass at a time, on a tick and whenever woken, once the cache has listed, only on the
//! replica that holds the controller Lease when the controller acts for all replicas,
//! each pass in a span, until shutdown. What a pass decides is the controller's (pure
//! where it can be: `quota::queue::plan`, `quota::pool::reclaim_plan`,
//! `quota::status::reconciled_status`); when it runs is here.

use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, Instant};

use foldhash::HashMap;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::cache::ClusterCache;

use super::leadership::Leader;

/// A background controller: what one pass does.
pub(crate) trait Controller: Send {
    /// The name its passes' spans carry.
    const NAME: &'static str;
    /// A pass runs at least this often.
    const EVERY: Duration;

    /// One pass over what it keeps; returns how many objects it acted on.
    fn pass(&mut self) -> impl Future<Output = usize> + Send;

    /// The Lease it needs to act (`None`: every replica acts).
    fn lease(&self) -> Option<&Leader> {
        None
    }

    /// A pass skipped because another replica holds the Lease: forget what was this
    /// replica's to finish.
    fn stand_by(&mut self) {}
}

/// What every controller runs with: the cache it waits on and reads, and the shutdown
/// it stops at.
#[derive(Clone)]
pub(crate) struct Harness {
    pub(crate) cache: ClusterCache,
    pub(crate) shutdown: CancellationToken,
}

/// Run `controller` pass after pass until shutdown: every [`Controller::EVERY`], and
/// whenever `wake` is notified (something it keeps changed).
pub(crate) async fn run<C: Controller>(
    mut controller: C,
    wake: Option<Arc<Notify>>,
    harness: Harness,
) {
    let Harness { cache, shutdown } = harness;
    let mut ticker = tokio::time::interval(C::EVERY);
    // A controller nobody wakes waits on a Notify nobody notifies.
    let wake = wake.unwrap_or_default();
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = wake.notified() => {}
            _ = shutdown.cancelled() => return,
        }
        if !cache.is_ready() {
            continue;
        }
        if controller.lease().is_some_and(|lease| !lease.holds()) {
            controller.stand_by();
            continue;
        }
        let span = tracing::debug_span!("pass", controller = C::NAME);
        controller.pass().instrument(span).await;
    }
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
mod tests {
    use super::*;

    #[test]
    fn a_recent_key_is_kept_for_its_time_unless_it_no_longer_holds() {
        let mut recent = Recent::new(Duration::from_secs(10));
        let start = Instant::now();
        recent.note("a", start);
        recent.note("b", start + Duration::from_secs(5));
        recent.forget(start + Duration::from_secs(9), |_| true);
        assert!(recent.contains(&"a") && recent.contains(&"b"));
        recent.forget(start + Duration::from_secs(10), |_| true);
        assert!(!recent.contains(&"a"), "kept its 10 s, then forgotten");
        assert!(recent.contains(&"b"));
        recent.forget(start + Duration::from_secs(11), |key| *key != "b");
        assert_eq!(
            recent.keys().count(),
            0,
            "forgotten once it no longer holds"
        );
    }
}
