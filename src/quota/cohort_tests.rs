#![allow(clippy::unwrap_used)]

use rand::{Rng, SeedableRng};

use super::*;
use crate::quota::pool::*;
use crate::quota::view::{QuotaView, count_charge};

fn gpus(n: u64) -> Milli {
    Milli::from_units(n)
}

fn share(hard: u64, used: u64) -> Share {
    Share {
        hard: gpus(hard),
        used: gpus(used),
        ..Share::default()
    }
}

/// B borrows A's idle GPUs: the unused part of A's `hard` is in the pool.
#[test]
fn a_member_past_its_hard_borrows_what_the_others_leave_unused() {
    let a = share(8, 2);
    let b = share(4, 4);
    let pool = Pool::of(&[a, b]);
    assert_eq!(
        fits(&b, &pool, gpus(6), Reclaim::Evict),
        Ok(Fits::Borrowing(gpus(6)))
    );
    assert_eq!(
        fits(&b, &pool, gpus(7), Reclaim::Evict),
        Err(Short::NothingToBorrow { free: gpus(6) }),
        "A uses 2 of its 8: 6 are free, not 7"
    );
    let b = share(4, 3);
    assert_eq!(
        fits(&b, &Pool::of(&[a, b]), gpus(2), Reclaim::Evict),
        Ok(Fits::Borrowing(gpus(1))),
        "one of the two GPUs is B's own"
    );
}

#[test]
fn the_borrowing_limit_caps_how_far_past_hard_a_member_goes() {
    let a = share(8, 0);
    let b = Share {
        borrowing_limit: Some(gpus(2)),
        ..share(4, 5)
    };
    let pool = Pool::of(&[a, b]);
    assert_eq!(
        fits(&b, &pool, gpus(1), Reclaim::Evict),
        Ok(Fits::Borrowing(gpus(1)))
    );
    assert_eq!(
        fits(&b, &pool, gpus(2), Reclaim::Evict),
        Err(Short::BorrowingLimit { limit: gpus(2) })
    );
}

#[test]
fn the_lending_limit_keeps_the_rest_of_hard_for_its_member() {
    let a = Share {
        lending_limit: Some(gpus(2)),
        ..share(8, 0)
    };
    let b = share(4, 4);
    let pool = Pool::of(&[a, b]);
    assert_eq!(a.guaranteed(), gpus(6));
    assert_eq!(
        fits(&b, &pool, gpus(2), Reclaim::Evict),
        Ok(Fits::Borrowing(gpus(2)))
    );
    assert_eq!(
        fits(&b, &pool, gpus(3), Reclaim::Evict),
        Err(Short::NothingToBorrow { free: gpus(2) }),
        "A lends 2 of its 8 idle GPUs, no more"
    );
    // A using 7 of its 8 leaves one of its lendable two.
    let a = Share { used: gpus(7), ..a };
    assert_eq!(a.lends(), gpus(1));
    assert_eq!(
        fits(&b, &Pool::of(&[a, b]), gpus(2), Reclaim::Evict),
        Err(Short::NothingToBorrow { free: gpus(1) })
    );
}

/// A lender's pod within its own hard: at once with `Evict` (the pool is then overdrawn,
/// and reclaim evicts), refused or kept waiting with `Never`.
#[test]
fn a_lender_takes_back_at_once_with_evict_and_waits_with_never() {
    let a = share(8, 2);
    let b = share(4, 10); // borrows 6: all of A's idle GPUs
    let pool = Pool::of(&[a, b]);
    assert_eq!(pool.free(), 0);
    assert_eq!(fits(&a, &pool, gpus(3), Reclaim::Evict), Ok(Fits::Own));
    assert_eq!(
        fits(&a, &pool, gpus(3), Reclaim::Never),
        Err(Short::Lent { free: Milli(0) })
    );
    // A's 3 more GPUs overdraw the pool by 3: B's newest borrowing pods of the lowest
    // priority go first, until it is whole.
    let a = share(8, 5);
    let pods: Vec<Borrower<&str>> = [("b1", 0, 10), ("b2", 0, 30), ("b3", 5, 40), ("b4", 0, 20)]
        .into_iter()
        .map(|(key, priority, admitted)| Borrower {
            key,
            member: 1,
            priority,
            admitted,
            amount: gpus(2),
            standing: Standing::Evictable,
        })
        .collect();
    let evicted: Vec<&str> = reclaim(&[a, b], &pods).iter().map(|p| p.key).collect();
    assert_eq!(
        evicted,
        ["b2", "b4"],
        "priority 0 first, the most recent of them first"
    );
}

