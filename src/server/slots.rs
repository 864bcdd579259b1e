//! Who holds a listener's connection slots, who gives one up when a newcomer arrives at
//! the cap, and in what order waiting newcomers get in.
//!
//! A listener holds at most `max_connections` connections, and no peer (IP address) may
//! keep most of them while others want them. [`admission`] is the pure rule, over the
//! table of who holds what; [`Slots`] keeps the table, the waiting room, and tells a
//! connection whose slot was taken to close through its [`Activity`].
//!
//! **Shares.** A peer's *fair share* is the cap over the peers competing (those holding
//! slots and the newcomer's), at least one slot. A peer below it is *entitled*: admitting it
//! keeps it within its share. A peer is *over its share* when it holds more than its fair
//! share and more than an eighth of the cap: the eighth is what a peer keeps however many
//! addresses compete, so a flood from hundreds of addresses does not make the API server's
//! keep-alive pool (tens of connections) an excess to be cut.
//!
//! **Free slots.** The last eighth of the slots (the *reserve*) is only for entitled peers:
//! a peer holding most of the listener, or the flood of one address, never fills it, so a
//! kubelet probe or the API server's next connection always finds room.
//!
//! **At the cap** a newcomer takes the slot of a connection worth less than its own
//! arrival, the first found in this order:
//!
//! 1. *worthless*, of any peer: a connection cut for a body too slow, a request whose body
//!    has been behind the rate floor (`server::pace`) for [`YOUNG`] or more, a silent
//!    socket (no request within [`YOUNG`] of connecting, or of the end of a TLS handshake
//!    that took longer), a TLS handshake under way for [`YOUNG`] or more. A peer that
//!    completed a request within [`QUIET`] has *standing* (the API server sending
//!    reviews): its slow handshakes and quiet openings are trusted, and only its own
//!    newcomers take its silent openings (a flood from one address pays with its own);
//! 2. for an entitled newcomer: an idle keep-alive connection of a peer without standing
//!    (a flooder's that made one request; the pool of an API server with nothing to ask
//!    for a while, which it dials again when it has), then a handshake younger than
//!    [`YOUNG`] of a peer without standing that has held over twice the slot-seconds the
//!    newcomer's has lately (a kubelet probe does not wait for a flooder's sockets, reopened
//!    as soon as closed, to grow old; flooders do not churn each other's);
//! 3. for an entitled newcomer: a connection with no request in flight of a peer over its
//!    share, the peer holding the most first: silent ones, idle ones, young ones.
//!
//! Within each, the peer holding the most gives way first, then the oldest connection.
//! Never taken: a request whose body arrives (an admission review cut short is a pod not
//! created); a connection of a peer with standing, within its share, that is idle or in
//! its handshake. And a newcomer never takes its own peer's handshake still in TLS
//! (however old: a starved server finishes its client's handshakes late), its young
//! opening, or its idle keep-alive connection: the API server, given a burst of reviews,
//! dials many connections at once and sends its next review on any connection it holds;
//! cutting one for another of its own gains it nothing and fails a review ("write:
//! connection reset by peer" in the end-to-end suite).
//!
//! **Waiting.** A newcomer that finds no slot waits in the listener's waiting room, in its
//! own task, bounded by its opening deadline. Whenever a slot frees, a request ends or time
//! passes ([`RECHECK`]), waiters are let in in turn: the peer holding the fewest slots
//! first, then the peer that has used the fewest lately (slot-seconds held, and a tenth of
//! one per connection that ended without a request answered whole, each weighing less as
//! it recedes over [`USE_MEMORY`]: a kubelet whose probes hold a slot a millisecond each
//! goes before a flooder whose sockets hold theirs for seconds, or are reopened as soon as
//! closed), then the oldest. The room
//! has [`seats`]: enough for the API server's bursts (hundreds of connections at once) and
//! for the floods it meets, so that a flooder's surplus waits its turn (and its deadline)
//! instead of being closed and reopened thousands of times a second, with honest
//! connections queued behind them in the kernel's backlog. A full room gives the seat of
//! its last waiter in turn to a newcomer ranked before it; a newcomer ranked last is
//! closed.
//!
//! **Requests in flight.** As many as slots before fairness applies; beyond, a peer may
//! open a new h2 stream only within its fair share of them ([`Slots::admits_stream`]).

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;

