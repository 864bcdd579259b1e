#![allow(clippy::unwrap_used)]
use super::*;
use crate::cache::Projection;
use crate::config::Config;
use crate::placement::models::WantedModels;
use crate::quota::status::tests::quota;
use crate::quota::{AdmitRules, Costs, UntypedPods};

/// Whether a pod of team-a wanting `amount` of a T4, created in second `created`, is
/// admitted from a grant.
fn admits(grants: &Grants, cache: &CacheWriter, amount: u64, created: CreatedSecond) -> bool {
    let wanted = WantedModels::one("T4");
    let costs = Costs::from_charges(vec![("T4".into(), [("T4".into(), Milli(amount))].into())]);
    let rules = AdmitRules {
        untyped: UntypedPods::Allow,
        quota_required: false,
    };
    grants.admit(cache, "team-a", (&wanted, &costs, rules), created)
}

/// A client that is never called: these tests stop short of the keeper's writes.
fn client() -> Client {
    let config = kube::Config::new("https://127.0.0.1:9".parse().unwrap());
    Client::try_from(config).unwrap()
}

/// Quota `default` of team-a (4 T4, `used` as given, `edit`ed) in a cache, and grants
/// holding `remaining` of it for this replica.
fn holding(used: &str, remaining: u64, edit: impl Fn(&mut GPUQuota)) -> (Arc<Grants>, CacheWriter) {
    let cache = CacheWriter::in_memory(Projection::from_config(&Config::default()));
    let mut quota = quota(used, &[]);
    edit(&mut quota);
    cache.write(|state| state.apply_quota(quota));
    let grants = Grants::new(client());
    let held = Held {
        quota: "default".into(),
        model: "T4".into(),
        id: "r.1".into(),
        until: now_second() + grant::LIFE.as_secs() as i64,
        remaining: Milli(remaining),
        admitted: BTreeMap::new(),
        last_used: Instant::now(),
        unit: Milli(1000),
        taken: Milli(remaining),
        renewed: false,
        closing: false,
    };
    let ns = Namespace {
        held: vec![held],
        keeper: true, // as if running: these tests drive `plan` themselves
        ..Namespace::default()
    };
    grants.namespaces.lock().insert("team-a".into(), ns);
    (grants, cache)
}

fn admitted_from(grants: &Grants) -> (Milli, u32) {
    let namespaces = grants.namespaces.lock();
    let held = &namespaces["team-a"].held[0];
    let totals = held.admitted.values();
    totals.fold((Milli(0), 0), |(a, p), (b, q)| (Milli(a.0 + b.0), p + q))
}

#[tokio::test]
async fn admissions_come_out_of_the_grant_until_it_is_used_up() {
    // 4 GPUs, 3 used of which 2 are our grant: two 1-GPU pods fit in it, a third does not.
    let (grants, cache) = holding("3", 2000, |_| {});
    let now = now_second();
    for _ in 0..2 {
        assert!(admits(&grants, &cache, 1000, now));
    }
    assert!(!admits(&grants, &cache, 1000, now));
    assert_eq!(admitted_from(&grants), (Milli(2000), 2));
    // A pod bigger than what is left never comes out of it either.
    let (grants, cache) = holding("3", 2000, |_| {});
    assert!(!admits(&grants, &cache, 3000, now));
}

#[tokio::test]
async fn a_grant_covers_nothing_that_must_be_decided_on_the_ledger() {
    let now = now_second();
    let warn = |q: &mut GPUQuota| q.spec.on_exceed = OnExceed::Warn;
    let cohort = |q: &mut GPUQuota| q.spec.cohort = Some("research".into());
    for (what, edit) in [
        ("Warn", &warn as &dyn Fn(&mut GPUQuota)),
        ("cohort", &cohort),
    ] {
        let (grants, cache) = holding("2", 2000, edit);
        assert!(
            !admits(&grants, &cache, 1000, now),
            "a {what} quota's charge is written"
        );
        assert_eq!(admitted_from(&grants), (Milli(0), 0));
    }
}

#[tokio::test]
async fn a_grant_near_its_end_or_being_given_back_admits_nothing() {
    let now = now_second();
    let (grants, cache) = holding("2", 2000, |_| {});
    grants.namespaces.lock().get_mut("team-a").unwrap().held[0].until =
        now + grant::MARGIN.as_secs() as i64;
    assert!(!admits(&grants, &cache, 1000, now));
    let (grants, cache) = holding("2", 2000, |_| {});
    grants.namespaces.lock().get_mut("team-a").unwrap().held[0].closing = true;
    assert!(!admits(&grants, &cache, 1000, now));
}

