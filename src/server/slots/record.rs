//! What the slot table remembers of a peer (`server::slots`): the slots it holds, and
//! its use of the door and the requests it got answered lately, fading over
//! [`USE_MEMORY`]; from them, its place in line ([`PeerRecord::cost_at`]).

use std::time::{Duration, Instant};

use super::PRESUMED_COST;

/// How long a peer's use of slots, and the requests it got answered, are remembered
/// (longer than a kubelet's probe period, so that its probes count).
const USE_MEMORY: Duration = Duration::from_secs(30);

/// What a connection that held a slot and ended without a request answered whole (a
/// silent socket, a body too slow or never read, a socket closed at once) adds to its
/// peer's use, in slot-seconds: as much as holding a slot a tenth of a second. A flooder
/// whose sockets are closed as soon as they come, and reopened at once, uses the door as
/// much as one that holds them.
const WASTE_WEIGHT: f64 = 0.1;

/// What a peer holds now, and has held, wasted and got answered lately.
pub(super) struct PeerRecord {
    pub(super) held: usize,
    /// Slot-seconds held, each second's weight decaying over [`USE_MEMORY`], as of
    /// `updated`.
    pub(super) held_secs: f64,
    /// Connections that held a slot and ended without a request answered whole, each
    /// weighing less as it recedes alike, as of `updated`.
    pub(super) wasted: f64,
    /// Requests answered with their bodies whole, each weighing less as it recedes alike,
    /// as of `updated`.
    pub(super) served: f64,
    pub(super) updated: Instant,
}

impl PeerRecord {
    pub(super) fn new(now: Instant) -> PeerRecord {
        PeerRecord {
            held: 0,
            held_secs: 0.0,
            wasted: 0.0,
            served: 0.0,
            updated: now,
        }
    }

    /// How much of what was counted at `updated` still counts at `now`.
    pub(super) fn kept(&self, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        (-elapsed / USE_MEMORY.as_secs_f64()).exp()
    }

    /// Slot-seconds held lately, as of `now`.
    pub(super) fn held_secs_at(&self, now: Instant) -> f64 {
        let kept = self.kept(now);
        self.held_secs * kept + self.held as f64 * USE_MEMORY.as_secs_f64() * (1.0 - kept)
    }

    /// Its use of the door lately, as of `now`: slot-seconds held, and connections wasted.
    pub(super) fn used_at(&self, now: Instant) -> f64 {
        self.held_secs_at(now) + WASTE_WEIGHT * self.wasted * self.kept(now)
    }

    /// Its place in line as of `now`, lower first: what it has cost the door lately per
    /// request answered, in slot-seconds — its use, over the requests answered with
    /// their bodies whole, one request presumed at [`PRESUMED_COST`] (a peer never seen
    /// costs that). A kubelet, whose probes hold a slot a millisecond each, costs next
    /// to nothing; the API server a fraction of a slot-second a review (or about 1.5
    /// holding twenty connections for ten reviews a second); a flooder, whose sockets
    /// hold slots for seconds and get nothing answered, or one cheap request each, far
    /// more.
    pub(super) fn cost_at(&self, now: Instant) -> f64 {
        (self.used_at(now) + PRESUMED_COST) / (1.0 + self.served * self.kept(now))
    }

    /// Brings the counts to `now`.
    pub(super) fn advance(&mut self, now: Instant) {
        let kept = self.kept(now);
        self.held_secs = self.held_secs_at(now);
        self.wasted *= kept;
        self.served *= kept;
        self.updated = now;
    }
}