/// A member past its `hard` only because of MIG-slice fractions borrows fractions.
#[test]
fn fractions_borrow_exactly() {
    let a = share(1, 0);
    let b = Share {
        used: Milli(2_857), // 20 one-seventh slices
        ..share(3, 0)
    };
    let pool = Pool::of(&[a, b]);
    assert_eq!(fits(&b, &pool, Milli(143), Reclaim::Evict), Ok(Fits::Own));
    assert_eq!(
        fits(&b, &pool, Milli(286), Reclaim::Evict),
        Ok(Fits::Borrowing(Milli(143)))
    );
}

#[test]
fn reclaim_passes_over_pods_of_a_member_that_no_longer_borrows() {
    let a = share(4, 4);
    let b = share(2, 4); // borrows 2
    let c = share(2, 2); // within its own
    let pool = Pool::of(&[a, b, c]);
    assert_eq!(pool.overdrawn(), 2_000, "milli-GPUs");
    let pod = |key, member, admitted| Borrower {
        key,
        member,
        priority: 0,
        admitted,
        amount: gpus(1),
        standing: Standing::Evictable,
    };
    let pods = [pod("c-old-borrow", 2, 99), pod("b1", 1, 1), pod("b2", 1, 2)];
    let evicted: Vec<&str> = reclaim(&[a, b, c], &pods).iter().map(|p| p.key).collect();
    assert_eq!(evicted, ["b2", "b1"]);
}

