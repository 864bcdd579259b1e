//! The slot rule (`admission`) on tables written out, and the table and waiting room
//! (`Slots`) with real connections' activities.

use super::*;
use crate::server::pace::Progress;

fn ip(last: u8) -> IpAddr {
    IpAddr::from([10, 0, 0, last])
}

/// A holder that connected long ago, has no standing, doing `state`, of a peer never
/// seen before (its cost presumed).
fn holder(age: u64, peer: u8, state: State) -> Holder {
    Holder {
        age,
        peer: ip(peer),
        state,
        served_lately: false,
        line: Line::NEVER_SEEN,
    }
}

/// A keep-alive connection between requests of a peer that sends them (standing).
fn in_use(age: u64, peer: u8) -> Holder {
    Holder {
        served_lately: true,
        ..holder(age, peer, State::Idle { young: false })
    }
}

const SILENT: State = State::Handshake { young: false };
const YOUNG_TLS: State = State::Handshake { young: true };
const OPENING: State = State::Opening { young: false };
const YOUNG_OPENING: State = State::Opening { young: true };
const BUSY: State = State::Busy { starving: false };
const STARVING: State = State::Busy { starving: true };

/// The callers of the webhook door: the API server keeps its connections.
const KEEP: Callers = Callers::KeepAlive;

/// A newcomer from an address that holds nothing.
const STRANGER: u8 = 200;
/// The API server, in the tables below.
const API: u8 = 1;

/// `count` holders of `peer` from age `first`, doing `state`.
fn many(first: u64, count: u64, peer: u8, state: State) -> Vec<Holder> {
    (first..first + count)
        .map(|age| holder(age, peer, state))
        .collect()
}

/// The API server's keep-alive pool of `count`, in use.
fn api_pool(first: u64, count: u64) -> Vec<Holder> {
    (first..first + count).map(|age| in_use(age, API)).collect()
}

#[test]
fn below_the_reserve_anyone_gets_a_free_slot_and_in_it_only_peers_below_their_share() {
    // 16 slots, a reserve of 2: beside the API server's connection, a flooder holding 12
    // gets the 13th, not the 14th.
    let mut holders = vec![holder(0, API, BUSY)];
    holders.extend(many(1, 12, 9, SILENT));
    assert_eq!(admission(&holders, 16, KEEP, ip(9)), Admission::Free);
    holders.push(holder(13, 9, SILENT));
    assert_eq!(admission(&holders, 16, KEEP, ip(9)), Admission::Wait);
    // A probe holding nothing is below its share: it takes one of the reserve.
    assert_eq!(admission(&holders, 16, KEEP, ip(STRANGER)), Admission::Free);
    // Alone at the listener, its fair share is every slot: the API server's burst fills it.
    let burst = many(0, 15, API, YOUNG_TLS);
    assert_eq!(admission(&burst, 16, KEEP, ip(API)), Admission::Free);
}

#[test]
fn a_flooder_from_one_address_never_takes_another_peers_connection_in_use() {
    // 600 connections from one address against 256 slots: its own handshakes stay (a
    // handshake is never cut for its own peer), and the API server's pool is not its to
    // take, idle or just dialled.
    let mut holders = api_pool(0, 19);
    holders.push(holder(19, API, YOUNG_TLS));
    holders.extend(many(20, 236, 9, SILENT));
    assert_eq!(admission(&holders, 256, KEEP, ip(9)), Admission::Wait);
    // Idle after one request, its own idle ones stay too.
    let mut idle = api_pool(0, 20);
    idle.extend((20..256).map(|age| in_use(age, 9)));
    assert_eq!(admission(&idle, 256, KEEP, ip(9)), Admission::Wait);
    // The API server's newcomer takes the flooder's oldest silent socket...
    assert_eq!(
        admission(&holders, 256, KEEP, ip(API)),
        Admission::Replace(20)
    );
    // ...and, its connections in use being no less, the flooder's oldest idle one.
    assert_eq!(admission(&idle, 256, KEEP, ip(API)), Admission::Replace(20));
}

