#![allow(clippy::unwrap_used)]

use super::*;
use crate::placement::Policy;
use crate::simulate::trace::{NodeRow, PodRow};

fn nodes(count: usize, gpus: u32) -> Vec<SimNode> {
    (0..count)
        .map(|i| {
            SimNode::of(&NodeRow {
                name: format!("n{i}"),
                cpu_milli: 64_000,
                memory_mib: 262_144,
                gpus,
                model: "T4".into(),
            })
        })
        .collect()
}

/// A one-GPU pod arriving at `arrival` that runs `runtime` seconds.
fn pod(arrival: u64, runtime: u64) -> TimedPod {
    TimedPod {
        pod: shaped(1, &[], 1000),
        arrival,
        runtime,
    }
}

/// A pod of `gpus` whole GPUs of `models` (any when empty) that needs `cpu_milli`.
fn shaped(gpus: u32, models: &[&str], cpu_milli: u64) -> SimPod {
    SimPod::of(&PodRow {
        name: "p".into(),
        cpu_milli,
        memory_mib: 1024,
        num_gpu: gpus,
        gpu_milli: 1000,
        models: models.iter().map(|m| m.to_string()).collect(),
        life: None,
    })
}

/// Two namespaces with 2 T4s of quota each; `namespace_of` deals the pods.
fn two_teams(namespace_of: Vec<usize>) -> Tenancy {
    let hard: ModelAmounts = [("T4".to_string(), Milli::from_units(2))].into();
    Tenancy {
        namespace_of,
        default_model: vec!["T4".into(); 2],
        hard: vec![hard; 2],
        peak_milli: 4000,
    }
}

fn replay(mode: QuotaMode, pods: &[TimedPod], tenancy: &Tenancy) -> TimelineResult {
    let placer = Placer::new(Policy::Binpack);
    run(mode, &placer, &nodes(2, 4), pods, tenancy, 300)
}

/// Team 0 starts four one-GPU pods of 100 s at once against its quota of two, team 1
/// is idle: under Deny two are refused and made again on a back-off, under Queue two
/// wait exactly until the first two finish, with a cohort they borrow team 1's idle
/// quota and nothing waits.
#[test]
fn queue_waits_for_room_deny_retries_and_a_cohort_borrows() {
    let pods: Vec<TimedPod> = (0..4).map(|_| pod(0, 100)).collect();
    let tenancy = two_teams(vec![0; 4]);

    let queue = replay(QuotaMode::Queue, &pods, &tenancy);
    assert_eq!((queue.started, queue.waited), (4, 2));
    assert_eq!((queue.wait_p50_s, queue.wait_max_s), (100, 100));
    assert_eq!(queue.retries, 0);
    // Two GPUs of demand waited 100 s while six GPUs idled.
    assert!((queue.stranded_gpu_hours - 200.0 / 3600.0).abs() < 1e-9);
    // By cause: for the first 100 s the six free GPUs are usable while two T4 pods wait
    // (quota-blocked), for the next 100 s nobody waits (idle); whole GPUs fragment
    // nothing. Together: the free GPU-time, 6 GPUs × 200 s.
    let free = queue.free_gpu_hours;
    assert!(
        (free.quota_blocked - 600.0 / 3600.0).abs() < 1e-9,
        "{free:?}"
    );
    assert!((free.idle - 600.0 / 3600.0).abs() < 1e-9, "{free:?}");
    assert_eq!(free.fragmented, 0.0);

    let deny = replay(QuotaMode::Deny, &pods, &tenancy);
    assert_eq!((deny.started, deny.waited), (4, 2));
    assert!(
        deny.wait_p50_s > 100 && deny.retries >= 2 * 7,
        "refused creates come back on the back-off (1, 2, 4 ... 64 s): {deny:?}"
    );
    assert!(deny.stranded_gpu_hours > queue.stranded_gpu_hours);

    let cohort = replay(QuotaMode::Cohort, &pods, &tenancy);
    assert_eq!((cohort.started, cohort.waited, cohort.evictions), (4, 0, 0));
    assert_eq!(cohort.stranded_gpu_hours, 0.0);
}

