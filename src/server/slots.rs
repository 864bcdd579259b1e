//! Who holds a listener's connection slots, who gives one up when a newcomer arrives at
//! the cap, and in what order waiting newcomers get in.
//!
//! A listener holds at most `max_connections` connections. [`admission`] is the pure
//! rule, over the table of who holds what; [`Slots`] keeps the table, the waiting room,
//! and tells a connection whose slot was taken to close through its [`Activity`].
//!
//! **The principle: a slot is held by the work it does, and peers (IP addresses) stand
//! in line by what they cost the door per request answered.** A connection *works*
//! while a request is in flight whose body keeps up with the rate rule (`server::pace`);
//! work is never cut. Every other connection holds its slot on loan: a silent socket, a
//! handshake, a keep-alive connection between requests, a body that stalled. A peer's
//! *cost* is the slot-seconds it has held lately (and a tenth of one per connection that
//! held a slot and ended with nothing answered), over the requests it got answered with
//! their bodies whole, one request presumed at [`PRESUMED_COST`] (see
//! [`PeerRecord::cost_at`]). The API server, answered reviews steadily on a few
//! connections, costs a fraction of a slot-second a review; a kubelet, whose probes hold
//! a slot a millisecond, less; a flood — sockets that hold slots for seconds and get
//! nothing answered, or one cheap request each, or that close at once — costs seconds
//! per answer or has none, from one address or from four hundred, and so does a peer
//! never seen. So whatever a flood does without working, the API server and the kubelet
//! stand before it, and whatever it does, it pays with its own slots.
//!
//! **Shares.** A peer's *fair share* is the cap over the peers competing (those holding
//! slots and the newcomer's), at least one slot. A peer below it is *entitled*. A peer is
//! *over its share* when it holds more than its fair share and more than an eighth of the
//! cap (the eighth a peer keeps however many addresses compete).
//!
//! **Free slots.** The last eighth of the slots (the *reserve*) is only for entitled peers:
//! a peer holding most of the listener, or the flood of one address, never fills it.
//!
//! **At the cap** a newcomer takes the slot of a connection on loan, the first found:
//!
//! 1. *worthless*, of any peer: a connection cut for a body too slow, a request whose body
//!    has fallen a second short of the rate rule's window, a silent socket (no request
//!    within [`YOUNG`] of connecting, or of the end of a TLS handshake that took longer),
//!    a TLS handshake under way for [`YOUNG`] or more. At a door of
//!    [`Callers::KeepAlive`], a peer that completed a request within [`QUIET`] has
//!    *standing* (the API server sending reviews): its slow handshakes and quiet openings
//!    are trusted, and only its own newcomers take its silent openings. At a door of
//!    [`Callers::Redialing`] (probes, scrapes) nobody has standing: a flood from many
//!    addresses would earn it with one cheap request per connection;
//! 2. of a peer without standing: a young handshake or opening, or a connection idle
//!    between requests, if the newcomer's peer stands *clearly before* its own in line
//!    (costs less than half as much: a kubelet probe, or the API server's next
//!    connection, does not wait for a flooder's sockets, reopened as soon as closed, to
//!    grow old; flooders alike do not churn each other's); a connection idle for
//!    [`YOUNG`] or more also to an entitled newcomer not *clearly behind* its peer;
//! 3. for an entitled newcomer not clearly behind its peer: a connection with no request
//!    in flight of a peer over its share, the peer holding the most first: silent ones,
//!    idle ones, young ones.
//!
//! Within each, the peer holding the most gives way first, then the oldest connection.
//! Never taken: work (an admission review cut short is a pod not created); a connection
//! of a peer with standing, within its share, that is idle or in its handshake; an idle
//! connection of a peer clearly before the newcomer's (the API server, after a burst,
//! holds more than its share of connections it is about to use again). And a newcomer
//! never takes its own peer's handshake still in TLS (however old: a starved server
//! finishes its client's handshakes late), its young opening, or its idle keep-alive
//! connection: the API server, given a burst of reviews, dials many connections at once
//! and sends its next review on any connection it holds; cutting one for another of its
//! own gains it nothing and fails a review ("write: connection reset by peer" in the
//! end-to-end suite).
//!
//! **Waiting.** A newcomer that finds no slot waits in the listener's waiting room, in its
//! own task, bounded by its opening deadline. Whenever a slot frees, a request ends or time
//! passes ([`RECHECK`]), waiters are let in in line: the peer that costs least first
//! (costs within about 9% are equal), then the peer holding the fewest slots, then the
//! oldest. The room has [`seats`]: enough for the API server's bursts (hundreds of
//! connections at once) and for the floods it meets, so that a flooder's surplus waits
//! its turn (and its deadline) instead of being closed and reopened thousands of times a
//! second, with honest connections queued behind them in the kernel's backlog. A full
//! room gives the seat of its last waiter in line to a newcomer before it; a newcomer
//! last in line is closed.
//!
//! **Requests in flight.** As many as slots before fairness applies; beyond, a peer may
//! open a new h2 stream only within its fair share of them ([`Slots::admits_stream`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;

