//! One connection's requests as `server::slots` sees them: whether it has made one,
//! which are in flight and how their bodies arrive, and whether it must give up its slot.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::super::pace::{Pace, Progress};
use super::{Holder, Line, QUIET, Signals, State, YOUNG};

/// One connection's requests: whether it has made one, which are in flight, when the
/// last one ended and was last served whole; and whether it must give up its slot.
pub(crate) struct Activity {
    pub(super) peer: IpAddr,
    pub(super) started: Instant,
    requested: AtomicBool,
    handshaking: AtomicBool,
    /// Milliseconds after `started` when its TLS handshake ended (0 before). A slow
    /// handshake that just ended is young again: on a starved machine the server ends
    /// it late, with its client's first request already in the socket.
    handshake_ended: AtomicU64,
    pub(super) in_flight: AtomicUsize,
    /// The requests in flight and how their bodies arrive.
    requests: Mutex<Vec<Arc<Progress>>>,
    /// Milliseconds after `started` when a request last ended.
    last_done: AtomicU64,
    /// One more than the milliseconds after `started` when a request last completed
    /// with its body whole (0: never).
    last_served: AtomicU64,
    /// Requests completed with their bodies whole that the slot table has not counted
    /// yet (it takes them when it looks).
    served: AtomicU64,
    /// Cancelled when a newcomer took this connection's slot: close it.
    pub(super) evicted: CancellationToken,
    /// Cancelled when a request body arrived too slowly: close it.
    too_slow: CancellationToken,
    signals: Arc<Signals>,
}

impl Activity {
    pub(super) fn new(peer: IpAddr, signals: Arc<Signals>) -> Self {
        Activity {
            peer,
            started: Instant::now(),
            requested: AtomicBool::new(false),
            handshaking: AtomicBool::new(false),
            handshake_ended: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            requests: Mutex::new(Vec::new()),
            last_done: AtomicU64::new(0),
            last_served: AtomicU64::new(0),
            served: AtomicU64::new(0),
            evicted: CancellationToken::new(),
            too_slow: CancellationToken::new(),
            signals,
        }
    }

    pub(crate) fn peer(&self) -> IpAddr {
        self.peer
    }

    pub(super) fn holder(&self, age: u64, pace: Pace, now: Instant) -> Holder {
        let served = self.last_served.load(Ordering::Acquire);
        let since =
            |ms: u64| now.saturating_duration_since(self.started + Duration::from_millis(ms));
        // Young: just connected or done with its handshake (no request yet), or its last
        // request just ended (idle).
        let young = if self.has_requested() {
            since(self.last_done.load(Ordering::Acquire)) < YOUNG
        } else {
            since(self.handshake_ended.load(Ordering::Acquire)) < YOUNG
        };
        Holder {
            age,
            peer: self.peer,
            state: self.state(pace, now, young),
            served_lately: served > 0 && since(served - 1) < QUIET,
            line: Line::NEVER_SEEN,
        }
    }

    pub(super) fn state(&self, pace: Pace, now: Instant, young: bool) -> State {
        if self.too_slow.is_cancelled() {
            State::Closing
        } else if self.in_flight.load(Ordering::Acquire) > 0 {
            let requests = self.requests.lock();
            let starving = !requests.is_empty() && requests.iter().all(|p| p.starving(pace, now));
            State::Busy { starving }
        } else if self.requested.load(Ordering::Acquire) {
            State::Idle { young }
        } else if self.handshaking.load(Ordering::Acquire) {
            State::Handshake { young }
        } else {
            State::Opening { young }
        }
    }

    /// Whether the connection is in its TLS handshake (set around the handshake).
    pub(crate) fn set_handshaking(&self, handshaking: bool) {
        if !handshaking {
            self.handshake_ended.store(self.millis(), Ordering::Release);
        }
        self.handshaking.store(handshaking, Ordering::Release);
    }

    /// Milliseconds since the connection was accepted.
    fn millis(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether a request has begun on this connection.
    pub(crate) fn has_requested(&self) -> bool {
        self.requested.load(Ordering::Acquire)
    }

    /// Whether a request on this connection was answered with its body whole.
    pub(super) fn has_served(&self) -> bool {
        self.last_served.load(Ordering::Acquire) > 0
    }

    /// Requests answered whole since the last call.
    pub(super) fn take_served(&self) -> u64 {
        self.served.swap(0, Ordering::AcqRel)
    }

    /// Resolves when a newcomer has taken this connection's slot.
    pub(crate) async fn evicted(&self) {
        self.evicted.cancelled().await
    }

    /// Resolves when a request body arrived too slowly: the connection gives up its slot.
    pub(crate) async fn too_slow(&self) {
        self.too_slow.cancelled().await
    }

    /// Marks the connection as cut for a body too slow (`server::pace`).
    pub(crate) fn cut_for_slowness(&self) {
        self.too_slow.cancel();
        self.signals.changed.notify_one();
    }

    /// A request begins; `progress` follows its body.
    pub(crate) fn begin(self: &Arc<Self>, progress: Arc<Progress>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.signals.in_flight.fetch_add(1, Ordering::AcqRel);
        self.requested.store(true, Ordering::Release);
        self.requests.lock().push(progress.clone());
        InFlight {
            activity: self.clone(),
            progress,
        }
    }

    /// Resolves once no request has been in flight for `idle`.
    pub(crate) async fn idle_for(&self, idle: Duration) {
        loop {
            let last = Duration::from_millis(self.last_done.load(Ordering::Acquire));
            let wake = if self.in_flight.load(Ordering::Acquire) == 0 {
                let deadline = self.started + last + idle;
                if Instant::now() >= deadline {
                    return;
                }
                deadline
            } else {
                Instant::now() + idle
            };
            tokio::time::sleep_until(wake.into()).await;
        }
    }
}

/// One request in flight; its end is recorded when dropped (also on cancellation).
pub(crate) struct InFlight {
    activity: Arc<Activity>,
    progress: Arc<Progress>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let activity = &self.activity;
        let now = activity.millis();
        activity.last_done.store(now, Ordering::Release);
        if self.progress.is_done() {
            activity.last_served.store(now + 1, Ordering::Release);
            activity.served.fetch_add(1, Ordering::AcqRel);
        }
        activity
            .requests
            .lock()
            .retain(|p| !Arc::ptr_eq(p, &self.progress));
        activity.in_flight.fetch_sub(1, Ordering::AcqRel);
        activity.signals.in_flight.fetch_sub(1, Ordering::AcqRel);
        // A newcomer waiting at the cap may now take this connection's slot.
        activity.signals.changed.notify_one();
    }
}