/// Random cohorts and random charges by random members, each admitted only when
/// [`fits`] says so, with reclaim run after every admission: the cohort never uses more
/// than its members own once reclaim is done, no member goes past its borrowing limit,
/// no member lends more than its lending limit, a charge within a member's guaranteed
/// part is never refused, and with `Evict` a charge within `hard` never is.
#[test]
fn random_charges_keep_the_cohort_within_what_it_owns() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(21);
    let (mut borrowings, mut evictions, mut refusals) = (0, 0, 0);
    for round in 0..300 {
        let reclaim_mode = if rng.random_bool(0.5) {
            Reclaim::Evict
        } else {
            Reclaim::Never
        };
        let members = rng.random_range(1..5);
        let mut shares: Vec<Share> = (0..members)
            .map(|_| {
                let hard = rng.random_range(0..8u64);
                Share {
                    hard: gpus(hard),
                    used: Milli(0),
                    borrowing_limit: rng.random_bool(0.4).then(|| gpus(rng.random_range(0..6))),
                    lending_limit: rng.random_bool(0.4).then(|| gpus(rng.random_range(0..10))),
                }
            })
            .collect();
        let owned: u64 = shares.iter().map(|s| s.hard.0).sum();
        let mut pods: Vec<Borrower<usize>> = Vec::new();
        for step in 0..60 {
            let who = rng.random_range(0..members);
            if rng.random_bool(0.25) {
                // A pod of `who` finishes.
                if let Some(i) = pods.iter().position(|p| p.member == who) {
                    let pod = pods.remove(i);
                    shares[who].used.0 -= pod.amount.0;
                }
                continue;
            }
            let amount = Milli(rng.random_range(1..4) * 500);
            let before = shares[who];
            let pool = Pool::of(&shares);
            let fit = fits(&before, &pool, amount, reclaim_mode);
            let within = before.used.0 + amount.0;
            if within <= before.guaranteed().0 {
                assert_eq!(
                    fit,
                    Ok(Fits::Own),
                    "round {round} step {step}: guaranteed refused"
                );
            }
            if reclaim_mode.is_evict() && within <= before.hard.0 {
                assert_eq!(
                    fit,
                    Ok(Fits::Own),
                    "round {round} step {step}: own hard refused"
                );
            }
            match fit {
                Err(_) => {
                    refusals += 1;
                    continue;
                }
                Ok(Fits::Borrowing(_)) => borrowings += 1,
                Ok(Fits::Own) => {}
            }
            shares[who].used.0 += amount.0;
            pods.push(Borrower {
                key: step,
                member: who,
                priority: rng.random_range(0..3),
                admitted: step as i64,
                amount,
                standing: Standing::Evictable,
            });
            let evicted: Vec<usize> = reclaim(&shares, &pods).iter().map(|p| p.key).collect();
            for key in evicted {
                let i = pods.iter().position(|p| p.key == key).unwrap();
                let pod = pods.remove(i);
                assert!(
                    shares[pod.member].borrowed().0 > 0,
                    "evicted a non-borrower"
                );
                evictions += 1;
                shares[pod.member].used.0 -= pod.amount.0;
            }
            let pool = Pool::of(&shares);
            assert_eq!(pool.overdrawn(), 0, "round {round} step {step}: {shares:?}");
            let used: u64 = shares.iter().map(|s| s.used.0).sum();
            assert!(used <= owned, "round {round} step {step}: {used} > {owned}");
            for share in &shares {
                if let Some(limit) = share.borrowing_limit {
                    assert!(share.borrowed() <= limit, "round {round}: {share:?}");
                }
            }
            // Borrowed in all is at most what the non-borrowers lend of their idle quota.
            let borrowed: u64 = shares.iter().map(|s| s.borrowed().0).sum();
            let lent: u64 = shares
                .iter()
                .filter(|s| s.borrowed().0 == 0)
                .map(|s| s.lendable().0.min(s.hard.0 - s.used.0))
                .sum();
            assert!(borrowed <= lent, "round {round} step {step}: {shares:?}");
        }
    }
    // The rounds tried every path.
    assert!(
        borrowings > 200 && evictions > 50 && refusals > 200,
        "{borrowings} {evictions} {refusals}"
    );
}

/// Through the quota views admission reads: a quota in a cohort admits a pod past its
/// own `hard` while the pool has room, and its refusal says why the cohort could not lend.
#[test]
fn admission_borrows_through_the_cohort_and_says_why_not() {
    use crate::placement::models::{ModelSource, WantedModels};
    use crate::quota::admit::{AdmitRules, UntypedPods, admit};
    use crate::quota::{Costs, OnExceed};
    let view = |used: u64, drawn: u128| QuotaView {
        namespace: "team-b".into(),
        name: "default".into(),
        hard: [("A100".to_string(), gpus(4))].into(),
        used: [("A100".to_string(), gpus(used))].into(),
        on_exceed: OnExceed::Deny,
        cohort: Some(CohortTerms {
            name: "research".into(),
            pools: [(
                "A100".to_string(),
                Pool {
                    size: 12_000,
                    drawn,
                },
            )]
            .into(),
            ..CohortTerms::default()
        }),
    };
    let wanted = WantedModels {
        models: vec!["A100".into()],
        source: ModelSource::Annotation,
    };
    let costs = Costs::single("A100".into(), [("A100".to_string(), gpus(2))].into());
    let rules = AdmitRules {
        untyped: UntypedPods::Allow,
        quota_required: false,
    };
    // B uses its 4; the other members (8 GPUs) use 4 of theirs: 4 free to borrow.
    assert!(admit("team-b", &[view(4, 8_000)], &wanted, &costs, rules).is_ok());
    let denial = admit("team-b", &[view(4, 11_000)], &wanted, &costs, rules).unwrap_err();
    assert_eq!(
        denial.to_string(),
        "GPU quota exceeded in namespace \"team-b\" for A100: requested 2, used 4 of 4 \
         (GPUQuota team-b/default); cohort research: the other members lend 1 more"
    );
}