#[test]
fn requests_in_flight_are_cut_only_when_their_bodies_starve_or_their_peer_is_suspect() {
    let holders = [holder(0, 9, BUSY), holder(1, 9, BUSY)];
    assert_eq!(admission(&holders, 2, KEEP, ip(STRANGER)), Admission::Wait);
    let holders = [holder(0, 9, BUSY), holder(1, 9, STARVING)];
    assert_eq!(
        admission(&holders, 2, KEEP, ip(STRANGER)),
        Admission::Replace(1)
    );
    // Its own peer's newcomer too: a starving request is worth nothing to anyone.
    assert_eq!(admission(&holders, 2, KEEP, ip(9)), Admission::Replace(1));
    // A body that arrives is cut only for a peer suspect (holding slots with nothing
    // answered), and only for a newcomer clearly before it: the API server's.
    let api = Newcomer {
        peer: ip(API),
        line: API_LINE,
    };
    let busy = [holder(0, 9, BUSY), holder(1, 9, BUSY)];
    assert_eq!(admission(&busy, 2, KEEP, api), Admission::Wait);
    let suspect = busy.map(|h| Holder { line: FLOODER, ..h });
    assert_eq!(admission(&suspect, 2, KEEP, api), Admission::Replace(0));
    assert_eq!(admission(&suspect, 2, KEEP, flooder()), Admission::Wait);
}

#[test]
fn slow_bodies_from_many_addresses_give_way_before_the_api_servers_pool() {
    // 200 addresses, two slow bodies each, against 256 slots beside the API server's 20.
    let mut holders = api_pool(0, 20);
    let mut age = 20;
    for peer in 0..118u8 {
        for state in [STARVING, BUSY] {
            holders.push(holder(age, 10 + peer, state));
            age += 1;
        }
    }
    assert_eq!(holders.len(), 256);
    // A flooder's newcomer (its peer holds one) takes a starving one, the oldest.
    assert_eq!(
        admission(&holders, 256, KEEP, ip(10)),
        Admission::Replace(20)
    );
    // With none starving yet, a newcomer waits (a young handshake is judged at a second
    // old): the API server's pool is not its to take.
    for h in holders.iter_mut().filter(|h| h.state == STARVING) {
        h.state = BUSY;
    }
    holders[255].state = YOUNG_TLS;
    assert_eq!(
        admission(&holders, 256, KEEP, ip(STRANGER)),
        Admission::Wait
    );
    holders[255].state = SILENT;
    assert_eq!(
        admission(&holders, 256, KEEP, ip(STRANGER)),
        Admission::Replace(255)
    );
}

#[test]
fn an_idle_flood_from_many_addresses_gives_way_once_its_peers_are_quiet() {
    let mut holders = api_pool(0, 20);
    holders.extend((20..256).map(|age| in_use(age, (age % 180) as u8 + 10)));
    // Each flooding address made its one request lately: nothing is spare, and the API
    // server, within the eighth a peer keeps, is nobody's excess.
    assert_eq!(
        admission(&holders, 256, KEEP, ip(STRANGER)),
        Admission::Wait
    );
    // Quiet since: their idle connections give way, the API server's stays.
    for h in holders.iter_mut().skip(20) {
        h.served_lately = false;
    }
    assert_eq!(
        admission(&holders, 256, KEEP, ip(STRANGER)),
        Admission::Replace(20)
    );
}