use super::pace::Pace;

mod activity;
mod record;
mod rule;
pub(super) use activity::Activity;
#[cfg(test)]
use activity::InFlight;
use record::PeerRecord;
pub use rule::Callers;
use rule::{Admission, Holder, Line, Newcomer, State, admission, seats};
use rule::{Census, admit_in, eighth};

pub use super::pace::YOUNG;

/// How long a peer keeps its standing after it last completed a request (its body
/// whole, answered): the API server sending a review every few hundred milliseconds
/// always has it; a flooder whose connections made one request loses it.
const QUIET: Duration = Duration::from_secs(2);

/// How often the waiting room is looked at besides when a slot frees or a request ends:
/// a young handshake grows old, and a peer loses its standing, without telling anyone.
const RECHECK: Duration = Duration::from_millis(50);

/// Least time between two passes over the waiting room.
const PASS_SPACING: Duration = Duration::from_millis(5);

/// What a newcomer gets from [`Slots::enter`].
pub(super) enum Entry {
    /// A slot, now.
    Admitted(Slot),
    /// A seat in the waiting room: the slot comes through the ticket, or the ticket
    /// fails when the seat was given to a newcomer ranked before it.
    Waiting(oneshot::Receiver<Slot>),
    /// The waiting room is full of newcomers ranked before this one: close it.
    Refused,
}

/// The slot table and waiting room of one listener.
pub(super) struct Slots {
    cap: usize,
    pace: Pace,
    callers: Callers,
    table: Mutex<Table>,
    signals: Arc<Signals>,
}

/// What connections tell the listener as they go.
struct Signals {
    /// Requests in flight on the listener.
    in_flight: AtomicUsize,
    /// A slot freed, a request ended, or a newcomer sat down: let waiters in.
    changed: Notify,
}

#[derive(Default)]
struct Table {
    holders: BTreeMap<u64, Arc<Activity>>,
    next_age: u64,
    room: Vec<Waiter>,
    next_seat: u64,
    /// The first turn in the room as of the last pass, or better since (a newcomer ranked
    /// after it waits its turn).
    first_turn: Option<Turn>,
    /// The last turn in the room, when known.
    last_turn: Option<Turn>,
    peers: HashMap<IpAddr, PeerRecord>,
}

struct Waiter {
    /// Its turn when last looked at (its seat number last: first come, first served
    /// between equals).
    turn: Turn,
    peer: IpAddr,
    handoff: oneshot::Sender<Slot>,
}

/// What a peer never seen is presumed to cost, in slot-seconds for one request
/// answered: more than the API server costs (a few connections held for ten reviews a
/// second, a fraction of a slot-second a review; twenty held for that many, about 1.5),
/// so that a flood from addresses it has never seen, or has not seen for a while, never
/// stands before it in line.
pub(super) const PRESUMED_COST: f64 = 5.0;

/// Order in which waiters are let in, lower first: the peer's place in line (its cost,
/// see [`PeerRecord::cost_at`], in steps of about 9%), the slots it holds, seat.
type Turn = (i64, usize, u64);

/// Peers' places in line as of one moment, each computed once (a pass over the waiting
/// room looks at every holder's and waiter's peer, often many times).
struct Lines {
    now: Instant,
    known: HashMap<IpAddr, Line>,
}

impl Lines {
    fn new(now: Instant) -> Lines {
        Lines {
            now,
            known: HashMap::new(),
        }
    }
}

