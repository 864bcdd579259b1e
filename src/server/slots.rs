//! Who holds a listener's connection slots, and who gives one up when a newcomer
//! arrives at the cap.
//!
//! A listener holds at most `max_connections` connections. At the cap, a newcomer is
//! not made to wait behind whoever got there first (300 sockets that never start TLS
//! would otherwise lock the door for as long as they care to reopen them): it takes
//! the slot of a connection that is doing nothing, chosen by [`victim`]:
//!
//! - only connections with no request in flight can be chosen: a request being
//!   answered is never cut (an admission review cut short is a pod not created);
//! - the peer (IP address) holding the most such connections gives one up, so a client
//!   holding many idle slots pays before one holding a few (the API server reuses a
//!   few connections, a kubelet probe opens one), whatever the number of slots;
//! - of that peer's connections, one that has not made a request yet (still in its
//!   TLS handshake, or silent since) goes before one that has, and the oldest first:
//!   an honest newcomer finishes its handshake in milliseconds and is never the
//!   oldest.
//!
//! When every slot has a request in flight, the newcomer waits (in the kernel's
//! backlog) until one ends: requests are bounded by the request timeout.
//!
//! [`victim`] is the pure rule; [`Slots`] keeps the table and tells the chosen
//! connection to close through its [`Activity`].

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// What a connection is doing, as far as giving up its slot goes; in the order they
/// are given up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// No request yet: in its TLS handshake, or connected and silent.
    Opening,
    /// Has made requests, none in flight (a keep-alive connection between requests).
    Idle,
    /// A request in flight: never cut.
    Busy,
}

/// One slot holder, as [`victim`] sees it. `age`: lower is older.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holder {
    pub age: u64,
    pub peer: IpAddr,
    pub phase: Phase,
}

/// The connection that gives up its slot to a newcomer, or `None` when every holder
/// has a request in flight. The peer holding the most connections without a request
/// in flight gives one up: its oldest that has not made a request, else its oldest.
pub fn victim(holders: &[Holder]) -> Option<u64> {
    let mut idle_per_peer: HashMap<IpAddr, usize> = HashMap::new();
    for holder in holders.iter().filter(|h| h.phase != Phase::Busy) {
        *idle_per_peer.entry(holder.peer).or_default() += 1;
    }
    holders
        .iter()
        .filter(|h| h.phase != Phase::Busy)
        .min_by_key(|h| {
            let held = idle_per_peer.get(&h.peer).copied().unwrap_or_default();
            (std::cmp::Reverse(held), h.phase, h.age)
        })
        .map(|h| h.age)
}

/// The slot table of one listener.
pub struct Slots {
    cap: usize,
    table: Mutex<BTreeMap<u64, Arc<Activity>>>,
    next: AtomicU64,
    /// Signalled when a slot frees or a request ends (a busy holder became one that
    /// can give up its slot).
    freed: Arc<Notify>,
}

impl Slots {
    pub fn new(cap: usize) -> Arc<Slots> {
        Arc::new(Slots {
            cap: cap.max(1),
            table: Mutex::new(BTreeMap::new()),
            next: AtomicU64::new(0),
            freed: Arc::new(Notify::new()),
        })
    }

    /// A slot for a connection from `peer`, taking one from [`victim`] at the cap and
    /// waiting while every holder has a request in flight.
    pub async fn admit(self: &Arc<Self>, peer: IpAddr) -> Slot {
        loop {
            if let Some(slot) = self.try_admit(peer) {
                return slot;
            }
            // `notify_one` keeps a permit when nobody waits, so a release between the
            // attempt above and this wait is not missed.
            self.freed.notified().await;
        }
    }

    fn try_admit(self: &Arc<Self>, peer: IpAddr) -> Option<Slot> {
        let mut table = self.table.lock();
        if table.len() >= self.cap {
            let holders: Vec<Holder> = table
                .iter()
                .map(|(&age, a)| Holder {
                    age,
                    peer: a.peer,
                    phase: a.phase(),
                })
                .collect();
            let age = victim(&holders)?;
            if let Some(evicted) = table.remove(&age) {
                tracing::debug!(
                    peer = %evicted.peer,
                    phase = ?evicted.phase(),
                    newcomer = %peer,
                    "connection cap reached; closing a connection of the peer holding the most"
                );
                evicted.evicted.cancel();
            }
        }
        let age = self.next.fetch_add(1, Ordering::Relaxed);
        let activity = Arc::new(Activity::new(peer, self.freed.clone()));
        table.insert(age, activity.clone());
        Some(Slot {
            slots: self.clone(),
            age,
            activity,
        })
    }

    /// Connections holding a slot now.
    pub fn held(&self) -> usize {
        self.table.lock().len()
    }
}

/// A connection's slot, given back when dropped (unless it was taken from it).
pub struct Slot {
    slots: Arc<Slots>,
    age: u64,
    activity: Arc<Activity>,
}

impl Slot {
    pub fn activity(&self) -> &Arc<Activity> {
        &self.activity
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut table = self.slots.table.lock();
        // An evicted connection's entry is already gone (and its age never reused).
        table.remove(&self.age);
        drop(table);
        self.slots.freed.notify_one();
    }
}