fn member(namespace: &str, cohort: &str, hard: u64, used: u64) -> QuotaView {
    let terms = CohortTerms {
        name: cohort.to_string(),
        ..CohortTerms::default()
    };
    QuotaView {
        namespace: namespace.to_string(),
        name: "default".to_string(),
        hard: [("T4".to_string(), gpus(hard))].into(),
        used: [("T4".to_string(), gpus(used))].into(),
        on_exceed: Default::default(),
        cohort: Some(terms),
    }
}

#[test]
fn members_of_one_cohort_share_one_pool_per_model() {
    let a = member("team-a", "research", 8, 2);
    let b = member("team-b", "research", 4, 4);
    let other = member("team-x", "elsewhere", 100, 0);
    let mut views = vec![b.clone()];
    attach_pools(&mut views, &[a, b, other]);
    let pools = &views[0].cohort.as_ref().unwrap().pools;
    assert_eq!(
        pools["T4"],
        Pool {
            size: 12_000,
            drawn: 6_000
        }
    );
    // So team-b may use 6 more, borrowed, and not 7.
    assert!(views[0].room_for("T4", gpus(6)).is_ok());
    assert!(views[0].room_for("T4", gpus(7)).is_err());
}

#[test]
fn what_a_cohort_borrows_is_lent_by_its_idle_members_in_proportion() {
    let a = member("team-a", "research", 8, 2); // leaves 6 idle
    let d = member("team-d", "research", 4, 1); // leaves 3 idle
    let b = member("team-b", "research", 4, 7); // borrows 3
    let members = [a.clone(), d.clone(), b.clone()];
    let lent = lent_by_quota(&members);
    assert_eq!(lent["team-a/default"]["T4"], gpus(2));
    assert_eq!(lent["team-d/default"]["T4"], gpus(1));
    assert!(
        lent["team-b/default"].is_empty(),
        "a borrower lends nothing"
    );
}

#[test]
fn a_charge_past_the_guaranteed_part_draws_from_the_pool() {
    let b = member("team-b", "research", 4, 4);
    let mut views = vec![b.clone()];
    attach_pools(&mut views, &[member("team-a", "research", 8, 0), b]);
    let before = views.clone();
    count_charge(&mut views, &[("T4".to_string(), gpus(1))].into());
    assert!(draws_from_pools(&before, &views));
    // Without a cohort, nothing is drawn.
    let mut plain = vec![QuotaView {
        cohort: None,
        ..member("team-c", "research", 4, 0)
    }];
    let before = plain.clone();
    count_charge(&mut plain, &[("T4".to_string(), gpus(1))].into());
    assert!(!draws_from_pools(&before, &plain));
}

#[test]
fn terms_come_from_the_quota_and_a_bad_limit_is_named() {
    use crate::quota::{GPUQuota, GpuQuotaSpec};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let mut quota = GPUQuota::new(
        "default",
        GpuQuotaSpec {
            hard: [("T4".to_string(), Quantity("4".into()))].into(),
            cohort: Some("research".into()),
            borrowing_limit: [("T4".to_string(), Quantity("2".into()))].into(),
            reclaim: Reclaim::Never,
            ..GpuQuotaSpec::default()
        },
    );
    quota.metadata.namespace = Some("team-a".into());
    let terms = CohortTerms::from_crd(&quota).unwrap().unwrap();
    assert_eq!(terms.name, "research");
    assert_eq!(terms.borrowing_limit["T4"], gpus(2));
    assert_eq!(terms.reclaim, Reclaim::Never);
    quota.spec.lending_limit = [("T4".to_string(), Quantity("lots".into()))].into();
    let error = CohortTerms::from_crd(&quota).unwrap_err();
    assert!(error.reason.contains("spec.lendingLimit.T4"), "{error:?}");
    quota.spec.cohort = None;
    assert_eq!(CohortTerms::from_crd(&quota).unwrap(), None);
}