#[test]
fn a_young_handshake_gives_way_to_a_newcomer_clearly_before_its_peer_in_line() {
    // Sixteen addresses reopening sockets as soon as they are closed, each holding one
    // slot for the last ten seconds: a probe (a peer never seen, holding nothing) does
    // not wait for their youngest to grow old...
    let holders = reopening(YOUNG_TLS);
    assert_eq!(
        admission(&holders, 16, KEEP, ip(STRANGER)),
        Admission::Replace(0)
    );
    // ...but the flooders do not churn each other's.
    assert_eq!(admission(&holders, 16, KEEP, flooder()), Admission::Wait);
    // Nor is the young handshake of a peer with standing (the API server redialling) taken.
    let mut trusted = holders.clone();
    trusted[0].served_lately = true;
    trusted[1] = Holder {
        peer: trusted[0].peer,
        ..trusted[1]
    };
    assert_eq!(
        admission(&trusted, 16, KEEP, ip(STRANGER)),
        Admission::Replace(2)
    );
    // At a door of callers that redial, a request earns no standing.
    let redialing = Callers::Redialing;
    assert_eq!(
        admission(&trusted, 16, redialing, ip(STRANGER)),
        Admission::Replace(0)
    );
}

/// A flooding address in line that has held a slot for the last ten seconds (reopening
/// its sockets as soon as they are closed) and got nothing answered.
const FLOODER: Line = Line {
    cost: PRESUMED_COST + 10.0,
    used: 10.0,
};

/// Sixteen such addresses, each holding one slot in `state`.
fn reopening(state: State) -> Vec<Holder> {
    (0..16u8)
        .map(|i| Holder {
            line: FLOODER,
            ..holder(u64::from(i), 10 + i, state)
        })
        .collect()
}

/// A newcomer of another such address.
fn flooder() -> Newcomer {
    Newcomer {
        peer: ip(9),
        line: FLOODER,
    }
}

#[test]
fn a_connection_whose_request_just_ended_gives_way_only_to_a_peer_clearly_before_its_own() {
    // Sixteen addresses, each holding one keep-alive connection whose one request ended
    // just now, at a door where that earns no standing: a probe does not wait for them...
    let holders = reopening(State::Idle { young: true });
    let redialing = Callers::Redialing;
    assert_eq!(
        admission(&holders, 16, redialing, ip(STRANGER)),
        Admission::Replace(0)
    );
    // ...but the flooders do not churn each other's...
    assert_eq!(
        admission(&holders, 16, redialing, flooder()),
        Admission::Wait
    );
    // ...until a second has passed: then any newcomer below its share takes the oldest.
    let quiet: Vec<Holder> = holders
        .iter()
        .map(|h| Holder {
            state: State::Idle { young: false },
            ..*h
        })
        .collect();
    assert_eq!(
        admission(&quiet, 16, redialing, flooder()),
        Admission::Replace(0)
    );
}

#[test]
fn a_peer_over_its_share_gives_up_connections_it_uses_to_peers_below_theirs() {
    // Two peers at 64 slots: a flooder holding 60 connections it uses, the API server 4.
    let mut holders = many(0, 4, API, BUSY);
    holders.extend((4..64).map(|age| in_use(age, 9)));
    assert_eq!(
        admission(&holders, 64, KEEP, ip(API)),
        Admission::Replace(4)
    );
    assert_eq!(
        admission(&holders, 64, KEEP, ip(STRANGER)),
        Admission::Replace(4)
    );
    // The flooder's own newcomer waits.
    assert_eq!(admission(&holders, 64, KEEP, ip(9)), Admission::Wait);
    // At equal shares, neither takes the other's.
    let mut even = many(0, 32, API, BUSY);
    even.extend((32..64).map(|age| in_use(age, 9)));
    assert_eq!(admission(&even, 64, KEEP, ip(API)), Admission::Wait);
}

#[test]
fn of_a_peer_over_its_share_silent_sockets_go_first_then_idle_then_young() {
    // Peer 9 has standing (its requests in flight complete), and holds the whole table.
    let young = holder(0, 9, YOUNG_TLS);
    let idle = in_use(1, 9);
    let silent = holder(2, 9, OPENING);
    let table = |mut holders: Vec<Holder>| {
        holders.extend((10..15).map(|age| Holder {
            served_lately: true,
            ..holder(age, 9, BUSY)
        }));
        holders
    };
    let take = |holders: Vec<Holder>| admission(&holders, holders.len(), KEEP, ip(STRANGER));
    assert_eq!(
        take(table(vec![young, idle, silent])),
        Admission::Replace(2)
    );
    assert_eq!(take(table(vec![young, idle])), Admission::Replace(1));
    assert_eq!(take(table(vec![young])), Admission::Replace(0));
}

