#![allow(clippy::unwrap_used)]
use super::*;
use crate::quota::ModelAmounts;
use crate::quota::pending::{ChargeId, Entry};
use crate::quota::status::tests::{T, quota};
use crate::quota::status::{Direction, reconciled_status, with_charges};

fn used(quota: &GPUQuota) -> Milli {
    Milli::parse(&quota.status.as_ref().unwrap().used["T4"].0).unwrap()
}

fn at(second: CreatedSecond) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(second).unwrap()
}

fn take(id: &str, amount: u64) -> GrantWrite<'_> {
    GrantWrite::Take {
        id,
        model: "T4",
        amount: Milli(amount),
        until: T + LIFE.as_secs() as i64,
    }
}

/// What a reconciler writes into `used` when it sees `pods` pods of 1 GPU created in
/// second `T`.
fn reconciled_used(quota: &GPUQuota, pods: u64, now: CreatedSecond) -> Milli {
    let usage: ModelAmounts = [("T4".to_string(), Milli(pods * 1000))].into();
    let seen = |created, model: &str| match (created, model) {
        (T, "T4") => Milli(pods * 1000),
        _ => Milli(0),
    };
    let status = reconciled_status(quota, &usage, seen, |_, _| false, at(now)).unwrap();
    let mut updated = quota.clone();
    updated.status = Some(status);
    used(&updated)
}

#[test]
fn a_grant_is_used_from_its_take_and_settles_into_pending_totals() {
    let quota = quota("1", &[]);
    let taken = with_grant_writes(&quota, &[take("r1.1", 2000)]).unwrap();
    assert_eq!(used(&taken), Milli(3000), "held room is used");
    assert_eq!(find(&taken, "r1.1").unwrap().unwrap().amount, Milli(2000));
    // One pod admitted from it in second T; the rest is still held.
    let admitted = [(T, Milli(1000), 1)];
    let settle = GrantWrite::Settle {
        id: "r1.1",
        admitted: &admitted,
        give_back: Milli(0),
    };
    let moved = with_grant_writes(&taken, &[settle]).unwrap();
    assert_eq!(used(&moved), Milli(3000), "moving a charge changes no use");
    assert_eq!(find(&moved, "r1.1").unwrap().unwrap().amount, Milli(1000));
    let status = moved.status.as_ref().unwrap();
    assert_eq!((status.pending.len(), status.pending[0].pods), (1, 1));
    // The rest given back: the grant goes, and its room with it.
    let settle = GrantWrite::Settle {
        id: "r1.1",
        admitted: &[],
        give_back: Milli(1000),
    };
    let returned = with_grant_writes(&moved, &[settle]).unwrap();
    assert_eq!(used(&returned), Milli(2000));
    assert!(returned.status.as_ref().unwrap().grants.is_empty());
}

#[test]
fn settling_a_grant_that_lapsed_changes_nothing() {
    let quota = quota("1", &[]);
    let admitted = [(T, Milli(1000), 1)];
    let settle = GrantWrite::Settle {
        id: "gone",
        admitted: &admitted,
        give_back: Milli(500),
    };
    let after = with_grant_writes(&quota, &[settle]).unwrap();
    assert_eq!(after.status, quota.status);
}

#[test]
fn other_charges_leave_a_grant_alone() {
    let taken = with_grant_writes(&quota("0", &[]), &[take("r1.1", 2000)]).unwrap();
    let entry: Entry<'_> = ("T4", Milli(1000), T, ChargeId::None);
    let charged = with_charges(&taken, &[entry], Direction::Add).unwrap();
    assert_eq!(used(&charged), Milli(3000));
    assert_eq!(find(&charged, "r1.1").unwrap().unwrap().amount, Milli(2000));
}

/// The exactness argument at the lowest layer: a pod admitted from a grant and seen by a
/// reconciler before its holder moved the charge counts twice (pod and grant), never
/// zero times, even beside an unseen pod charged the usual way in the same second; once
/// moved it counts once; a grant left behind by a dead holder counts until a pending
/// total's lifetime after its `until`, then is dropped.
#[test]
fn a_pod_admitted_from_a_grant_is_never_counted_less_than_once() {
    // Second T: pod x charged through a pending total (not seen yet), pod g admitted
    // from grant r1.1 (2 GPUs held) and already seen.
    let quota = quota("3", &[(T, "1", 1)]);
    let held = with_grant_writes(&quota, &[take("r1.1", 2000)]).unwrap();
    let now = T + 1;
    // Counted: g as a pod, x through the total (less the seen g: 0), the grant's 2.
    assert_eq!(reconciled_used(&held, 1, now), Milli(3000), "x + g ≤ 3");
    let admitted = [(T, Milli(1000), 1)];
    let settle = GrantWrite::Settle {
        id: "r1.1",
        admitted: &admitted,
        give_back: Milli(0),
    };
    let moved = with_grant_writes(&held, &[settle]).unwrap();
    // g once as a pod, x through the total (2 less the seen 1), 1 still held.
    assert_eq!(reconciled_used(&moved, 1, now), Milli(3000));
    // x shows up: both pods, and what is still held.
    assert_eq!(reconciled_used(&moved, 2, now), Milli(3000));
    // The holder died: its grant counts until it lapses, then is dropped.
    let until = T + LIFE.as_secs() as i64;
    let ttl = PENDING_TTL.as_secs() as i64;
    assert_eq!(reconciled_used(&moved, 2, until + ttl - 1), Milli(3000));
    let late = reconciled_used(&moved, 2, until + ttl);
    assert_eq!(late, Milli(2000), "the two pods alone");
}

#[test]
fn an_unreadable_grant_is_named() {
    let mut quota = with_grant_writes(&quota("0", &[]), &[take("r1.1", 1000)]).unwrap();
    quota.status.as_mut().unwrap().grants[0].until = "soon".into();
    let error = live(&quota, T).unwrap_err();
    assert!(error.reason.contains("status.grants[0]"), "{error}");
    assert!(error.reason.contains("soon"), "{error}");
}