#[test]
fn reclaim_plans_evictions_from_the_borrowers_pods_until_the_cohort_is_whole() {
    // team-a (hard 4) took back all of it; team-b (hard 0) runs three pods of one GPU,
    // all borrowed: the pool of 4 is drawn 4 + 3 = 7, 3 over.
    let members = [
        member("team-a", "research", 4, 0),
        member("team-b", "research", 0, 0),
    ];
    let pod = |key: &'static str, priority, created| (key, priority, created, gpus(1));
    let pods = vec![
        vec![
            pod("a1", 0, 1),
            pod("a2", 0, 2),
            pod("a3", 0, 3),
            pod("a4", 0, 4),
        ],
        vec![pod("old", 0, 10), pod("new", 0, 30), pod("mid", 0, 20)],
    ];
    let none = |_: &&str| Standing::Evictable;
    let plan = reclaim_plan(&members, "T4", &pods, none);
    assert_eq!(plan.by, vec![0], "team-a reclaims");
    let evicted: Vec<&str> = plan.evict.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        evicted,
        ["new", "mid", "old"],
        "all of team-b's, newest first"
    );
    // With one of team-b's pods gone, two more go; with team-a using only 1, none.
    let plan = reclaim_plan(
        &members,
        "T4",
        &[pods[0].clone(), pods[1][..2].to_vec()],
        none,
    );
    assert_eq!(plan.evict.len(), 2);
    let plan = reclaim_plan(
        &members,
        "T4",
        &[pods[0][..1].to_vec(), pods[1].clone()],
        none,
    );
    assert!(
        plan.evict.is_empty(),
        "4 of 4 used: the cohort owns what it uses"
    );
    // team-a took back 3: two over; the newest is protected but still counts, so the
    // next two go (not counting it would have evicted one).
    let took_two = [pods[0][..3].to_vec(), pods[1].clone()];
    let standing = |protected: &'static str| {
        move |k: &&str| match *k == protected {
            true => Standing::Protected,
            false => Standing::Evictable,
        }
    };
    let plan = reclaim_plan(&members, "T4", &took_two, standing("new"));
    let evicted: Vec<&str> = plan.evict.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        evicted,
        ["mid", "old"],
        "a protected pod still counts as used"
    );
    // Only one more goes: the protected one is still chosen when nothing else is left.
    let plan = reclaim_plan(
        &members,
        "T4",
        &[pods[0].clone(), pods[1][1..].to_vec()],
        standing("new"),
    );
    let evicted: Vec<&str> = plan.evict.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        evicted,
        ["mid", "new"],
        "protected last, but taken when needed"
    );
}

/// A pod already being deleted (evicted earlier, or deleted by its owner with a long
/// grace period) still holds its GPUs and counts, and is the first taken: reclaim
/// bounds its departure instead of evicting another pod in its place.
#[test]
fn reclaim_takes_pods_already_leaving_first_and_never_one_more_for_them() {
    // team-a (hard 3) uses 2, team-b (hard 0) 3: the pool of 3 is drawn 5, 2 over.
    let members = [
        member("team-a", "research", 3, 0),
        member("team-b", "research", 0, 0),
    ];
    let pod = |key: &'static str, priority, created| (key, priority, created, gpus(1));
    let pods = vec![
        vec![pod("a1", 0, 1), pod("a2", 0, 2)],
        vec![pod("leaving", 0, 10), pod("new", 0, 30), pod("vip", 9, 5)],
    ];
    let standing = |k: &&str| match *k {
        "leaving" => Standing::Leaving,
        _ => Standing::Evictable,
    };
    let plan = reclaim_plan(&members, "T4", &pods, standing);
    let chosen: Vec<&str> = plan.evict.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        chosen,
        ["leaving", "new"],
        "2 over: the leaving pod, then the newest"
    );
}