#[test]
fn a_newcomer_never_cuts_its_own_peers_young_handshake_or_idle_connection() {
    // The API server (no standing yet) dials many connections at once in a burst.
    let holders = [
        holder(0, API, BUSY),
        holder(1, API, YOUNG_OPENING),
        holder(2, API, YOUNG_OPENING),
    ];
    assert_eq!(
        admission(&holders, 3, KEEP, ip(API)),
        Admission::Wait,
        "its own"
    );
    assert_eq!(
        admission(&holders, 3, KEEP, ip(2)),
        Admission::Replace(1),
        "another peer may take one"
    );
    // Grown old without a request, a connection is a silent socket: its own peer's
    // newcomer takes it (a flood from one address pays with its own).
    let holders = [holder(0, API, OPENING), holder(1, API, YOUNG_OPENING)];
    assert_eq!(admission(&holders, 2, KEEP, ip(API)), Admission::Replace(0));
    // Its idle keep-alive connection is never its own newcomer's.
    let holders = [in_use(0, API), holder(1, API, State::Idle { young: false })];
    assert_eq!(admission(&holders, 2, KEEP, ip(API)), Admission::Wait);
}

#[test]
fn a_newcomer_never_cuts_its_own_peers_handshake_still_in_tls_however_old() {
    // On a starved machine the server finishes a handshake late; its client has
    // already written a review on it.
    let holders = [holder(0, API, SILENT), holder(1, API, YOUNG_OPENING)];
    assert_eq!(admission(&holders, 2, KEEP, ip(API)), Admission::Wait);
    assert_eq!(
        admission(&holders, 2, KEEP, ip(2)),
        Admission::Replace(0),
        "another peer may"
    );
    // Unless that client has standing: then it is the API server's on a starved
    // machine, not a flooder's.
    let mut trusted = vec![
        Holder {
            served_lately: true,
            ..holder(0, API, SILENT)
        },
        holder(1, API, BUSY),
    ];
    trusted.extend(many(2, 14, 9, BUSY));
    assert_eq!(admission(&trusted, 16, KEEP, ip(2)), Admission::Wait);
}

#[test]
fn a_slow_handshake_that_just_ended_is_young_again_until_its_first_request_is_due() {
    // Accepted two seconds ago: past YOUNG, a silent socket if TLS were done.
    let mut activity = Activity::new(ip(1), detached_signals());
    activity.started -= YOUNG * 2;
    activity.set_handshaking(true);
    let now = Instant::now();
    let in_tls = activity.holder(0, PACE, now);
    assert_eq!(in_tls.state, State::Handshake { young: false });
    // The server ends the handshake now: its client's request is due from now.
    activity.set_handshaking(false);
    let done = activity.holder(0, PACE, Instant::now());
    assert_eq!(done.state, State::Opening { young: true });
    assert_eq!(admission(&[done], 1, KEEP, ip(1)), Admission::Wait);
}

const PACE: Pace = Pace {
    floor: 240,
    window: Duration::from_secs(2),
    whole: Duration::from_secs(15),
};

fn detached_signals() -> Arc<Signals> {
    Arc::new(Signals {
        in_flight: AtomicUsize::new(0),
        changed: Notify::new(),
    })
}

/// Waits (bounded) for `entry`'s slot.
async fn slot_of(entry: Entry) -> Slot {
    match entry {
        Entry::Admitted(slot) => slot,
        Entry::Waiting(ticket) => tokio::time::timeout(Duration::from_secs(10), ticket)
            .await
            .expect("let in in time")
            .expect("the seat was kept"),
        Entry::Refused => panic!("refused"),
    }
}