use super::pace::{Pace, Progress};

/// How long a connection that has made no request yet counts as a handshake under way
/// rather than a silent socket, from its connect and again from the end of its TLS
/// handshake (an honest client sends its first request within milliseconds of either;
/// the opening deadline, `--handshake-timeout`, is 3 s). Also how long a request body
/// may be behind the rate floor before its connection counts as worthless.
pub const YOUNG: Duration = Duration::from_secs(1);

/// How long a peer keeps its standing after it last completed a request (its body
/// whole, answered): the API server sending a review every few hundred milliseconds
/// always has it; a flooder whose connections made one request loses it.
pub const QUIET: Duration = Duration::from_secs(2);

/// How often the waiting room is looked at besides when a slot frees or a request ends:
/// a young handshake grows old, and a peer loses its standing, without telling anyone.
const RECHECK: Duration = Duration::from_millis(50);

/// Least time between two passes over the waiting room.
const PASS_SPACING: Duration = Duration::from_millis(5);

/// Seats in the waiting room of a listener of `cap` slots: the slots again, and four
/// more per slot or at least 1024 more (a small door, the admin port's 64, meets the same
/// floods as the webhook door). Each waiter holds a file descriptor: a listener holds at
/// most `cap` + this many, each waiter for at most `--handshake-timeout`.
pub fn seats(cap: usize) -> usize {
    cap + (4 * cap).max(1024)
}

/// The reserve, and the share a peer keeps however many compete: an eighth of the cap.
fn eighth(cap: usize) -> usize {
    cap / 8
}

/// What a connection is doing, as far as giving up its slot goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// In its TLS handshake (the server has not finished it; the client may not have
    /// begun it). `young`: connected less than [`YOUNG`] ago.
    Handshake { young: bool },
    /// No request yet: TLS done (or plain HTTP). `young`: connected, or done with its
    /// TLS handshake, less than [`YOUNG`] ago.
    Opening { young: bool },
    /// Has made requests, none in flight (a keep-alive connection between requests).
    Idle,
    /// Requests in flight; `starving`: every one of them waits for a body that arrives
    /// behind the rate floor, and has for [`YOUNG`] or more.
    Busy { starving: bool },
    /// Cut for a body too slow: closing.
    Closing,
}

/// One slot holder, as [`admission`] sees it. `age`: lower is older.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Holder {
    pub age: u64,
    pub peer: IpAddr,
    pub state: State,
    /// Completed a request on this connection within [`QUIET`].
    pub served_lately: bool,
    /// Slot-seconds its peer has held lately (see [`USE_MEMORY`]).
    pub peer_used: f64,
}

/// A newcomer, as [`admission`] sees it: its peer, and the slot-seconds that peer has
/// held lately.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Newcomer {
    pub peer: IpAddr,
    pub used: f64,
}

impl From<IpAddr> for Newcomer {
    /// A newcomer of a peer that has held nothing lately.
    fn from(peer: IpAddr) -> Newcomer {
        Newcomer { peer, used: 0.0 }
    }
}

/// What a newcomer gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// A free slot.
    Free,
    /// The slot of the holder of this age, which closes.
    Replace(u64),
    /// Nothing yet.
    Wait,
}

/// What the table says about its peers, for the rule, with its holders in the orders
/// they give way in (so that each newcomer takes the first it may).
struct Census {
    cap: usize,
    held: usize,
    peers: HashMap<IpAddr, PeerCount>,
    /// Indices of the holders that may give way (see [`rank`]), by (rank, the peer
    /// holding the most first, the oldest first): the order of spare connections.
    spare_order: Vec<usize>,
    /// The same by (the peer holding the most first, rank, the oldest first): the order
    /// in which peers over their share give up connections.
    excess_order: Vec<usize>,
}

#[derive(Default)]
struct PeerCount {
    held: usize,
    standing: bool,
}

