//! The rate rule for request bodies (Kestrel's `MinRequestBodyDataRate`, nginx's
//! `client_body_timeout`), judged over a sliding window: a body's bytes buy it time at
//! `--min-body-rate` (a byte buys 1/floor of a second), but it can never bank more than
//! `--body-rate-grace` (the window) ahead of now. A body that has fallen more than
//! [`YOUNG`] short of a full window (silent for a second, or trickling below the floor
//! for about as long) is worthless to the slot table (a newcomer may take its slot, see
//! `server::slots`); one whose time has run out is answered 408 and its connection gives
//! up its slot and closes (HTTP/1.1 after the answer, h2 with a GOAWAY). So a burst then
//! silence buys no more time than silence: 4 KiB at once, then nothing, is worthless a
//! second after its last byte and cut a window after it, as a body that never came is
//! from its head; a 4 MB body sent a byte a second holds its slot seconds, not
//! `--request-timeout`. And a body must be whole within its whole-body deadline
//! (`--request-timeout` from its head) however fast its bytes come, or it is cut alike.
//!
//! Only time spent waiting for the client counts: the body is judged when the handler
//! asks for more and the bytes are not there. An honest body arrives at the network's
//! speed, megabytes a second; the floor is four orders of magnitude below.
//! Request heads have whole-head deadlines instead: the first one `--handshake-timeout`
//! after the connect, later ones `--request-timeout` after the previous answer (and a
//! connection in the middle of a head has no request in flight: it holds its slot only
//! until someone needs it).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use std::time::{Duration, Instant};

use axum::body::Bytes;
use hyper::body::Frame;

/// How long a connection that has made no request yet counts as a handshake under way
/// rather than a silent socket, from its connect and again from the end of its TLS
/// handshake (an honest client sends its first request within milliseconds of either;
/// the opening deadline, `--handshake-timeout`, is 3 s). Also how far a request body
/// may fall short of a full window before its connection counts as worthless. (Here,
/// with the rate rule, so that the slot table and the metered body both read it from
/// below.)
pub const YOUNG: Duration = Duration::from_secs(1);

/// The body rate rule of a listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Pace {
    /// Bytes per second a body must keep up over the window; 0: no floor.
    pub(super) floor: u32,
    /// The window: the most time a body's bytes may buy ahead of now, and the time a
    /// body that never sends a byte has from its head.
    pub(super) window: Duration,
    /// The whole body must have arrived by then after its head.
    pub(super) whole: Duration,
}

/// A request body arrived too slowly: behind the floor over the window, or not whole
/// by its deadline.
#[derive(Debug, thiserror::Error)]
pub(super) enum BodyTooSlow {
    #[error("request body arrived slower than {floor} bytes per second")]
    BelowFloor { floor: u32 },
    #[error("request body was not whole within {within:?}")]
    NotWhole { within: Duration },
}

/// How one request's body arrives.
#[derive(Debug)]
pub(super) struct Progress {
    begun: Instant,
    received: AtomicU64,
    /// Microseconds after `begun` when the body falls behind if nothing more arrives.
    ahead_until: AtomicU64,
    done: AtomicBool,
    /// The handler asked for more and nothing was there.
    awaiting: AtomicBool,
}

impl Progress {
    /// A request whose head just arrived, judged by `pace`; `done` when it has no body.
    pub(super) fn new(pace: Pace, done: bool) -> Arc<Progress> {
        Arc::new(Progress::since(Instant::now(), pace, done))
    }

    fn since(begun: Instant, pace: Pace, done: bool) -> Progress {
        Progress {
            begun,
            received: AtomicU64::new(0),
            ahead_until: AtomicU64::new(micros(pace.window)),
            done: AtomicBool::new(done),
            awaiting: AtomicBool::new(false),
        }
    }

    /// Whether the whole body arrived.
    pub(super) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Whether the handler waits for a body that has fallen [`YOUNG`] short of a full
    /// window (or is past its whole-body deadline).
    pub(super) fn starving(&self, pace: Pace, now: Instant) -> bool {
        if pace.floor == 0 || self.is_done() || !self.awaiting.load(Ordering::Acquire) {
            return false;
        }
        let ahead = self.ahead_until.load(Ordering::Acquire);
        let short = micros(pace.window.saturating_sub(YOUNG));
        let since = micros(now.saturating_duration_since(self.begun));
        since >= ahead.saturating_sub(short) || since >= micros(pace.whole)
    }

    /// When the request is cut if nothing more arrives, and why.
    pub(super) fn due(&self, pace: Pace) -> (Instant, BodyTooSlow) {
        let behind = self.begun + from_micros(self.ahead_until.load(Ordering::Acquire));
        let whole = self.begun + pace.whole;
        if whole <= behind {
            (whole, BodyTooSlow::NotWhole { within: pace.whole })
        } else {
            (behind, BodyTooSlow::BelowFloor { floor: pace.floor })
        }
    }

    /// The handler asked for more of the body and it was not there: from now the
    /// wait counts against the rule.
    pub(super) fn awaiting(&self) {
        self.awaiting.store(true, Ordering::Release);
    }