/// A listener's table of keep-alive callers with its waiting room kept.
fn slots(cap: usize) -> (Arc<Slots>, tokio_util::sync::DropGuard) {
    slots_for(cap, Callers::KeepAlive)
}

fn slots_for(cap: usize, callers: Callers) -> (Arc<Slots>, tokio_util::sync::DropGuard) {
    let slots = Slots::new(cap, PACE, callers);
    let stop = CancellationToken::new();
    tokio::spawn(slots.clone().keep_the_room(stop.clone()));
    (slots, stop.drop_guard())
}

#[tokio::test]
async fn a_newcomer_waits_for_its_own_connections_and_others_do_not() {
    let (slots, _keeper) = slots(2);
    let api_a = slot_of(slots.enter(ip(1))).await;
    let api_b = slot_of(slots.enter(ip(1))).await;
    let Entry::Waiting(ticket) = slots.enter(ip(1)) else {
        panic!("its own newcomer waits");
    };
    let waiting = tokio::spawn(slot_of(Entry::Waiting(ticket)));
    tokio::time::sleep(RECHECK * 2).await;
    assert!(!waiting.is_finished());
    // One handshake ends in a request, answered: an idle connection of its own peer,
    // which its client may use again at any moment, is not cut either.
    drop(api_b.activity().begin(Progress::new(PACE, true)));
    tokio::time::sleep(RECHECK * 2).await;
    assert!(!waiting.is_finished(), "still waiting");
    assert!(!api_b.activity().evicted.is_cancelled());
    // Its client closes that connection: the slot goes to the newcomer.
    drop(api_b);
    let newcomer = waiting.await.expect("no panic");
    assert!(!api_a.activity().evicted.is_cancelled());
    // A stranger is not made to wait: it takes the oldest young handshake.
    let Entry::Admitted(_stranger) = slots.enter(ip(STRANGER)) else {
        panic!("a stranger is admitted at once");
    };
    assert!(api_a.activity().evicted.is_cancelled());
    drop(newcomer);
}

#[tokio::test]
async fn at_the_cap_with_every_request_in_flight_a_newcomer_waits_for_one_to_end() {
    let (slots, _keeper) = slots(1);
    let busy = slot_of(slots.enter(ip(1))).await;
    // A request whose body never came whole (answered 408): no standing earned.
    let request = busy.activity().begin(Progress::new(PACE, false));
    let Entry::Waiting(ticket) = slots.enter(ip(2)) else {
        panic!("nobody may give way");
    };
    let waiting = tokio::spawn(slot_of(Entry::Waiting(ticket)));
    tokio::time::sleep(RECHECK * 2).await;
    assert!(!waiting.is_finished());
    drop(request);
    let newcomer = waiting.await.expect("no panic");
    assert!(busy.activity().evicted.is_cancelled());
    assert_eq!(
        newcomer.activity().state(PACE, Instant::now(), true),
        State::Opening { young: true }
    );
}