impl Census {
    fn of(holders: &[Holder], cap: usize) -> Census {
        let mut peers: HashMap<IpAddr, PeerCount> = HashMap::new();
        for holder in holders {
            let count = peers.entry(holder.peer).or_default();
            count.held += 1;
            count.standing |= holder.served_lately;
        }
        let held_by = |i: usize| peers.get(&holders[i].peer).map_or(0, |c| c.held);
        let mut spare_order: Vec<usize> = (0..holders.len())
            .filter(|&i| rank(&holders[i]).is_some())
            .collect();
        let mut excess_order = spare_order.clone();
        spare_order.sort_by_key(|&i| (rank(&holders[i]), Reverse(held_by(i)), holders[i].age));
        excess_order.sort_by_key(|&i| (Reverse(held_by(i)), rank(&holders[i]), holders[i].age));
        Census {
            cap: cap.max(1),
            held: holders.len(),
            peers,
            spare_order,
            excess_order,
        }
    }

    fn held_by(&self, peer: IpAddr) -> usize {
        self.peers.get(&peer).map_or(0, |count| count.held)
    }

    fn standing(&self, peer: IpAddr) -> bool {
        self.peers.get(&peer).is_some_and(|count| count.standing)
    }

    /// The cap over the peers competing (holders and `newcomer`'s), at least one slot.
    fn fair_share(&self, newcomer: IpAddr) -> f64 {
        let competing = self.peers.len() + usize::from(!self.peers.contains_key(&newcomer));
        (self.cap as f64 / competing as f64).max(1.0)
    }

    /// Whether one more connection keeps `newcomer` within its fair share.
    fn entitled(&self, newcomer: IpAddr) -> bool {
        (self.held_by(newcomer) + 1) as f64 <= self.fair_share(newcomer)
    }

    /// Whether `peer` is over its share (see the module doc), `newcomer` competing.
    fn over_share(&self, peer: IpAddr, newcomer: IpAddr) -> bool {
        let kept = self.fair_share(newcomer).max(eighth(self.cap) as f64);
        self.held_by(peer) as f64 > kept
    }
}

/// The rule: what `newcomer` gets from a listener of `cap` slots held by `holders` (see
/// the module doc).
pub fn admission(holders: &[Holder], cap: usize, newcomer: impl Into<Newcomer>) -> Admission {
    admit_in(&Census::of(holders, cap), holders, newcomer.into())
}

fn admit_in(census: &Census, holders: &[Holder], newcomer: Newcomer) -> Admission {
    let cap = census.cap;
    let entitled = census.entitled(newcomer.peer);
    if census.held + eighth(cap) < cap || (census.held < cap && entitled) {
        return Admission::Free;
    }
    let spare = census
        .spare_order
        .iter()
        .map(|&i| &holders[i])
        .find(|h| spare_to(h, census, newcomer, entitled));
    if let Some(holder) = spare {
        return Admission::Replace(holder.age);
    }
    if !entitled {
        return Admission::Wait;
    }
    census
        .excess_order
        .iter()
        .map(|&i| &holders[i])
        .find(|h| h.peer != newcomer.peer && census.over_share(h.peer, newcomer.peer))
        .map_or(Admission::Wait, |h| Admission::Replace(h.age))
}

/// Order of giving way: worthless connections (cut, starving, silent), then idle
/// connections, then young handshakes; requests whose bodies arrive never.
fn rank(holder: &Holder) -> Option<u8> {
    match holder.state {
        State::Closing
        | State::Busy { starving: true }
        | State::Handshake { young: false }
        | State::Opening { young: false } => Some(0),
        State::Idle => Some(1),
        State::Handshake { young: true } | State::Opening { young: true } => Some(2),
        State::Busy { starving: false } => None,
    }
}

/// Whether `holder` gives way to `newcomer` as a worthless or unproven connection (the
/// module doc's first two kinds).
fn spare_to(holder: &Holder, census: &Census, newcomer: Newcomer, entitled: bool) -> bool {
    let own = holder.peer == newcomer.peer;
    let trusted = census.standing(holder.peer);
    match holder.state {
        State::Closing | State::Busy { starving: true } => true,
        State::Busy { starving: false } => false,
        // However old, its own client may be about to finish it on a starved machine.
        State::Handshake { young: false } => !own && !trusted,
        State::Opening { young: false } => own || !trusted,
        State::Idle => entitled && !own && !trusted,
        // A handshake under way is judged once it is a second old, unless its peer has
        // held far more than the newcomer's lately (a kubelet probe does not wait a second
        // for a flooder's sockets, reopened as soon as closed, to grow old).
        State::Handshake { young: true } | State::Opening { young: true } => {
            let heavier = holder.peer_used > 2.0 * newcomer.used + 1.0;
            entitled && !own && !trusted && heavier
        }
    }
}

