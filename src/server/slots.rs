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
//! - a newcomer never takes the slot of its own peer's handshake (still in TLS, however
//!   old), young opening or idle keep-alive connection: the API server, given a burst
//!   of reviews, dials many connections at once and sends its next review on any
//!   connection it holds, and cutting one of them for another of its own gains it
//!   nothing and fails a review (seen as "write: connection reset by peer" in the API
//!   server's error). Such a newcomer waits for a slot instead, in its own task, so
//!   other peers are still accepted meanwhile; only its own *silent* sockets (TLS
//!   done, no request within [`YOUNG`] of its end) give way to it. A handshake still
//!   in TLS past [`YOUNG`] is the API server's own on a starved machine as often as a
//!   flooder's (seen in CI: 500 creates on two cores, "write: broken pipe"); the
//!   opening deadline bounds it anyway;
//! - the peer (IP address) holding the most connections that may give way gives one
//!   up, so a client holding many idle slots pays before one holding a few (the API
//!   server reuses a few connections, a kubelet probe opens one), whatever the number
//!   of slots;
//! - of that peer's connections: first one that has made no request for [`YOUNG`] or
//!   more (a silent socket or an old handshake: a flooder's), then one idle between
//!   requests, then a young one; the oldest first within each. An honest newcomer
//!   finishes its handshake in milliseconds and is never the oldest.
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
    /// In its TLS handshake: the server has not finished it (the client may not have
    /// begun it).
    Handshake,
    /// No request yet: TLS done (or plain HTTP), nothing asked so far.
    Opening,
    /// Has made requests, none in flight (a keep-alive connection between requests).
    Idle,
    /// A request in flight: never cut.
    Busy,
}

/// How long a connection that has made no request yet counts as a handshake under way
/// rather than a silent socket, from its connect and again from the end of its TLS
/// handshake (an honest client sends its first request within milliseconds of either;
/// the opening deadline, `--handshake-timeout`, is 3 s).
pub const YOUNG: Duration = Duration::from_secs(1);

/// How often a newcomer waiting for a slot looks again (besides when a slot frees or a
/// request ends): a young handshake grows old without telling anyone.
const RECHECK: Duration = Duration::from_millis(50);

/// One slot holder, as [`victim`] sees it. `age`: lower is older; `young`: in its
/// current phase for less than [`YOUNG`] (connected, or done with its TLS handshake,
/// that recently).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holder {
    pub age: u64,
    pub peer: IpAddr,
    pub phase: Phase,
    pub young: bool,
}

impl Holder {
    /// Whether a newcomer from `newcomer` may take this slot.
    fn may_give_way_to(&self, newcomer: IpAddr) -> bool {
        match self.phase {
            Phase::Busy => false,
            // However old: a starved server finishes its client's handshakes late.
            Phase::Handshake => self.peer != newcomer,
            Phase::Opening => !(self.peer == newcomer && self.young),
            // Its client may be writing its next request on it right now: closing it
            // would fail that request ("connection reset by peer") to open another of
            // the same client's connections.
            Phase::Idle => self.peer != newcomer,
        }
    }

    /// Order of giving way within a peer: silent sockets, then idle connections, then
    /// handshakes under way.
    fn rank(&self) -> u8 {
        match (self.phase, self.young) {
            (Phase::Handshake | Phase::Opening, false) => 0,
            (Phase::Idle, _) => 1,
            (Phase::Handshake | Phase::Opening, true) => 2,
            (Phase::Busy, _) => 3,
        }
    }
}

/// The connection that gives up its slot to a newcomer from `newcomer`, or `None` when
/// none may (every holder has a request in flight, or the rest are the newcomer's own
/// young handshakes). Of the holders that may give way, the peer holding the most
/// gives one up, by [`Holder::rank`], then the oldest.
pub fn victim(holders: &[Holder], newcomer: IpAddr) -> Option<u64> {
    let candidates = || holders.iter().filter(|h| h.may_give_way_to(newcomer));
    let mut per_peer: HashMap<IpAddr, usize> = HashMap::new();
    for holder in candidates() {
        *per_peer.entry(holder.peer).or_default() += 1;
    }
    candidates()
        .min_by_key(|h| {
            let held = per_peer.get(&h.peer).copied().unwrap_or_default();
            (std::cmp::Reverse(held), h.rank(), h.age)
        })
        .map(|h| h.age)
}