/// Waiters refused in a row after which a pass over the waiting room stops: the rest,
/// later in line, wait for the next pass (a full room of a flood's newcomers, none of
/// which anything gives way to, is not looked at whole every few milliseconds).
const REFUSED_IN_A_ROW: usize = 64;

/// `cost` in steps of an eighth of a doubling.
fn cost_step(cost: f64) -> i64 {
    (8.0 * cost.max(1e-9).log2()).floor() as i64
}

impl Table {
    fn turn(&self, peer: IpAddr, seat: u64, now: Instant) -> Turn {
        self.turn_in(&mut Lines::new(now), peer, seat)
    }

    fn turn_in(&self, lines: &mut Lines, peer: IpAddr, seat: u64) -> Turn {
        let line = self.line_in(lines, peer);
        let held = self.peers.get(&peer).map_or(0, |r| r.held);
        (cost_step(line.cost), held, seat)
    }

    fn holders(&self, pace: Pace, now: Instant) -> Vec<Holder> {
        self.holders_in(&mut Lines::new(now), pace)
    }

    fn holders_in(&self, lines: &mut Lines, pace: Pace) -> Vec<Holder> {
        self.holders
            .iter()
            .map(|(&age, activity)| Holder {
                line: self.line_in(lines, activity.peer),
                ..activity.holder(age, pace, lines.now)
            })
            .collect()
    }

    /// `peer`'s place in line (see [`PeerRecord::cost_at`]), as of `lines.now`, computed
    /// once there.
    fn line_in(&self, lines: &mut Lines, peer: IpAddr) -> Line {
        let now = lines.now;
        *lines.known.entry(peer).or_insert_with(|| {
            self.peers.get(&peer).map_or(Line::NEVER_SEEN, |r| Line {
                cost: r.cost_at(now),
                used: r.used_at(now),
            })
        })
    }

    fn newcomer(&self, peer: IpAddr, now: Instant) -> Newcomer {
        Newcomer {
            peer,
            line: self.line_in(&mut Lines::new(now), peer),
        }
    }

    fn record(&mut self, peer: IpAddr, now: Instant) -> &mut PeerRecord {
        let record = self
            .peers
            .entry(peer)
            .or_insert_with(|| PeerRecord::new(now));
        record.advance(now);
        record
    }

    /// Counts the requests the holders got answered since last looked at.
    fn fold_served(&mut self, now: Instant) {
        let mut counts: HashMap<IpAddr, u64> = HashMap::new();
        for activity in self.holders.values() {
            let served = activity.take_served();
            if served > 0 {
                *counts.entry(activity.peer).or_default() += served;
            }
        }
        for (peer, served) in counts {
            self.record(peer, now).served += served as f64;
        }
    }

    /// Forgets peers that hold nothing and count for little lately, once there are many;
    /// if there are still many (a flood from hundreds of addresses), the peers holding
    /// nothing that cost the most per request answered, down to three quarters of many.
    /// A kubelet between probes, or the API server between reviews, holds nothing and
    /// costs least: forgotten, it would be a peer never seen, no longer before the flood.
    fn forget_old_peers(&mut self, cap: usize, now: Instant) {
        let many = 4 * cap + 64;
        if self.peers.len() <= many {
            return;
        }
        self.peers
            .retain(|_, r| r.held > 0 || r.used_at(now) > 0.01 || r.served * r.kept(now) > 0.01);
        if self.peers.len() <= many {
            return;
        }
        let mut resting: Vec<(f64, IpAddr)> = (self.peers.iter())
            .filter(|(_, r)| r.held == 0)
            .map(|(peer, r)| (r.cost_at(now), *peer))
            .collect();
        resting.sort_unstable_by(|a, b| b.0.total_cmp(&a.0));
        let excess = self.peers.len() - many * 3 / 4;
        for (_, peer) in resting.into_iter().take(excess) {
            self.peers.remove(&peer);
        }
    }

    /// `activity`, a holder, leaves the table: what it got answered is counted, and it is
    /// waste if nothing was.
    fn left(&mut self, activity: &Activity, now: Instant) {
        let record = self.record(activity.peer, now);
        record.held = record.held.saturating_sub(1);
        record.served += activity.take_served() as f64;
        if !activity.has_served() {
            record.wasted += 1.0;
        }
    }
}