/// Team 1 comes back for its own quota while team 0 borrows it: team 1's pod starts at
/// once and team 0's most recent borrowing pod is evicted, waits in line and runs again
/// when room appears.
#[test]
fn a_lender_takes_its_quota_back_by_evicting_the_newest_borrower() {
    let mut pods: Vec<TimedPod> = vec![pod(0, 100), pod(0, 100), pod(0, 100), pod(10, 100)];
    pods.push(pod(50, 10));
    pods.push(pod(50, 10));
    let tenancy = two_teams(vec![0, 0, 0, 0, 1, 1]);
    let cohort = replay(QuotaMode::Cohort, &pods, &tenancy);
    assert_eq!(cohort.evictions, 2, "{cohort:?}");
    // The two borrowers ran 50 and 40 s before they were evicted.
    assert!((cohort.evicted_gpu_hours - 90.0 / 3600.0).abs() < 1e-9);
    assert_eq!(cohort.started, 6);
    assert_eq!(
        cohort.wait_max_s, 0,
        "every pod started at once the first time"
    );
    assert_eq!(cohort.never_started, 0);
}

#[test]
fn a_pod_no_quota_can_take_is_refused_at_once_but_a_cohort_may_take_it() {
    let mut big = pod(0, 10);
    big.pod = shaped(3, &[], 1000);
    let tenancy = two_teams(vec![0]);
    let deny = replay(QuotaMode::Deny, std::slice::from_ref(&big), &tenancy);
    assert_eq!((deny.too_big, deny.started, deny.retries), (1, 0, 0));
    let cohort = replay(QuotaMode::Cohort, &[big], &tenancy);
    assert_eq!((cohort.too_big, cohort.started), (0, 1));
}

/// A namespace's quota on a model is the scale times its own peak demand there, but
/// never less than its largest pod there; pods naming no model count on its default.
#[test]
fn tenancy_sizes_each_quota_on_its_own_peak_and_largest_pod() {
    // Peak: three one-GPU pods overlap at t=5; the fourth comes after.
    let mut pods = vec![pod(0, 10), pod(2, 10), pod(5, 10), pod(20, 5)];
    let mut v100 = pod(0, 10);
    v100.pod = shaped(2, &["V100"], 1000);
    pods.push(v100);
    let mut cluster = nodes(3, 4);
    cluster[2].gpus.model = Some("V100".into());
    let one = tenancy(&pods, &cluster, 1, 0.5, 7);
    assert_eq!(one.peak_milli, 5000);
    assert_eq!(one.default_model, ["T4"], "the largest model");
    assert_eq!(one.hard[0]["T4"], Milli(1500), "half of its peak of 3");
    assert_eq!(
        one.hard[0]["V100"],
        Milli(2000),
        "its largest pod, not half of it"
    );
    // Every pod dealt to one of the namespaces, spread over the models as the GPUs are
    // (T4 has two thirds of them).
    let two = tenancy(&pods, &cluster, 2, 1.0, 7);
    assert!(two.namespace_of.iter().all(|&k| k < 2));
    assert_eq!(two.default_model, ["T4", "V100"]);
    let six = tenancy(&pods, &cluster, 6, 1.0, 7);
    assert_eq!(six.default_model, ["T4", "T4", "T4", "T4", "V100", "V100"]);
}

/// A pod the quota lets through but no node can take waits for a node, not on quota: it
/// strands nothing, even after it was refused for quota before.
#[test]
fn waiting_for_a_node_is_not_waiting_on_quota() {
    let mut huge = pod(5, 10);
    huge.pod = shaped(1, &["T4", "V100"], 1_000_000); // more CPU than any node has
    let mut pods: Vec<TimedPod> = (0..2).map(|_| pod(0, 100)).collect();
    pods.push(huge);
    pods.push(pod(1000, 10)); // time goes on
    let tenancy = two_teams(vec![0, 0, 0, 1]);
    for mode in [QuotaMode::Deny, QuotaMode::Queue, QuotaMode::Cohort] {
        let result = replay(mode, &pods, &tenancy);
        assert_eq!((result.started, result.no_node), (3, 1), "{mode:?}");
        // Refused for quota from t=5 until the first retry after t=100 at most.
        assert!(
            result.stranded_gpu_hours <= 160.0 / 3600.0,
            "{mode:?}: {}",
            result.stranded_gpu_hours
        );
    }
}