/// What a newcomer gets from [`Slots::enter`].
pub enum Entry {
    /// A slot, now.
    Admitted(Slot),
    /// A seat in the waiting room: the slot comes through the ticket, or the ticket
    /// fails when the seat was given to a newcomer ranked before it.
    Waiting(oneshot::Receiver<Slot>),
    /// The waiting room is full of newcomers ranked before this one: close it.
    Refused,
}

/// The slot table and waiting room of one listener.
pub struct Slots {
    cap: usize,
    pace: Pace,
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

/// How long a peer's use of slots is remembered when waiters take turns.
const USE_MEMORY: Duration = Duration::from_secs(10);

/// What a connection that ended without a request answered whole (a silent socket, a
/// body too slow or never read, a newcomer refused or timed out waiting) adds to its
/// peer's use when waiters take turns, in slot-seconds: as much as holding a slot a tenth
/// of a second. A flooder whose sockets are closed as soon as they come, and reopened at
/// once, uses the door as much as one that holds them; a kubelet's probes, each answered,
/// add nothing but the milliseconds they hold. (Not counted when judging whose young
/// handshake gives way: that is by slots held alone.)
const WASTE_WEIGHT: f64 = 0.1;

/// What a peer holds now, and has held and wasted lately.
struct PeerRecord {
    held: usize,
    /// Slot-seconds held, each second's weight decaying over [`USE_MEMORY`], as of
    /// `updated`.
    held_secs: f64,
    /// Connections that ended without a request answered whole, each weighing less as it
    /// recedes alike, as of `updated`.
    wasted: f64,
    updated: Instant,
}

impl PeerRecord {
    fn new(now: Instant) -> PeerRecord {
        PeerRecord {
            held: 0,
            held_secs: 0.0,
            wasted: 0.0,
            updated: now,
        }
    }

    /// How much of what was counted at `updated` still counts at `now`.
    fn kept(&self, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        (-elapsed / USE_MEMORY.as_secs_f64()).exp()
    }

    /// Slot-seconds held lately, as of `now`.
    fn held_secs_at(&self, now: Instant) -> f64 {
        let kept = self.kept(now);
        self.held_secs * kept + self.held as f64 * USE_MEMORY.as_secs_f64() * (1.0 - kept)
    }

    /// Its use of the door lately, as of `now`: slot-seconds held, and connections wasted.
    fn used_at(&self, now: Instant) -> f64 {
        self.held_secs_at(now) + WASTE_WEIGHT * self.wasted * self.kept(now)
    }

    /// Brings the counts to `now`, then holds `held`.
    fn set_held(&mut self, held: usize, now: Instant) {
        self.wasted *= self.kept(now);
        self.held_secs = self.held_secs_at(now);
        self.updated = now;
        self.held = held;
    }
}

/// Order in which waiters are let in, lower first: slots held, use lately (in
/// thousandths of a slot-second), seat.
type Turn = (usize, u64, u64);

impl Table {
    fn turn(&self, peer: IpAddr, seat: u64, now: Instant) -> Turn {
        let record = self.peers.get(&peer);
        let used = record.map_or(0.0, |r| r.used_at(now));
        (record.map_or(0, |r| r.held), (used * 1e3) as u64, seat)
    }

    fn holders(&self, pace: Pace, now: Instant) -> Vec<Holder> {
        self.holders
            .iter()
            .map(|(&age, activity)| Holder {
                peer_used: self.held_secs(activity.peer, now),
                ..activity.holder(age, pace, now)
            })
            .collect()
    }

    /// Slot-seconds `peer` has held lately.
    fn held_secs(&self, peer: IpAddr, now: Instant) -> f64 {
        self.peers.get(&peer).map_or(0.0, |r| r.held_secs_at(now))
    }