impl Slots {
    pub(super) fn new(cap: usize, pace: Pace, callers: Callers) -> Arc<Slots> {
        Arc::new(Slots {
            cap: cap.max(1),
            pace,
            callers,
            table: Mutex::new(Table::default()),
            signals: Arc::new(Signals {
                in_flight: AtomicUsize::new(0),
                changed: Notify::new(),
            }),
        })
    }

    pub(super) fn pace(&self) -> Pace {
        self.pace
    }

    /// A slot for a newcomer from `peer` now, a seat to wait for one, or neither.
    pub(super) fn enter(self: &Arc<Self>, peer: IpAddr) -> Entry {
        let mut table = self.table.lock();
        let now = Instant::now();
        table.fold_served(now);
        let turn = table.turn(peer, table.next_seat, now);
        // Not before a waiter ranked first: it would take the slot it waits for.
        if table.first_turn.is_none_or(|first| turn < first)
            && let Some(slot) = self.admit(&mut table, peer, now)
        {
            return Entry::Admitted(slot);
        }
        self.seat(&mut table, peer, turn)
    }

    /// A slot for `peer` by the rule, if there is one.
    fn admit(self: &Arc<Self>, table: &mut Table, peer: IpAddr, now: Instant) -> Option<Slot> {
        if table.holders.len() + eighth(self.cap) < self.cap {
            return Some(self.insert(table, peer, now));
        }
        let holders = table.holders(self.pace, now);
        let decided = admission(&holders, self.cap, self.callers, table.newcomer(peer, now));
        self.apply(table, decided, peer, now)
    }

    /// Carries out what the rule `decided` for `peer`: its slot, if it got one.
    fn apply(
        self: &Arc<Self>,
        table: &mut Table,
        decided: Admission,
        peer: IpAddr,
        now: Instant,
    ) -> Option<Slot> {
        match decided {
            Admission::Free => Some(self.insert(table, peer, now)),
            Admission::Replace(age) => {
                self.evict(table, age, peer);
                Some(self.insert(table, peer, now))
            }
            Admission::Wait => None,
        }
    }

    /// A seat in the waiting room for `peer`, taking the last waiter's when the room is
    /// full and `peer` comes before it.
    fn seat(&self, table: &mut Table, peer: IpAddr, turn: Turn) -> Entry {
        if table.room.len() >= seats(self.cap) {
            let last = match table.last_turn {
                Some(last) => last,
                None => table.room.iter().map(|w| w.turn).max().unwrap_or(turn),
            };
            table.last_turn = Some(last);
            if last <= turn {
                return Entry::Refused;
            }
            if let Some(i) = table.room.iter().position(|w| w.turn == last) {
                // Dropping its sender fails its ticket: its task closes the connection.
                let gone = table.room.swap_remove(i);
                tracing::debug!(peer = %gone.peer, newcomer = %peer, "waiting room full; its last waiter gives up its seat");
            }
            table.last_turn = None;
        }
        let (handoff, ticket) = oneshot::channel();
        table.next_seat += 1;
        table.room.push(Waiter {
            turn,
            peer,
            handoff,
        });
        table.first_turn = Some(table.first_turn.map_or(turn, |first| first.min(turn)));
        table.last_turn = table.last_turn.map(|last| last.max(turn));
        self.signals.changed.notify_one();
        Entry::Waiting(ticket)
    }

