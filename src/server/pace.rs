//! The rate floor for request bodies (Kestrel's `MinRequestBodyDataRate`, nginx's
//! `client_body_timeout`): a body must arrive at `--min-body-rate` bytes per second on
//! average, counted from the end of its request's head. Behind it for [`YOUNG`] its
//! connection is worthless to the slot table (a newcomer may take its slot, see
//! `server::slots`); still behind once `--body-rate-grace` has passed since the head, the
//! request is answered 408 and its connection gives up its slot and closes (HTTP/1.1
//! after the answer, h2 with a GOAWAY). A body announced at 4 MB and sent a byte a second
//! thus holds its slot seconds, not `--request-timeout`.
//!
//! Only time spent waiting for the client counts against it: the body is judged when
//! the handler asks for more and the bytes are not there. An honest body arrives at the
//! network's speed, megabytes a second; the floor is four orders of magnitude below.
//! Request heads have deadlines instead: the first one `--handshake-timeout` after the
//! connect, later ones `--request-timeout` after the previous answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use std::time::{Duration, Instant};

use axum::body::Bytes;
use hyper::body::Frame;

/// How long a connection that has made no request yet counts as a handshake under way
/// rather than a silent socket, from its connect and again from the end of its TLS
/// handshake (an honest client sends its first request within milliseconds of either;
/// the opening deadline, `--handshake-timeout`, is 3 s). Also how long a request body
/// may be behind the rate floor before its connection counts as worthless. (Here, with
/// the floor, so that the slot table and the metered body both read it from below.)
pub const YOUNG: Duration = Duration::from_secs(1);

/// The body rate floor of a listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Pace {
    /// Bytes per second a body must average; 0: no floor.
    pub(super) floor: u32,
    /// How long after its head a body behind the floor is cut.
    pub(super) grace: Duration,
}

/// A request body arrived slower than the floor.
#[derive(Debug, thiserror::Error)]
#[error("request body arrived slower than {floor} bytes per second")]
pub(super) struct BodyTooSlow {
    pub(super) floor: u32,
}

/// How one request's body arrives.
#[derive(Debug)]
pub(super) struct Progress {
    begun: Instant,
    received: AtomicU64,
    done: AtomicBool,
    /// The handler asked for more and nothing was there.
    awaiting: AtomicBool,
}

impl Progress {
    /// A request whose head just arrived; `done` when it has no body.
    pub(super) fn new(done: bool) -> Arc<Progress> {
        Arc::new(Progress::since(Instant::now(), done))
    }

    fn since(begun: Instant, done: bool) -> Progress {
        Progress {
            begun,
            received: AtomicU64::new(0),
            done: AtomicBool::new(done),
            awaiting: AtomicBool::new(false),
        }
    }

    /// Whether the whole body arrived.
    pub(super) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Whether the handler waits for a body that has been behind the floor for [`YOUNG`].
    pub(super) fn starving(&self, pace: Pace, now: Instant) -> bool {
        if pace.floor == 0 || self.is_done() || !self.awaiting.load(Ordering::Acquire) {
            return false;
        }
        let elapsed = now.saturating_duration_since(self.begun);
        elapsed >= YOUNG && self.behind_until(pace.floor) < self.begun + elapsed
    }

    /// The moment the body falls behind the floor if nothing more arrives.
    fn behind_until(&self, floor: u32) -> Instant {
        let received = self.received.load(Ordering::Acquire) as f64;
        self.begun + Duration::from_secs_f64(received / f64::from(floor.max(1)))
    }

    /// When the request is cut if nothing more arrives: never before the grace.
    pub(super) fn due(&self, pace: Pace) -> Instant {
        self.behind_until(pace.floor).max(self.begun + pace.grace)
    }

    /// The handler asked for more of the body and it was not there: from now the
    /// wait counts against the floor.
    pub(super) fn awaiting(&self) {
        self.awaiting.store(true, Ordering::Release);
    }

    pub(super) fn arrived(&self, frame: Option<&Result<Frame<Bytes>, impl Sized>>, end: bool) {
        self.awaiting.store(false, Ordering::Release);
        match frame {
            Some(Ok(frame)) => {
                let bytes = frame.data_ref().map_or(0, |data| data.len() as u64);
                self.received.fetch_add(bytes, Ordering::AcqRel);
                if end {
                    self.done.store(true, Ordering::Release);
                }
            }
            None => self.done.store(true, Ordering::Release),
            Some(Err(_)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PACE: Pace = Pace {
        floor: 240,
        grace: Duration::from_secs(2),
    };

    fn awaiting_for(elapsed: Duration, received: u64) -> Progress {
        let progress = Progress::since(Instant::now() - elapsed, false);
        progress.received.store(received, Ordering::Release);
        progress.awaiting.store(true, Ordering::Release);
        progress
    }

    #[test]
    fn a_body_behind_the_floor_starves_after_a_second_and_is_due_after_the_grace() {
        let now = Instant::now();
        // A byte a second, as the flood sends it.
        let trickle = awaiting_for(Duration::from_millis(1500), 1);
        assert!(trickle.starving(PACE, now));
        assert_eq!(trickle.due(PACE), trickle.begun + PACE.grace);
        // Too young to judge.
        assert!(!awaiting_for(Duration::from_millis(500), 0).starving(PACE, now));
        // At the floor's pace, it is due only once it falls behind.
        let steady = awaiting_for(Duration::from_secs(10), 2_400);
        assert!(!steady.starving(PACE, now));
        assert_eq!(steady.due(PACE), steady.begun + Duration::from_secs(10));
    }

    #[test]
    fn a_body_that_arrived_or_is_not_waited_for_never_starves() {
        let now = Instant::now();
        let done = awaiting_for(Duration::from_secs(5), 0);
        done.done.store(true, Ordering::Release);
        assert!(!done.starving(PACE, now));
        // The handler is busy elsewhere (decoding, asking the API server): not the client's
        // fault.
        let working = awaiting_for(Duration::from_secs(5), 0);
        working.awaiting.store(false, Ordering::Release);
        assert!(!working.starving(PACE, now));
        let no_floor = Pace { floor: 0, ..PACE };
        assert!(!awaiting_for(Duration::from_secs(5), 0).starving(no_floor, now));
    }
}
