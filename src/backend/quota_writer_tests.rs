#![allow(clippy::unwrap_used)]
use super::*;
use crate::placement::quantity::Milli;
use crate::quota::UntypedPods;
use crate::quota::status::tests::{T, quota};
use crate::quota::status::views_with_status;
use std::collections::BTreeSet;

fn ask(amount: u64, dry_run: bool) -> Ask {
    Ask {
        wanted: WantedModels::one("T4"),
        costs: Costs::from_charges(vec![("T4".into(), [("T4".into(), Milli(amount))].into())]),
        rules: AdmitRules {
            untyped: UntypedPods::Allow,
            quota_required: false,
        },
        created: T,
        charge_id: None,
        dry_run,
    }
}

fn waiting(amount: u64, dry_run: bool) -> (PendingWrite, oneshot::Receiver<Answer>) {
    let (reply, answer) = oneshot::channel();
    (
        PendingWrite {
            ask: ask(amount, dry_run),
            reply,
            grantable: true,
            arrived: std::time::Instant::now(),
        },
        answer,
    )
}

fn answered(receiver: &mut oneshot::Receiver<Answer>) -> Option<ChargeOutcome> {
    receiver.try_recv().ok().map(|a| a.unwrap())
}

#[test]
fn a_round_decides_in_arrival_order_each_seeing_the_ones_before() {
    // 4 GPUs, 3 used: of three 1-GPU pods the first gets the room, the others are over.
    let (a, mut a_answer) = waiting(1000, false);
    let (b, mut b_answer) = waiting(1000, false);
    let (c, mut c_answer) = waiting(1000, false);
    let mut views = views_with_status(&[quota("3", &[])]).unwrap();
    let (decided, retry) =
        decide_round("team-a", &mut views, vec![a, b, c], true, &BTreeSet::new());
    assert_eq!(decided.len(), 1);
    assert!(retry.is_empty());
    assert_eq!(answered(&mut a_answer), None, "answered once written");
    for answer in [&mut b_answer, &mut c_answer] {
        let denial = answered(answer).unwrap();
        assert!(
            matches!(denial, ChargeOutcome::Denied(Denial::Exceeded(_))),
            "{denial:?}"
        );
    }
}

#[test]
fn a_denial_on_a_copy_that_may_be_stale_is_tried_again_fresh() {
    let (a, mut a_answer) = waiting(2000, false);
    let mut views = views_with_status(&[quota("3", &[])]).unwrap();
    let (decided, retry) = decide_round("team-a", &mut views, vec![a], false, &BTreeSet::new());
    assert!(decided.is_empty());
    assert_eq!(retry.len(), 1);
    assert_eq!(answered(&mut a_answer), None);
}

#[test]
fn a_dry_run_is_answered_without_a_write_and_takes_no_room() {
    let (dry, mut dry_answer) = waiting(1000, true);
    let (real, _real_answer) = waiting(1000, false);
    let mut views = views_with_status(&[quota("3", &[])]).unwrap();
    let (decided, _) = decide_round(
        "team-a",
        &mut views,
        vec![dry, real],
        true,
        &BTreeSet::new(),
    );
    assert_eq!(
        answered(&mut dry_answer),
        Some(ChargeOutcome::Charged { over: vec![] })
    );
    assert_eq!(decided.len(), 1, "the real one still fits");
}

/// While grants hold room of the key a pod is short of, a denial on fresh data waits for
/// them to come back (their holders give back what they do not use), and is given once it
/// has waited its bound; grants of another key do not hold it up.
#[test]
fn a_denial_waits_on_grants_for_a_bound() {
    let (other, mut other_answer) = waiting(2000, false);
    let mut views = views_with_status(&[quota("3", &[])]).unwrap();
    let elsewhere = BTreeSet::from(["A100"]);
    let (_, retry) = decide_round("team-a", &mut views, vec![other], true, &elsewhere);
    assert!(retry.is_empty());
    assert!(matches!(
        answered(&mut other_answer),
        Some(ChargeOutcome::Denied(_))
    ));
    let (a, mut a_answer) = waiting(2000, false);
    let mut views = views_with_status(&[quota("3", &[])]).unwrap();
    let granted = BTreeSet::from(["T4"]);
    let (decided, retry) = decide_round("team-a", &mut views, vec![a], true, &granted);
    assert!(decided.is_empty());
    assert_eq!(answered(&mut a_answer), None, "waits");
    let mut late = retry;
    late[0].arrived -= GRANT_WAIT;
    let (_, retry) = decide_round("team-a", &mut views, late, true, &granted);
    assert!(retry.is_empty());
    assert!(matches!(
        answered(&mut a_answer),
        Some(ChargeOutcome::Denied(_))
    ));
}