    /// Lets waiters in, in turn, while slots or connections that give way are found.
    fn let_waiters_in(self: &Arc<Self>) {
        let mut handed: Vec<(oneshot::Sender<Slot>, Slot)> = Vec::new();
        {
            let mut table = self.table.lock();
            let now = Instant::now();
            table.fold_served(now);
            let mut lines = Lines::new(now);
            let mut room = std::mem::take(&mut table.room);
            // Waiters gone (their deadline passed) never had a slot.
            room.retain(|w| !w.handoff.is_closed());
            // Turns as of now: what peers hold and have used changes while they wait.
            for waiter in &mut room {
                waiter.turn = table.turn_in(&mut lines, waiter.peer, waiter.turn.2);
            }
            room.sort_unstable_by_key(|w| w.turn);
            let mut holders = table.holders_in(&mut lines, self.pace);
            let mut census = Census::of(&holders, self.cap, self.callers);
            // A peer refused once in a pass is refused for all its waiters; after many
            // refused in a row, the rest (later in line) wait for the next pass.
            let mut refused: HashSet<IpAddr> = HashSet::new();
            let mut in_a_row = 0;
            let mut still = Vec::with_capacity(room.len());
            for waiter in room {
                if in_a_row >= REFUSED_IN_A_ROW || refused.contains(&waiter.peer) {
                    still.push(waiter);
                    continue;
                }
                let newcomer = Newcomer {
                    peer: waiter.peer,
                    line: table.line_in(&mut lines, waiter.peer),
                };
                let decided = admit_in(&census, &holders, newcomer);
                match self.apply(&mut table, decided, waiter.peer, now) {
                    Some(slot) => {
                        handed.push((waiter.handoff, slot));
                        holders = table.holders_in(&mut lines, self.pace);
                        census = Census::of(&holders, self.cap, self.callers);
                        in_a_row = 0;
                    }
                    None => {
                        refused.insert(waiter.peer);
                        still.push(waiter);
                        in_a_row += 1;
                    }
                }
            }
            table.first_turn = still.first().map(|w| w.turn);
            table.last_turn = still.last().map(|w| w.turn);
            table.room = still;
        }
        // Outside the lock: a slot whose waiter just gave up is dropped, which locks.
        for (handoff, slot) in handed {
            let _ = handoff.send(slot);
        }
    }

    /// Lets waiters in whenever something changes or [`RECHECK`] passes, until `stop`;
    /// at most once per [`PASS_SPACING`] (changes come with every request that ends).
    pub(super) async fn keep_the_room(self: Arc<Self>, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = self.signals.changed.notified() => {}
                () = tokio::time::sleep(RECHECK) => {}
            }
            self.let_waiters_in();
            tokio::time::sleep(PASS_SPACING).await;
        }
    }

    fn insert(self: &Arc<Self>, table: &mut Table, peer: IpAddr, now: Instant) -> Slot {
        let age = table.next_age;
        table.next_age += 1;
        let activity = Arc::new(Activity::new(peer, self.signals.clone()));
        table.holders.insert(age, activity.clone());
        table.record(peer, now).held += 1;
        table.forget_old_peers(self.cap, now);
        Slot {
            slots: self.clone(),
            age,
            activity,
        }
    }

    fn evict(&self, table: &mut Table, age: u64, newcomer: IpAddr) {
        if let Some(evicted) = table.holders.remove(&age) {
            table.left(&evicted, Instant::now());
            tracing::debug!(
                peer = %evicted.peer,
                phase = ?evicted.holder(age, self.pace, Instant::now()).state,
                %newcomer,
                "connection cap reached; a connection gives up its slot"
            );
            evicted.evicted.cancel();
        }
    }

    /// Whether `peer` may open one more h2 stream: always while the listener has fewer
    /// requests in flight than slots; beyond, only within its fair share of them.
    pub(super) fn admits_stream(&self, peer: IpAddr) -> bool {
        if self.signals.in_flight.load(Ordering::Acquire) < self.cap {
            return true;
        }
        let table = self.table.lock();
        let peers = table.peers.values().filter(|r| r.held > 0).count().max(1);
        let share = (self.cap / peers).max(1);
        let mine: usize = table
            .holders
            .values()
            .filter(|a| a.peer == peer)
            .map(|a| a.in_flight.load(Ordering::Acquire))
            .sum();
        mine < share
    }

    /// Connections holding a slot now.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.table.lock().holders.len()
    }
}

/// A connection's slot, given back when dropped (unless it was taken from it).
pub(super) struct Slot {
    slots: Arc<Slots>,
    age: u64,
    activity: Arc<Activity>,
}

impl Slot {
    pub(super) fn activity(&self) -> &Arc<Activity> {
        &self.activity
    }

    pub(super) fn slots(&self) -> &Arc<Slots> {
        &self.slots
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut table = self.slots.table.lock();
        // An evicted connection's entry is already gone (and its age never reused).
        if table.holders.remove(&self.age).is_some() {
            table.left(&self.activity, Instant::now());
        }
        drop(table);
        self.slots.signals.changed.notify_one();
    }
}

#[cfg(test)]
#[path = "slots_tests.rs"]
mod tests;