/// Why a newcomer cannot have a slot at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Full {
    /// Every holder has a request in flight: stop accepting until one ends.
    EveryRequestInFlight,
    /// The only holders that could give way are the newcomer's own handshakes and idle
    /// connections: it waits for a slot to free, without holding up other peers.
    OwnConnections,
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
    /// waiting while none may give way.
    pub async fn admit(self: &Arc<Self>, peer: IpAddr) -> Slot {
        loop {
            if let Ok(slot) = self.try_admit(peer) {
                return slot;
            }
            // `notify_one` keeps a permit when nobody waits, so a release between the
            // attempt above and this wait is not missed; several waiters share the
            // permits, so each also looks again now and then.
            let _ = tokio::time::timeout(RECHECK, self.freed.notified()).await;
        }
    }

    /// A slot for a connection from `peer` now, taking one from [`victim`] at the cap.
    pub fn try_admit(self: &Arc<Self>, peer: IpAddr) -> Result<Slot, Full> {
        let mut table = self.table.lock();
        if table.len() >= self.cap {
            let holders: Vec<Holder> = table.iter().map(|(&age, a)| a.holder(age)).collect();
            let Some(age) = victim(&holders, peer) else {
                let waits_for_itself = holders.iter().any(|h| h.phase != Phase::Busy);
                return Err(if waits_for_itself {
                    Full::OwnConnections
                } else {
                    Full::EveryRequestInFlight
                });
            };
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
        Ok(Slot {
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
    handshaking: AtomicBool,
    /// Milliseconds after `started` when its TLS handshake ended (0 before). A slow
    /// handshake that just ended is young again: on a starved machine the server ends
    /// it late, with its client's first request already in the socket.
    handshake_ended: AtomicU64,
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
            handshaking: AtomicBool::new(false),
            handshake_ended: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            last_done: AtomicU64::new(0),
            evicted: CancellationToken::new(),
            freed,
        }
    }

    fn holder(&self, age: u64) -> Holder {
        Holder {
            age,
            peer: self.peer,
            phase: self.phase(),
            young: self.since(&self.handshake_ended) < YOUNG,
        }
    }

    /// Whether the connection is in its TLS handshake (set around the handshake).
    pub fn set_handshaking(&self, handshaking: bool) {
        if !handshaking {
            self.handshake_ended.store(self.millis(), Ordering::Release);
        }
        self.handshaking.store(handshaking, Ordering::Release);
    }

    /// How long ago the instant recorded in `mark` (milliseconds after `started`) was.
    fn since(&self, mark: &AtomicU64) -> Duration {
        Duration::from_millis(self.millis().saturating_sub(mark.load(Ordering::Acquire)))
    }

    /// Milliseconds since the connection was accepted.
    fn millis(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub fn phase(&self) -> Phase {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            Phase::Busy
        } else if self.requested.load(Ordering::Acquire) {
            Phase::Idle
        } else if self.handshaking.load(Ordering::Acquire) {
            Phase::Handshake
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
        activity
            .last_done
            .store(activity.millis(), Ordering::Release);
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
            young: false,
        }
    }

    fn young(age: u64, peer: u8) -> Holder {
        Holder {
            young: true,
            ..holder(age, peer, Phase::Opening)
        }
    }

    /// A newcomer from an address that holds nothing.
    const STRANGER: u8 = 200;

    #[test]
    fn the_peer_holding_the_most_gives_up_its_oldest_silent_connection() {
        let holders = [
            holder(0, 1, Phase::Idle),    // the API server's keep-alive connection
            holder(1, 9, Phase::Idle),    // a flooder that finished TLS once
            holder(2, 9, Phase::Opening), // and its half-open ones
            holder(3, 9, Phase::Opening),
            holder(4, 2, Phase::Opening), // a kubelet probe, just connected
        ];
        assert_eq!(victim(&holders, ip(STRANGER)), Some(2));
    }

    #[test]
    fn requests_in_flight_are_never_cut() {
        let holders = [holder(0, 9, Phase::Busy), holder(1, 9, Phase::Busy)];
        assert_eq!(victim(&holders, ip(STRANGER)), None);
        // The flooder's busy connections stay; of the silent ones, one from each peer,
        // the oldest goes.
        let holders = [
            holder(0, 9, Phase::Busy),
            holder(1, 9, Phase::Busy),
            holder(2, 9, Phase::Opening),
            holder(3, 1, Phase::Opening),
        ];
        assert_eq!(victim(&holders, ip(STRANGER)), Some(2));
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
        assert_eq!(victim(&holders, ip(STRANGER)), Some(3));
    }

    #[test]
    fn between_equal_peers_the_oldest_silent_connection_goes_first() {
        let holders = [
            holder(0, 1, Phase::Idle),
            holder(1, 2, Phase::Opening),
            holder(2, 3, Phase::Opening),
        ];
        assert_eq!(victim(&holders, ip(STRANGER)), Some(1));
        // Everyone has made requests: the oldest idle one.
        let holders = [holder(5, 1, Phase::Idle), holder(7, 2, Phase::Idle)];
        assert_eq!(victim(&holders, ip(STRANGER)), Some(5));
    }

    #[test]
    fn a_newcomer_never_cuts_a_young_handshake_of_its_own_peer() {
        // The API server (peer 1) dials many connections at once in a burst.
        let holders = [holder(0, 1, Phase::Busy), young(1, 1), young(2, 1)];
        assert_eq!(victim(&holders, ip(1)), None, "its own handshakes are kept");
        assert_eq!(
            victim(&holders, ip(2)),
            Some(1),
            "another peer may take one"
        );
        // Grown old without a request, a connection is a silent socket: its own peer's
        // newcomer takes it (a flood from one address still pays with its own).
        let holders = [holder(0, 1, Phase::Opening), young(1, 1)];
        assert_eq!(victim(&holders, ip(1)), Some(0));
    }

    #[test]
    fn a_newcomer_never_cuts_its_own_peers_handshake_still_in_tls_however_old() {
        // On a starved machine the server finishes a handshake late; its client has
        // already written a review on it.
        let slow = holder(0, 1, Phase::Handshake);
        assert_eq!(victim(&[slow, young(1, 1)], ip(1)), None);
        assert_eq!(
            victim(&[slow, young(1, 1)], ip(2)),
            Some(0),
            "another peer may"
        );
    }

    #[test]
    fn a_slow_handshake_that_just_ended_is_young_again_until_its_first_request_is_due() {
        // Accepted two seconds ago: past YOUNG, a silent socket if TLS were done.
        let mut activity = Activity::new(ip(1), Arc::default());
        activity.started -= YOUNG * 2;
        activity.set_handshaking(true);
        let in_tls = activity.holder(0);
        assert!(in_tls.phase == Phase::Handshake && !in_tls.young);
        // The server ends the handshake now: its client's request is due from now.
        activity.set_handshaking(false);
        let done = activity.holder(0);
        assert!(done.phase == Phase::Opening && done.young);
        assert_eq!(
            victim(&[done], ip(1)),
            None,
            "its own peer's newcomer waits"
        );
    }

    #[test]
    fn of_one_peer_silent_sockets_go_first_then_idle_connections_then_handshakes() {
        let holders = [
            young(0, 1),
            holder(1, 1, Phase::Idle),
            holder(2, 1, Phase::Opening),
        ];
        assert_eq!(victim(&holders, ip(STRANGER)), Some(2));
        assert_eq!(victim(&holders[..2], ip(STRANGER)), Some(1));
        assert_eq!(victim(&holders[..1], ip(STRANGER)), Some(0));
        // The peer's own newcomer takes neither its idle connection nor its handshake.
        assert_eq!(victim(&holders[..2], ip(1)), None);
    }

    #[test]
    fn the_peer_holding_the_most_is_counted_among_those_that_may_give_way() {
        // Peer 1 holds three young handshakes and one idle connection; peer 9 holds two
        // silent sockets. To peer 1's newcomer none of its own may give way, so peer 9
        // gives one up.
        let holders = [
            young(0, 1),
            young(1, 1),
            young(2, 1),
            holder(3, 1, Phase::Idle),
            holder(4, 9, Phase::Opening),
            holder(5, 9, Phase::Opening),
        ];
        assert_eq!(victim(&holders, ip(1)), Some(4));
        assert_eq!(
            victim(&holders, ip(STRANGER)),
            Some(3),
            "peer 1 holds the most"
        );
    }

    #[tokio::test]
    async fn a_newcomer_waits_for_its_own_connections_and_others_do_not() {
        let slots = Slots::new(2);
        let api_a = slots.admit(ip(1)).await;
        let api_b = slots.admit(ip(1)).await;
        assert!(matches!(slots.try_admit(ip(1)), Err(Full::OwnConnections)));
        let waiting = tokio::spawn({
            let slots = slots.clone();
            async move { slots.admit(ip(1)).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        // One handshake ends in a request, answered: an idle connection of its own peer,
        // which its client may use again at any moment, is not cut either.
        drop(api_b.activity().begin());
        tokio::time::sleep(RECHECK * 2).await;
        assert!(!waiting.is_finished(), "still waiting");
        assert!(!api_b.activity().evicted.is_cancelled());
        // Its client closes that connection: the slot goes to the newcomer.
        drop(api_b);
        let newcomer = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("admitted once its own connection closed")
            .expect("no panic");
        assert!(!api_a.activity().evicted.is_cancelled());
        // A stranger is not made to wait: it takes the oldest handshake.
        let Ok(_stranger) = slots.try_admit(ip(STRANGER)) else {
            panic!("a stranger is admitted at once");
        };
        assert!(api_a.activity().evicted.is_cancelled());
        drop(newcomer);
    }

    #[tokio::test]
    async fn at_the_cap_with_every_request_in_flight_nobody_may_give_way() {
        let slots = Slots::new(1);
        let busy = slots.admit(ip(1)).await;
        let _request = busy.activity().begin();
        assert!(matches!(
            slots.try_admit(ip(1)),
            Err(Full::EveryRequestInFlight)
        ));
        assert!(matches!(
            slots.try_admit(ip(2)),
            Err(Full::EveryRequestInFlight)
        ));
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