    pub(super) fn arrived(
        &self,
        pace: Pace,
        frame: Option<&Result<Frame<Bytes>, impl Sized>>,
        end: bool,
    ) {
        self.awaiting.store(false, Ordering::Release);
        match frame {
            Some(Ok(frame)) => {
                let bytes = frame.data_ref().map_or(0, |data| data.len() as u64);
                self.received.fetch_add(bytes, Ordering::AcqRel);
                self.bought(pace, bytes, Instant::now());
                if end {
                    self.done.store(true, Ordering::Release);
                }
            }
            None => self.done.store(true, Ordering::Release),
            Some(Err(_)) => {}
        }
    }

    /// `bytes` arrived at `at`: they buy time at the floor, up to a window ahead of `at`.
    fn bought(&self, pace: Pace, bytes: u64, at: Instant) {
        if pace.floor == 0 {
            return;
        }
        let at = micros(at.saturating_duration_since(self.begun));
        let bought = bytes.saturating_mul(1_000_000) / u64::from(pace.floor);
        let most = at.saturating_add(micros(pace.window));
        // One task polls a body at a time: a plain read-modify-write suffices.
        let ahead = self.ahead_until.load(Ordering::Acquire);
        let ahead = ahead.max(at).saturating_add(bought).min(most);
        self.ahead_until.store(ahead, Ordering::Release);
    }
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

fn from_micros(micros: u64) -> Duration {
    Duration::from_micros(micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PACE: Pace = Pace {
        floor: 240,
        window: Duration::from_secs(2),
        whole: Duration::from_secs(15),
    };

    /// A body whose head came `elapsed` ago, that received `sent` bytes at each offset
    /// from its head, and whose handler now waits for more.
    fn awaiting_after(elapsed: Duration, sent: &[(Duration, u64)]) -> Progress {
        let begun = Instant::now() - elapsed;
        let progress = Progress::since(begun, PACE, false);
        for &(offset, bytes) in sent {
            progress.received.fetch_add(bytes, Ordering::AcqRel);
            progress.bought(PACE, bytes, begun + offset);
        }
        progress.awaiting.store(true, Ordering::Release);
        progress
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn a_body_behind_the_floor_starves_after_a_second_and_is_cut_after_the_window() {
        let now = Instant::now();
        // A byte a second, as the flood sends it.
        let trickle = awaiting_after(secs(1.5), &[(secs(0.5), 1), (secs(1.5), 1)]);
        assert!(trickle.starving(PACE, now));
        let (due, why) = trickle.due(PACE);
        assert!(due < trickle.begun + secs(2.1), "{:?}", due - trickle.begun);
        assert!(matches!(why, BodyTooSlow::BelowFloor { floor: 240 }));
        // Nothing yet, half a second after its head: too young to judge.
        assert!(!awaiting_after(secs(0.5), &[]).starving(PACE, now));
        // Keeping up with the floor, it never falls behind.
        let steady: Vec<(Duration, u64)> = (1..=10).map(|s| (secs(f64::from(s)), 240)).collect();
        let steady = awaiting_after(secs(10.0), &steady);
        assert!(!steady.starving(PACE, now));
    }

    #[test]
    fn a_burst_then_silence_buys_no_more_time_than_silence() {
        let now = Instant::now();
        // 4 KiB at once (17 s at the floor, on average since the head), then nothing.
        let burst = awaiting_after(secs(1.2), &[(secs(0.1), 4096)]);
        assert!(burst.starving(PACE, now), "a second after its last byte");
        let (due, _) = burst.due(PACE);
        assert_eq!(due, burst.begun + secs(0.1) + PACE.window);
        // A megabyte, then nothing: the same.
        let large = awaiting_after(secs(1.2), &[(secs(0.1), 1 << 20)]);
        assert!(large.starving(PACE, now));
        assert_eq!(large.due(PACE).0, large.begun + secs(0.1) + PACE.window);
    }

    #[test]
    fn a_body_not_whole_by_its_deadline_is_cut_however_fast_its_bytes_come() {
        let now = Instant::now();
        let fast: Vec<(Duration, u64)> =
            (0..160).map(|i| (secs(f64::from(i) * 0.1), 4096)).collect();
        let fast = awaiting_after(secs(16.0), &fast);
        assert!(fast.starving(PACE, now));
        let (due, why) = fast.due(PACE);
        assert_eq!(due, fast.begun + PACE.whole);
        assert!(matches!(why, BodyTooSlow::NotWhole { .. }));
    }

    #[test]
    fn a_body_that_arrived_or_is_not_waited_for_never_starves() {
        let now = Instant::now();
        let done = awaiting_after(secs(5.0), &[]);
        done.done.store(true, Ordering::Release);
        assert!(!done.starving(PACE, now));
        // The handler is busy elsewhere (decoding, asking the API server): not the client's
        // fault.
        let working = awaiting_after(secs(5.0), &[]);
        working.awaiting.store(false, Ordering::Release);
        assert!(!working.starving(PACE, now));
        let no_floor = Pace { floor: 0, ..PACE };
        assert!(!awaiting_after(secs(5.0), &[]).starving(no_floor, now));
    }
}
