//! The pure rule of `server::slots`: who gives up a slot to a newcomer, over the table
//! of who holds what (the shares, the reserve and the order are described there).

use std::cmp::Reverse;
use std::collections::HashMap;
use std::net::IpAddr;

/// Seats in the waiting room of a listener of `cap` slots: the slots again, and four
/// more per slot or at least 1024 more (a small door, the admin port's 64, meets the same
/// floods as the webhook door). Each waiter holds a file descriptor: a listener holds at
/// most `cap` + this many, each waiter for at most `--handshake-timeout`.
pub(super) fn seats(cap: usize) -> usize {
    cap + (4 * cap).max(1024)
}

/// The reserve, and the share a peer keeps however many compete: an eighth of the cap.
pub(super) fn eighth(cap: usize) -> usize {
    cap / 8
}

/// Who calls a listener, as far as keeping connections goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Callers {
    /// Clients that keep connections open and send requests on them steadily (the API
    /// server, the scheduler): a peer that completed a request lately has standing.
    KeepAlive,
    /// Clients that dial for each request or redial at no cost when closed (kubelet
    /// probes, metric scrapes): no peer has standing, so a flood cannot earn it with one
    /// cheap request per connection and hold every slot with it.
    Redialing,
}

/// What a connection is doing, as far as giving up its slot goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum State {
    /// In its TLS handshake (the server has not finished it; the client may not have
    /// begun it). `young`: connected less than [`YOUNG`] ago.
    Handshake { young: bool },
    /// No request yet: TLS done (or plain HTTP). `young`: connected, or done with its
    /// TLS handshake, less than [`YOUNG`] ago.
    Opening { young: bool },
    /// Has made requests, none in flight (a keep-alive connection between requests).
    /// `young`: its last request ended less than [`YOUNG`] ago.
    Idle { young: bool },
    /// Requests in flight; `starving`: every one of them waits for a body that arrives
    /// behind the rate floor, and has for [`YOUNG`] or more.
    Busy { starving: bool },
    /// Cut for a body too slow: closing.
    Closing,
}

/// One slot holder, as [`admission`] sees it. `age`: lower is older.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Holder {
    pub(super) age: u64,
    pub(super) peer: IpAddr,
    pub(super) state: State,
    /// Completed a request on this connection within [`QUIET`].
    pub(super) served_lately: bool,
    /// Its peer's place in line.
    pub(super) line: Line,
}

/// A newcomer, as [`admission`] sees it: its peer, and that peer's place in line.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Newcomer {
    pub(super) peer: IpAddr,
    pub(super) line: Line,
}

impl From<IpAddr> for Newcomer {
    /// A newcomer of a peer never seen (or long forgotten).
    fn from(peer: IpAddr) -> Newcomer {
        Newcomer {
            peer,
            line: Line::NEVER_SEEN,
        }
    }
}

/// A peer's place in line, as the rule compares two (`server::slots`, `PeerRecord`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Line {
    /// Slot-seconds used lately per request answered, one presumed (lower first).
    pub(super) cost: f64,
    /// Slot-seconds used lately.
    pub(super) used: f64,
}

/// How far apart two peers must stand for one to take the other's connection on loan:
/// flooders alike do not churn each other's.
const CLEARLY: f64 = 2.0;

impl Line {
    /// A peer never seen (or long forgotten).
    pub(super) const NEVER_SEEN: Line = Line {
        cost: super::PRESUMED_COST,
        used: 0.0,
    };

    /// Clearly before `other` in line: less than half its cost per request answered (the
    /// rule asks it of peers not suspect only).
    fn before(self, other: Line) -> bool {
        CLEARLY * self.cost < other.cost
    }

    /// Costs more than a peer never seen: it has held slots and got little or nothing
    /// answered (a flooder's), unlike a kubelet or the API server, however busy.
    fn suspect(self) -> bool {
        self.cost > super::PRESUMED_COST
    }

    /// Clearly behind `other`: more than twice its cost per request answered. Then it
    /// takes none of its connections but worthless ones, whatever their shares (the API
    /// server, after a burst, holds more than its share of connections it is about to
    /// use again).
    fn behind(self, other: Line) -> bool {
        self.cost > CLEARLY * other.cost
    }

    /// Clearly lighter than `other`: `other` has used over twice its slot-seconds lately,
    /// and one more.
    fn lighter(self, other: Line) -> bool {
        other.used > CLEARLY * self.used + 1.0
    }
}

/// What a newcomer gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Admission {
    /// A free slot.
    Free,
    /// The slot of the holder of this age, which closes.
    Replace(u64),
    /// Nothing yet.
    Wait,
}