/// The keeper moves what was admitted into the pending totals; what is admitted while
/// that write is out stays to be moved next time, and an idle grant is given back whole.
#[tokio::test]
async fn the_keeper_moves_what_was_admitted_and_gives_back_what_idles() {
    let (grants, cache) = holding("3", 2000, |_| {});
    let now = now_second();
    assert!(admits(&grants, &cache, 1000, now));
    let plans = grants.plan("team-a").unwrap();
    assert_eq!(plans.len(), 1);
    let (id, moved, give_back) = &plans[0].settles[0];
    assert_eq!((id.as_str(), give_back), ("r.1", &Milli(0)));
    assert_eq!(moved, &vec![(now, Milli(1000), 1)]);
    // Admitted while the write is out: not in this write.
    assert!(admits(&grants, &cache, 500, now));
    grants.settled("team-a", &plans[0], Ok(vec![]));
    assert_eq!(admitted_from(&grants), (Milli(500), 1));
    // Idle: given back with what is left, and what is admitted still moved.
    grants.namespaces.lock().get_mut("team-a").unwrap().held[0].last_used = Instant::now() - IDLE;
    let plans = grants.plan("team-a").unwrap();
    let (_, moved, give_back) = &plans[0].settles[0];
    assert_eq!(
        (moved.clone(), *give_back),
        (vec![(now, Milli(500), 1)], Milli(500))
    );
    assert!(
        plans[0].takes.is_empty(),
        "an idle grant is not taken again"
    );
    grants.settled("team-a", &plans[0], Ok(vec![]));
    assert!(grants.namespaces.lock()["team-a"].held.is_empty());
    assert!(grants.plan("team-a").is_none(), "the keeper ends");
}

#[tokio::test]
async fn a_grant_running_low_is_given_back_and_taken_again() {
    let (grants, cache) = holding("3", 1500, |_| {});
    assert!(admits(&grants, &cache, 1000, now_second()));
    let plans = grants.plan("team-a").unwrap();
    assert_eq!(
        plans[0].settles[0].2,
        Milli(500),
        "the half GPU left goes back"
    );
    assert_eq!(plans[0].takes.len(), 1, "and a new grant is taken");
}

#[tokio::test]
async fn a_write_that_may_have_been_stored_abandons_its_grants() {
    let (grants, cache) = holding("3", 2000, |_| {});
    assert!(admits(&grants, &cache, 1000, now_second()));
    let plans = grants.plan("team-a").unwrap();
    grants.settled("team-a", &plans[0], Err(Lost::Unwritten));
    assert_eq!(
        admitted_from(&grants),
        (Milli(1000), 1),
        "kept to try again"
    );
    grants.settled("team-a", &plans[0], Err(Lost::Unsure));
    assert!(grants.namespaces.lock()["team-a"].held.is_empty());
    assert!(!admits(&grants, &cache, 1000, now_second()));
}

#[tokio::test]
async fn a_waiting_denial_makes_the_grants_go_back_and_none_be_taken() {
    let (grants, cache) = holding("3", 2000, |_| {});
    grants.yield_to_denial(&cache, "team-a");
    let plans = grants.plan("team-a").unwrap();
    assert_eq!(plans[0].settles[0].2, Milli(2000));
    let views = views_with_status(&[quota("3", &[])]).unwrap();
    let charge: ModelAmounts = [("T4".to_string(), Milli(1000))].into();
    grants.wanted(&cache, "team-a", &views, &charge);
    assert!(grants.namespaces.lock()["team-a"].wanted.is_empty());
}

#[tokio::test]
async fn a_grant_is_a_share_of_the_room_left_in_whole_charges() {
    let take = |used: &str| {
        let t = Take {
            id: "r.2".into(),
            model: "T4".into(),
            unit: Milli(100),
            until: 0,
        };
        take_amount(&quota(used, &[]), &t)
    };
    // 4 GPUs: 4 left → an eighth is 0.5 GPU, five charges of 0.1.
    assert_eq!(take("0"), Milli(500));
    // 0.1 GPU left: less than two charges, nothing.
    assert_eq!(take("3.9"), Milli(0));
}

/// Many admissions at once never take more out of a grant than it holds.
#[tokio::test]
async fn parallel_admissions_never_pass_the_grant() {
    let (grants, cache) = holding("3", 2000, |_| {});
    let now = now_second();
    let admitted = std::sync::atomic::AtomicU32::new(0);
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                for _ in 0..50 {
                    if admits(&grants, &cache, 100, now) {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(admitted.into_inner(), 20);
    assert_eq!(admitted_from(&grants), (Milli(2000), 20));
}

/// The next grant is asked for while a quarter of this one is left, and this one keeps
/// admitting meanwhile: a steady stream of creates never waits for a write.
#[tokio::test]
async fn the_next_grant_is_taken_before_this_one_runs_out() {
    let (grants, cache) = holding("3", 2500, |_| {});
    grants.namespaces.lock().get_mut("team-a").unwrap().held[0].taken = Milli(8000);
    let now = now_second();
    assert!(admits(&grants, &cache, 1000, now));
    let plans = grants.plan("team-a").unwrap();
    assert_eq!(plans[0].takes.len(), 1, "the next one");
    assert_eq!(
        plans[0].settles[0].2,
        Milli(0),
        "this one is not given back"
    );
    assert!(admits(&grants, &cache, 1000, now));
    grants.settled("team-a", &plans[0], Ok(vec![Milli(0)]));
    let plans = grants.plan("team-a").unwrap();
    assert!(plans.iter().all(|p| p.takes.is_empty()), "asked for once");
}