    fn newcomer(&self, peer: IpAddr, now: Instant) -> Newcomer {
        Newcomer {
            peer,
            used: self.held_secs(peer, now),
        }
    }

    /// Forgets peers that hold nothing and have held little lately, once there are many.
    fn forget_old_peers(&mut self, cap: usize, now: Instant) {
        let many = 4 * cap + 64;
        if self.peers.len() <= many {
            return;
        }
        self.peers
            .retain(|_, r| r.held > 0 || r.used_at(now) > 0.01);
        if self.peers.len() > many {
            self.peers.retain(|_, r| r.held > 0);
        }
    }

    /// Counts a connection of `peer` that ended without a request answered whole.
    fn wasted(&mut self, peer: IpAddr, now: Instant) {
        let record = self
            .peers
            .entry(peer)
            .or_insert_with(|| PeerRecord::new(now));
        record.set_held(record.held, now);
        record.wasted += 1.0;
    }

    /// A holder of `peer` leaves the table; `served`: it had a request answered whole.
    fn left(&mut self, peer: IpAddr, served: bool, now: Instant) {
        self.held(peer, now, |held| held.saturating_sub(1));
        if !served {
            self.wasted(peer, now);
        }
    }

    fn held(&mut self, peer: IpAddr, now: Instant, change: impl FnOnce(usize) -> usize) {
        let record = self
            .peers
            .entry(peer)
            .or_insert_with(|| PeerRecord::new(now));
        record.set_held(change(record.held), now);
    }
}

impl Slots {
    pub fn new(cap: usize, pace: Pace) -> Arc<Slots> {
        Arc::new(Slots {
            cap: cap.max(1),
            pace,
            table: Mutex::new(Table::default()),
            signals: Arc::new(Signals {
                in_flight: AtomicUsize::new(0),
                changed: Notify::new(),
            }),
        })
    }

    pub fn pace(&self) -> Pace {
        self.pace
    }