#[tokio::test]
async fn at_the_cap_a_newcomer_takes_a_slot_and_the_victim_is_told() {
    let (slots, _keeper) = slots(2);
    let flood_a = slot_of(slots.enter(ip(9))).await;
    let flood_b = slot_of(slots.enter(ip(9))).await;
    let honest = slot_of(slots.enter(ip(1))).await;
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
async fn waiters_are_let_in_the_peer_holding_fewest_first_and_a_full_room_drops_the_last() {
    let (slots, _keeper) = slots(2);
    let busy: Vec<Slot> = vec![
        slot_of(slots.enter(ip(9))).await,
        slot_of(slots.enter(ip(9))).await,
    ];
    // Requests whose bodies never come whole: the flooder gets nothing answered.
    let requests: Vec<InFlight> = busy
        .iter()
        .map(|s| s.activity().begin(Progress::new(PACE, false)))
        .collect();
    // The flooder's newcomers fill the room...
    let mut flood = Vec::new();
    for _ in 0..seats(2) {
        let Entry::Waiting(ticket) = slots.enter(ip(9)) else {
            panic!("a seat while the room has one");
        };
        flood.push(ticket);
    }
    // ...its next is refused; a probe holding nothing takes the last waiter's seat.
    assert!(matches!(slots.enter(ip(9)), Entry::Refused));
    let Entry::Waiting(probe) = slots.enter(ip(STRANGER)) else {
        panic!("a probe waits, ranked first");
    };
    let last = flood.pop().expect("waiters");
    assert!(last.await.is_err(), "the last waiter gave up its seat");
    // A request ends: the probe gets the slot, not the flooder's first waiter.
    drop(requests);
    let probe = slot_of(Entry::Waiting(probe)).await;
    assert_eq!(probe.activity().peer(), ip(STRANGER));
    drop((busy, flood));
}

#[tokio::test]
async fn at_a_door_of_redialing_callers_a_request_earns_no_standing() {
    // Two slots, two addresses each holding one connection whose request was answered.
    for callers in [Callers::KeepAlive, Callers::Redialing] {
        let (slots, _keeper) = slots_for(2, callers);
        let first = slot_of(slots.enter(ip(1))).await;
        let second = slot_of(slots.enter(ip(2))).await;
        for slot in [&first, &second] {
            drop(slot.activity().begin(Progress::new(PACE, true)));
        }
        // Their requests just ended: a stranger waits either way.
        let Entry::Waiting(early) = slots.enter(ip(STRANGER)) else {
            panic!("{callers:?}: a connection whose request just ended stays");
        };
        drop(early);
        // A second on, still within the standing a request earns: only where the callers
        // keep their connections is it kept.
        tokio::time::sleep(YOUNG + RECHECK).await;
        let entry = slots.enter(ip(STRANGER));
        match callers {
            Callers::KeepAlive => assert!(matches!(entry, Entry::Waiting(_))),
            Callers::Redialing => {
                assert!(matches!(entry, Entry::Admitted(_)));
                assert!(
                    first.activity().evicted.is_cancelled(),
                    "the oldest gave way"
                );
            }
        }
    }
}

#[tokio::test]
async fn a_peer_beyond_its_share_of_requests_in_flight_may_not_open_more_streams() {
    let (slots, _keeper) = slots(4);
    let flooder = slot_of(slots.enter(ip(9))).await;
    let probe = slot_of(slots.enter(ip(STRANGER))).await;
    let mut streams: Vec<InFlight> = Vec::new();
    while slots.admits_stream(ip(9)) {
        streams.push(flooder.activity().begin(Progress::new(PACE, false)));
        assert!(streams.len() <= 4, "bounded");
    }
    // Four requests in flight on four slots: the flooder's share is two of them.
    assert_eq!(streams.len(), 4);
    assert!(slots.admits_stream(ip(STRANGER)));
    streams.truncate(2);
    assert!(slots.admits_stream(ip(9)));
    drop(probe);
}

/// The API server in line holding twenty keep-alive connections (a burst's) for the last
/// 30 s, for fourteen reviews a second; a few connections cost a fraction of this.
const API_LINE: Line = Line {
    cost: 1.5,
    used: 600.0,
};

#[test]
fn a_peer_costs_its_use_per_request_answered_so_the_api_server_stands_before_any_flood() {
    let now = Instant::now();
    let record = |held, held_secs, wasted, served| PeerRecord {
        held,
        held_secs,
        wasted,
        served,
        updated: now,
    };
    // Twenty connections held for the last 30 s, 14 reviews a second answered.
    let api = record(20, 600.0, 0.0, 420.0).cost_at(now);
    assert!(api <= API_LINE.cost, "{api}");
    // Three probes answered lately, each holding a slot a millisecond.
    let kubelet = record(0, 0.003, 0.0, 3.0).cost_at(now);
    assert!(kubelet < api, "{kubelet}");
    // A silent socket held for ten seconds, reopened three times; a connection idle for
    // ten seconds after one request; a hundred sockets closed as soon as they came.
    let floods = [
        record(1, 10.0, 3.0, 0.0),
        record(1, 10.0, 0.0, 1.0),
        record(0, 0.1, 100.0, 0.0),
    ];
    for flood in floods.map(|r| r.cost_at(now)) {
        assert!(2.0 * api < flood, "{api} against {flood}");
    }
    // A peer never seen stands clearly behind the API server, and answers earn its place.
    assert!(2.0 * api < PRESUMED_COST);
    let answered = record(0, 0.0, 0.0, 4.0).cost_at(now);
    assert!(answered < PRESUMED_COST / 4.0, "{answered}");
}

#[test]
fn a_flood_from_hundreds_of_addresses_does_not_make_the_table_forget_the_kubelet() {
    // A door of 64 slots remembers some 320 peers. The kubelet, between probes, holds
    // nothing; 400 flooding addresses hold nothing either at the moment (in the waiting
    // room, or reopening) but have held slots and got nothing answered.
    let now = Instant::now();
    let mut table = Table::default();
    let kubelet = ip(1);
    table.record(kubelet, now).served = 3.0;
    table.record(kubelet, now).held_secs = 0.003;
    for i in 0..400u32 {
        let flooder = IpAddr::from([127, 10, (i >> 8) as u8, i as u8]);
        let record = table.record(flooder, now);
        record.held_secs = 1.0;
        record.wasted = 1.0;
    }
    table.forget_old_peers(64, now);
    assert!(
        table.peers.len() <= 4 * 64 + 64,
        "{} peers",
        table.peers.len()
    );
    let line = table.line_in(&mut Lines::new(now), kubelet);
    assert!(
        line.cost < PRESUMED_COST / 2.0,
        "the kubelet forgotten: {line:?}"
    );
}

#[test]
fn the_api_servers_newcomer_takes_a_flooders_connection_whatever_the_number_of_addresses() {
    // 64 slots: the API server's 4 (its reviews answered lately: standing), 60 addresses
    // a connection each, idle after TLS or after one request, young or not.
    let idle_young = State::Idle { young: true };
    let idle_old = State::Idle { young: false };
    for state in [YOUNG_OPENING, OPENING, idle_young, idle_old] {
        let mut holders: Vec<Holder> = (0..4)
            .map(|age| Holder {
                line: API_LINE,
                ..in_use(age, API)
            })
            .collect();
        holders.extend((4..64u8).map(|i| Holder {
            line: FLOODER,
            ..holder(u64::from(i), 10 + i, state)
        }));
        let api = Newcomer {
            peer: ip(API),
            line: API_LINE,
        };
        assert_eq!(
            admission(&holders, 64, KEEP, api),
            Admission::Replace(4),
            "{state:?}"
        );
        // Another flooding address does not churn a young one.
        if state == YOUNG_OPENING || state == idle_young {
            assert_eq!(admission(&holders, 64, KEEP, flooder()), Admission::Wait);
        }
    }
}

#[test]
fn the_api_server_over_its_share_keeps_its_idle_connections_from_peers_behind_it() {
    // After a burst, the API server (quiet for two seconds: no standing) holds 20 idle
    // connections of a door of 64, over an eighth; 44 flooding addresses hold the rest.
    let mut holders: Vec<Holder> = (0..20)
        .map(|age| Holder {
            line: API_LINE,
            ..holder(age, API, State::Idle { young: false })
        })
        .collect();
    holders.extend((20..64u8).map(|i| Holder {
        line: FLOODER,
        ..holder(u64::from(i), 10 + i, BUSY)
    }));
    // A flooding address's newcomer, or one never seen, stands behind it: neither takes
    // one of its connections (one never seen may take a flooder's).
    for newcomer in [flooder(), Newcomer::from(ip(STRANGER))] {
        let taken = admission(&holders, 64, KEEP, newcomer);
        assert!(
            !matches!(taken, Admission::Replace(age) if age < 20),
            "{taken:?}"
        );
    }
    // A newcomer clearly before it in line takes one.
    let cheap = Newcomer {
        peer: ip(STRANGER),
        line: Line {
            cost: API_LINE.cost / 4.0,
            used: 0.0,
        },
    };
    assert_eq!(admission(&holders, 64, KEEP, cheap), Admission::Replace(0));
}

#[tokio::test]
async fn the_api_servers_next_connection_waits_before_a_flood_from_many_addresses() {
    let (slots, _keeper) = slots(8);
    // The API server's one connection, its reviews answered.
    let api = slot_of(slots.enter(ip(API))).await;
    for _ in 0..20 {
        drop(api.activity().begin(Progress::new(PACE, true)));
    }
    // Seven addresses hold the other slots with requests in flight (nothing gives way),
    // and forty more addresses wait.
    let mut flood = Vec::new();
    let mut in_flight = Vec::new();
    for i in 0..7 {
        let slot = slot_of(slots.enter(ip(10 + i))).await;
        // One request answered each (no address is suspect), one in flight.
        drop(slot.activity().begin(Progress::new(PACE, true)));
        in_flight.push(slot.activity().begin(Progress::new(PACE, false)));
        flood.push(slot);
    }
    let mut waiting = Vec::new();
    for i in 0..40 {
        let Entry::Waiting(ticket) = slots.enter(ip(20 + i)) else {
            panic!("a flooder waits");
        };
        waiting.push(ticket);
    }
    // The API server's next connection (a burst) waits too, seated last...
    let Entry::Waiting(ticket) = slots.enter(ip(API)) else {
        panic!("nothing gives way yet");
    };
    // ...and when a flooder's request ends, its slot goes to the API server first.
    drop(in_flight.pop());
    let newcomer = tokio::time::timeout(Duration::from_secs(5), ticket)
        .await
        .expect("let in in time")
        .expect("the seat was kept");
    assert_eq!(newcomer.activity().peer(), ip(API));
    drop((flood, waiting, api));
}

#[test]
fn a_probe_just_come_is_nobodys_to_cut_and_at_the_admin_port_takes_a_heavy_peers_idle_one() {
    // 16 slots: a probe just connected; scrapers from three addresses, asking back to
    // back (each answered: cheap per request, heavy in slot-seconds), hold the rest.
    let scraper = Line {
        cost: 0.01,
        used: 150.0,
    };
    // A kubelet probing often on a starved machine, its probes holding slots a while.
    let kubelet = Line {
        cost: 0.5,
        used: 15.0,
    };
    let mut holders = vec![Holder {
        line: kubelet,
        ..holder(0, STRANGER, YOUNG_OPENING)
    }];
    holders.extend((1..16u8).map(|i| Holder {
        line: scraper,
        ..holder(u64::from(i), 20 + i % 3, State::Idle { young: true })
    }));
    let redialing = Callers::Redialing;
    // Neither a scraper's newcomer, cheaper per request, nor an address never seen,
    // lighter, cuts the probe's connection.
    let newcomer = Newcomer {
        peer: ip(20),
        line: scraper,
    };
    assert_eq!(
        admission(&holders, 16, redialing, newcomer),
        Admission::Wait
    );
    holders[1..].iter_mut().for_each(|h| h.state = BUSY);
    assert_eq!(
        admission(&holders, 16, redialing, ip(9)),
        Admission::Wait,
        "a stranger"
    );
    // The next probe, below its share and far lighter, takes a scraper's connection
    // between requests at the admin port, where a cut connection is a redial...
    holders[1..]
        .iter_mut()
        .for_each(|h| h.state = State::Idle { young: true });
    holders[0].state = BUSY;
    let probe = Newcomer {
        peer: ip(STRANGER),
        line: Line {
            used: 0.5,
            ..kubelet
        },
    };
    assert_eq!(
        admission(&holders, 16, redialing, probe),
        Admission::Replace(1)
    );
    // ...not at the webhook door, where it may be a review failed.
    assert_eq!(admission(&holders, 16, KEEP, probe), Admission::Wait);
}