#[test]
fn the_pods_marked_borrowing_are_the_newest_covering_the_use_past_hard() {
    let b = member("team-b", "research", 2, 0);
    let pod = |key: &'static str, priority, created| (key, priority, created, gpus(1));
    let pods = [
        pod("old", 0, 1),
        pod("vip", 5, 9),
        pod("mid", 0, 2),
        pod("new", 0, 3),
    ];
    assert_eq!(borrowing_pods(&b, "T4", &pods), ["new", "mid"]);
    assert!(
        borrowing_pods(&b, "T4", &pods[..2]).is_empty(),
        "within hard"
    );
}

/// docs/quota.md's worked example, number for number: team-a owns 8 and lends at most
/// 6; team-b owns 2 and borrows at most 4.
#[test]
fn the_worked_example_of_the_docs_holds() {
    let a = |used| Share {
        lending_limit: Some(gpus(6)),
        ..share(8, used)
    };
    let b = |used| Share {
        borrowing_limit: Some(gpus(4)),
        ..share(2, used)
    };
    // team-b runs its own 2, then 4 of 5 more are admitted, borrowed; the fifth is not.
    let pool = Pool::of(&[a(0), b(2)]);
    assert_eq!(
        pool,
        Pool {
            size: 8_000,
            drawn: 2_000
        }
    );
    assert_eq!(
        fits(&b(2), &pool, gpus(4), Reclaim::Evict),
        Ok(Fits::Borrowing(gpus(4)))
    );
    assert_eq!(
        fits(&b(6), &Pool::of(&[a(0), b(6)]), gpus(1), Reclaim::Evict),
        Err(Short::BorrowingLimit { limit: gpus(4) })
    );
    // team-a: 2 guaranteed and 2 nobody borrows fit even with `Never`; the fifth takes
    // back a lent GPU: refused with `Never`, admitted with `Evict`, and one pod evicted.
    for used in 0..4 {
        let pool = Pool::of(&[a(used), b(6)]);
        assert_eq!(
            fits(&a(used), &pool, gpus(1), Reclaim::Never),
            Ok(Fits::Own)
        );
    }
    let pool = Pool::of(&[a(4), b(6)]);
    assert_eq!(
        fits(&a(4), &pool, gpus(1), Reclaim::Never),
        Err(Short::Lent { free: gpus(0) })
    );
    assert_eq!(fits(&a(4), &pool, gpus(1), Reclaim::Evict), Ok(Fits::Own));
    assert_eq!(
        Pool::of(&[a(5), b(6)]).overdrawn(),
        1_000,
        "one GPU over: one pod"
    );
}

/// Two models in one cohort: what a member leaves idle of one model is never lent as the
/// other, each model has its own pool, and what is lent is told model by model.
#[test]
fn each_model_is_lent_from_its_own_pool() {
    let two = |namespace: &str, t4: (u64, u64), a100: (u64, u64)| {
        let mut view = member(namespace, "research", t4.0, t4.1);
        view.hard.insert("A100".into(), gpus(a100.0));
        view.used.insert("A100".into(), gpus(a100.1));
        view
    };
    // team-a leaves 6 T4s idle and uses all its A100s; team-b owns 1 of each, uses them.
    let a = two("team-a", (8, 2), (4, 4));
    let b = two("team-b", (1, 1), (1, 1));
    let members = [a, b.clone()];
    let mut views = vec![b];
    attach_pools(&mut views, &members);
    assert!(
        views[0].room_for("T4", gpus(6)).is_ok(),
        "the idle T4s are lent"
    );
    assert!(views[0].room_for("T4", gpus(7)).is_err());
    assert!(
        views[0].room_for("A100", gpus(1)).is_err(),
        "idle T4s are no A100s"
    );
    // team-b now borrows 3 T4s and no A100: team-a lends T4s only.
    let members = [two("team-a", (8, 2), (4, 4)), two("team-b", (1, 4), (1, 1))];
    let lent = lent_by_quota(&members);
    assert_eq!(lent["team-a/default"].get("T4"), Some(&gpus(3)));
    assert_eq!(lent["team-a/default"].get("A100"), None);
}