/// One connection's requests: whether it has made one, how many are in flight, when
/// the last one ended; and whether it has been told to give up its slot.
pub struct Activity {
    peer: IpAddr,
    started: Instant,
    requested: AtomicBool,
    in_flight: AtomicUsize,
    /// Milliseconds after `started` when a request last ended.
    last_done: AtomicU64,
    /// Cancelled when a newcomer took this connection's slot: close it.
    evicted: CancellationToken,
    freed: Arc<Notify>,
}

impl Activity {
    fn new(peer: IpAddr, freed: Arc<Notify>) -> Self {
        Activity {
            peer,
            started: Instant::now(),
            requested: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            last_done: AtomicU64::new(0),
            evicted: CancellationToken::new(),
            freed,
        }
    }

    pub fn phase(&self) -> Phase {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            Phase::Busy
        } else if self.requested.load(Ordering::Acquire) {
            Phase::Idle
        } else {
            Phase::Opening
        }
    }

    /// Whether a request has begun on this connection.
    pub fn has_requested(&self) -> bool {
        self.requested.load(Ordering::Acquire)
    }

    /// Resolves when a newcomer has taken this connection's slot.
    pub async fn evicted(&self) {
        self.evicted.cancelled().await
    }

    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.requested.store(true, Ordering::Release);
        InFlight(self.clone())
    }

    /// Resolves once no request has been in flight for `idle`.
    pub async fn idle_for(&self, idle: Duration) {
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
pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let activity = &self.0;
        let elapsed = u64::try_from(activity.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        activity.last_done.store(elapsed, Ordering::Release);
        if activity.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            // A listener waiting at the cap may now take this connection's slot.
            activity.freed.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    fn holder(age: u64, peer: u8, phase: Phase) -> Holder {
        Holder {
            age,
            peer: ip(peer),
            phase,
        }
    }

    #[test]
    fn the_peer_holding_the_most_gives_up_its_oldest_silent_connection() {
        let holders = [
            holder(0, 1, Phase::Idle),    // the API server's keep-alive connection
            holder(1, 9, Phase::Idle),    // a flooder that finished TLS once
            holder(2, 9, Phase::Opening), // and its half-open ones
            holder(3, 9, Phase::Opening),
            holder(4, 2, Phase::Opening), // a kubelet probe, just connected
        ];
        assert_eq!(victim(&holders), Some(2));
    }

    #[test]
    fn requests_in_flight_are_never_cut() {
        let holders = [holder(0, 9, Phase::Busy), holder(1, 9, Phase::Busy)];
        assert_eq!(victim(&holders), None);
        // The flooder's busy connections stay; of the silent ones, one from each peer,
        // the oldest goes.
        let holders = [
            holder(0, 9, Phase::Busy),
            holder(1, 9, Phase::Busy),
            holder(2, 9, Phase::Opening),
            holder(3, 1, Phase::Opening),
        ];
        assert_eq!(victim(&holders), Some(2));
    }

    #[test]
    fn busy_connections_do_not_count_against_their_peer() {
        // The API server has three reviews in flight and opens a fourth connection; a
        // flooder holds two silent ones: the flooder gives way, not the new handshake.
        let holders = [
            holder(0, 1, Phase::Busy),
            holder(1, 1, Phase::Busy),
            holder(2, 1, Phase::Busy),
            holder(3, 9, Phase::Opening),
            holder(4, 9, Phase::Opening),
            holder(5, 1, Phase::Opening),
        ];
        assert_eq!(victim(&holders), Some(3));
    }

    #[test]
    fn between_equal_peers_the_oldest_silent_connection_goes_first() {
        let holders = [
            holder(0, 1, Phase::Idle),
            holder(1, 2, Phase::Opening),
            holder(2, 3, Phase::Opening),
        ];
        assert_eq!(victim(&holders), Some(1));
        // Everyone has made requests: the oldest idle one.
        let holders = [holder(5, 1, Phase::Idle), holder(7, 2, Phase::Idle)];
        assert_eq!(victim(&holders), Some(5));
    }

    #[tokio::test]
    async fn at_the_cap_a_newcomer_takes_a_slot_and_the_victim_is_told() {
        let slots = Slots::new(2);
        let flood_a = slots.admit(ip(9)).await;
        let flood_b = slots.admit(ip(9)).await;
        let honest = slots.admit(ip(1)).await;
        assert_eq!(slots.held(), 2);
        assert!(flood_a.activity().evicted.is_cancelled());
        assert!(!flood_b.activity().evicted.is_cancelled());
        // The evicted connection's own release later frees nothing more.
        drop(flood_a);
        assert_eq!(slots.held(), 2);
        drop((flood_b, honest));
        assert_eq!(slots.held(), 0);
    }

    #[tokio::test]
    async fn at_the_cap_with_every_request_in_flight_a_newcomer_waits_for_one_to_end() {
        let slots = Slots::new(1);
        let busy = slots.admit(ip(1)).await;
        let request = busy.activity().begin();
        let waiting = tokio::spawn({
            let slots = slots.clone();
            async move { slots.admit(ip(2)).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(request);
        let newcomer = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("admitted once the request ended")
            .expect("no panic");
        assert!(busy.activity().evicted.is_cancelled());
        assert_eq!(newcomer.activity().phase(), Phase::Opening);
    }
}