/// What the table says about its peers, for the rule, with its holders in the orders
/// they give way in (so that each newcomer takes the first it may).
pub(super) struct Census {
    cap: usize,
    /// At a door of [`Callers::Redialing`].
    redialing: bool,
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
    /// The census of `holders` at a listener of `cap` slots; at a door of `callers` that
    /// redial, nobody has standing.
    pub(super) fn of(holders: &[Holder], cap: usize, callers: Callers) -> Census {
        let mut peers: HashMap<IpAddr, PeerCount> = HashMap::new();
        for holder in holders {
            let count = peers.entry(holder.peer).or_default();
            count.held += 1;
            count.standing |= holder.served_lately && callers == Callers::KeepAlive;
        }
        let held_by = |i: usize| peers.get(&holders[i].peer).map_or(0, |c| c.held);
        let mut spare_order: Vec<usize> = (0..holders.len()).collect();
        let mut excess_order: Vec<usize> = (0..holders.len())
            .filter(|&i| at_rest(&holders[i]))
            .collect();
        spare_order.sort_by_key(|&i| (rank(&holders[i]), Reverse(held_by(i)), holders[i].age));
        excess_order.sort_by_key(|&i| (Reverse(held_by(i)), rank(&holders[i]), holders[i].age));
        Census {
            cap: cap.max(1),
            redialing: callers == Callers::Redialing,
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
pub(super) fn admission(
    holders: &[Holder],
    cap: usize,
    callers: Callers,
    newcomer: impl Into<Newcomer>,
) -> Admission {
    admit_in(&Census::of(holders, cap, callers), holders, newcomer.into())
}

pub(super) fn admit_in(census: &Census, holders: &[Holder], newcomer: Newcomer) -> Admission {
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
        .find(|h| {
            h.peer != newcomer.peer
                && census.over_share(h.peer, newcomer.peer)
                && !newcomer.line.behind(h.line)
        })
        .map_or(Admission::Wait, |h| Admission::Replace(h.age))
}

/// Order of giving way: worthless connections (cut, starving, silent), then idle
/// connections, then young handshakes, then (a suspect peer's only) requests whose
/// bodies arrive.
fn rank(holder: &Holder) -> u8 {
    match holder.state {
        State::Closing
        | State::Busy { starving: true }
        | State::Handshake { young: false }
        | State::Opening { young: false } => 0,
        State::Idle { young: false } => 1,
        State::Handshake { young: true }
        | State::Opening { young: true }
        | State::Idle { young: true } => 2,
        State::Busy { starving: false } => 3,
    }
}

/// Whether `holder` has no request in flight whose body arrives.
fn at_rest(holder: &Holder) -> bool {
    holder.state != State::Busy { starving: false }
}

/// Whether `holder` gives way to `newcomer` as a worthless or loaned connection (the
/// module doc's first two kinds).
fn spare_to(holder: &Holder, census: &Census, newcomer: Newcomer, entitled: bool) -> bool {
    let own = holder.peer == newcomer.peer;
    let trusted = census.standing(holder.peer);
    let (mine, theirs) = (newcomer.line, holder.line);
    // A suspect peer takes nothing before its time: flooders do not churn each other's.
    let before = !mine.suspect() && mine.before(theirs);
    let not_behind = !mine.behind(theirs);
    match holder.state {
        State::Closing | State::Busy { starving: true } => true,
        // Work: only a suspect peer's, and only for a newcomer clearly before it (a flood's
        // bodies that stall after a burst do not hold every slot through their first
        // second while a probe waits).
        State::Busy { starving: false } => !own && before && theirs.suspect(),
        // However old, its own client may be about to finish it on a starved machine.
        State::Handshake { young: false } => !own && !trusted,
        State::Opening { young: false } => own || !trusted,
        State::Idle { young: false } => !own && !trusted && (before || entitled && not_behind),
        // A connection just come (in its handshake, or its request not yet begun) is
        // judged once it is a second old, unless the newcomer's peer stands clearly
        // before its own and its own is suspect (a kubelet probe, or the API server's
        // next connection, does not wait a second for a flooder's sockets, reopened as
        // soon as closed, to grow old; nobody cuts a probe or a review just come).
        State::Handshake { young: true } | State::Opening { young: true } => {
            !own && !trusted && before && theirs.suspect()
        }
        // A keep-alive connection whose request just ended: to a newcomer clearly before
        // its peer (flooders alike do not churn each other's); at a door of redialing
        // callers, where a connection cut costs its caller a redial, also to one below
        // its share and clearly lighter (a probe does not wait for scrapes sent back to
        // back to pause).
        State::Idle { young: true } => {
            let lighter = census.redialing && entitled && !mine.suspect() && mine.lighter(theirs);
            !own && !trusted && (before || lighter)
        }
    }
}