    /// A slot for a newcomer from `peer` now, a seat to wait for one, or neither.
    pub fn enter(self: &Arc<Self>, peer: IpAddr) -> Entry {
        let mut table = self.table.lock();
        let now = Instant::now();
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
        let decided = admission(&holders, self.cap, table.newcomer(peer, now));
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
                table.wasted(peer, Instant::now());
                return Entry::Refused;
            }
            if let Some(i) = table.room.iter().position(|w| w.turn == last) {
                // Dropping its sender fails its ticket: its task closes the connection.
                let gone = table.room.swap_remove(i);
                table.wasted(gone.peer, Instant::now());
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
            let mut room = std::mem::take(&mut table.room);
            // Waiters gone (their deadline passed) never had a slot.
            for gone in room.iter().filter(|w| w.handoff.is_closed()) {
                let peer = gone.peer;
                table.wasted(peer, now);
            }
            room.retain(|w| !w.handoff.is_closed());
            // Turns as of now: what peers hold and have used changes while they wait.
            for waiter in &mut room {
                waiter.turn = table.turn(waiter.peer, waiter.turn.2, now);
            }
            room.sort_unstable_by_key(|w| w.turn);
            let mut holders = table.holders(self.pace, now);
            let mut census = Census::of(&holders, self.cap);
            // A peer refused once in a pass is refused for all its waiters.
            let mut refused: HashSet<IpAddr> = HashSet::new();
            let mut still = Vec::with_capacity(room.len());
            for waiter in room {
                if refused.contains(&waiter.peer) {
                    still.push(waiter);
                    continue;
                }
                let decided = admit_in(&census, &holders, table.newcomer(waiter.peer, now));
                match self.apply(&mut table, decided, waiter.peer, now) {
                    Some(slot) => {
                        handed.push((waiter.handoff, slot));
                        holders = table.holders(self.pace, now);
                        census = Census::of(&holders, self.cap);
                    }
                    None => {
                        refused.insert(waiter.peer);
                        still.push(waiter);
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
    pub async fn keep_the_room(self: Arc<Self>, stop: CancellationToken) {
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
        table.held(peer, now, |held| held + 1);
        table.forget_old_peers(self.cap, now);
        Slot {
            slots: self.clone(),
            age,
            activity,
        }
    }

    fn evict(&self, table: &mut Table, age: u64, newcomer: IpAddr) {
        if let Some(evicted) = table.holders.remove(&age) {
            table.left(evicted.peer, evicted.has_served(), Instant::now());
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
    pub fn admits_stream(&self, peer: IpAddr) -> bool {
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
    pub fn held(&self) -> usize {
        self.table.lock().holders.len()
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

    pub fn slots(&self) -> &Arc<Slots> {
        &self.slots
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut table = self.slots.table.lock();
        // An evicted connection's entry is already gone (and its age never reused).
        if table.holders.remove(&self.age).is_some() {
            let (peer, served) = (self.activity.peer, self.activity.has_served());
            table.left(peer, served, Instant::now());
        }
        drop(table);
        self.slots.signals.changed.notify_one();
    }
}

/// One connection's requests: whether it has made one, which are in flight, when the
/// last one ended and was last served whole; and whether it must give up its slot.
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
    /// The requests in flight and how their bodies arrive.
    requests: Mutex<Vec<Arc<Progress>>>,
    /// Milliseconds after `started` when a request last ended.
    last_done: AtomicU64,
    /// One more than the milliseconds after `started` when a request last completed
    /// with its body whole (0: never).
    last_served: AtomicU64,
    /// Cancelled when a newcomer took this connection's slot: close it.
    evicted: CancellationToken,
    /// Cancelled when a request body arrived too slowly: close it.
    too_slow: CancellationToken,
    signals: Arc<Signals>,
}

impl Activity {
    fn new(peer: IpAddr, signals: Arc<Signals>) -> Self {
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
            evicted: CancellationToken::new(),
            too_slow: CancellationToken::new(),
            signals,
        }
    }

    pub fn peer(&self) -> IpAddr {
        self.peer
    }

    fn holder(&self, age: u64, pace: Pace, now: Instant) -> Holder {
        let served = self.last_served.load(Ordering::Acquire);
        let since =
            |ms: u64| now.saturating_duration_since(self.started + Duration::from_millis(ms));
        Holder {
            age,
            peer: self.peer,
            state: self.state(
                pace,
                now,
                since(self.handshake_ended.load(Ordering::Acquire)) < YOUNG,
            ),
            served_lately: served > 0 && since(served - 1) < QUIET,
            peer_used: 0.0,
        }
    }

    fn state(&self, pace: Pace, now: Instant, young: bool) -> State {
        if self.too_slow.is_cancelled() {
            State::Closing
        } else if self.in_flight.load(Ordering::Acquire) > 0 {
            let requests = self.requests.lock();
            let starving = !requests.is_empty() && requests.iter().all(|p| p.starving(pace, now));
            State::Busy { starving }
        } else if self.requested.load(Ordering::Acquire) {
            State::Idle
        } else if self.handshaking.load(Ordering::Acquire) {
            State::Handshake { young }
        } else {
            State::Opening { young }
        }
    }

    /// Whether the connection is in its TLS handshake (set around the handshake).
    pub fn set_handshaking(&self, handshaking: bool) {
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
    pub fn has_requested(&self) -> bool {
        self.requested.load(Ordering::Acquire)
    }

    /// Whether a request on this connection was answered with its body whole.
    fn has_served(&self) -> bool {
        self.last_served.load(Ordering::Acquire) > 0
    }

    /// Resolves when a newcomer has taken this connection's slot.
    pub async fn evicted(&self) {
        self.evicted.cancelled().await
    }

    /// Resolves when a request body arrived too slowly: the connection gives up its slot.
    pub async fn too_slow(&self) {
        self.too_slow.cancelled().await
    }

    /// Marks the connection as cut for a body too slow (`server::pace`).
    pub fn cut_for_slowness(&self) {
        self.too_slow.cancel();
        self.signals.changed.notify_one();
    }

    /// A request begins; `progress` follows its body.
    pub fn begin(self: &Arc<Self>, progress: Arc<Progress>) -> InFlight {
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
pub struct InFlight {
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

#[cfg(test)]
#[path = "slots_tests.rs"]
mod tests;
