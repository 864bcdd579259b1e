#![allow(clippy::unwrap_used)]
use super::*;
use crate::quota::ModelAmounts;
use crate::quota::{GpuQuotaSpec, PendingCharges};

pub(crate) const T: CreatedSecond = 1_790_000_000;

fn at(second: CreatedSecond) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(second).unwrap()
}

pub(crate) fn quota(used: &str, pending: &[(CreatedSecond, &str, u32)]) -> GPUQuota {
    let mut quota = GPUQuota::new(
        "default",
        GpuQuotaSpec {
            hard: [("T4".to_string(), Quantity("4".into()))].into(),
            pools: vec![],
            default_type: None,
            on_exceed: Default::default(),
            ..Default::default()
        },
    );
    quota.metadata.namespace = Some("team-a".into());
    quota.status = Some(GpuQuotaStatus {
        used: [("T4".to_string(), Quantity(used.into()))].into(),
        pending: pending
            .iter()
            .map(|(created, amount, pods)| PendingCharges {
                created: super::super::pending::format_second(*created),
                model: "T4".into(),
                amount: Quantity(amount.to_string()),
                pods: *pods,
                charge_ids: vec![],
            })
            .collect(),
        reservations: vec![],
        ..GpuQuotaStatus::default()
    });
    quota
}

fn used_of(status: &GpuQuotaStatus, model: &str) -> String {
    status.used[model].0.clone()
}

#[test]
fn reconciled_used_is_pods_plus_charges_not_yet_seen() {
    // Two pods admitted in second T (1.5 GPUs), one of them (1 GPU) already seen.
    let quota = quota("9", &[(T, "1.5", 2)]);
    let pods: ModelAmounts = [("T4".to_string(), Milli(1000))].into();
    let seen = |created, model: &str| match (created, model) {
        (T, "T4") => Milli(1000),
        _ => Milli(0),
    };
    let status = reconciled_status(&quota, &pods, seen, |_, _| false, at(T + 2)).unwrap();
    assert_eq!(used_of(&status, "T4"), "1.5");
    assert_eq!(status.pending.len(), 1, "kept until settled");
}

#[test]
fn a_lagging_reconciler_counts_the_pods_it_has_not_seen_through_their_total() {
    // Three pods admitted in second T. Replica A sees all three a minute later and writes;
    // replica B's pod watch lags (it sees none of them) and writes next, on A's status.
    let admitted = quota("3", &[(T, "3", 3)]);
    let three: ModelAmounts = [("T4".to_string(), Milli(3000))].into();
    let all_seen = |created, _: &str| if created == T { Milli(3000) } else { Milli(0) };
    let a = reconciled_status(&admitted, &three, all_seen, |_, _| false, at(T + 60)).unwrap();
    assert_eq!(used_of(&a, "T4"), "3");
    let mut after_a = admitted.clone();
    after_a.status = Some(a);
    let none_seen = |_, _: &str| Milli(0);
    let empty = ModelAmounts::new();
    let b = reconciled_status(&after_a, &empty, none_seen, |_, _| false, at(T + 61)).unwrap();
    assert_eq!(
        used_of(&b, "T4"),
        "3",
        "the lagging replica counts the pods it has not seen through their total"
    );
}

#[test]
fn reconciled_status_releases_a_charge_whose_pod_never_came() {
    let quota = quota("2", &[(T, "2", 2)]);
    let none = |_, _: &str| Milli(0);
    let ttl = super::super::pending::PENDING_TTL.as_secs() as i64;
    let status = reconciled_status(
        &quota,
        &ModelAmounts::new(),
        none,
        |_, _| false,
        at(T + ttl),
    )
    .unwrap();
    assert_eq!(used_of(&status, "T4"), "0");
    assert!(status.pending.is_empty());
}

#[test]
fn reconciled_status_keeps_unexpired_reservations_of_earlier_versions() {
    let mut quota = quota("3", &[]);
    let reservation = |pod: &str, expires: CreatedSecond| QuotaReservation {
        pod: pod.into(),
        uid: format!("{pod}-uid"),
        model: "T4".into(),
        amount: Quantity("1".into()),
        expires: super::super::pending::format_second(expires),
    };
    quota.status.as_mut().unwrap().reservations = vec![
        reservation("in-flight", T + 60),
        reservation("created", T + 60),
        reservation("never-made", T - 1),
    ];
    let pods: ModelAmounts = [("T4".to_string(), Milli(1000))].into();
    let seen_pod = |name: &str, _: &str| name == "created";
    let status = reconciled_status(&quota, &pods, |_, _| Milli(0), seen_pod, at(T)).unwrap();
    assert_eq!(used_of(&status, "T4"), "2");
    assert_eq!(status.reservations.len(), 1);
    assert_eq!(status.reservations[0].pod, "in-flight");
}

#[test]
fn reconciled_status_shows_use_of_a_model_no_quota_lists() {
    // A pod charged to A100 in a namespace whose quotas list only T4 got around
    // admission; its use shows (against a quota of zero) instead of vanishing.
    let quota = quota("0", &[]);
    let pods: ModelAmounts = [("A100".to_string(), Milli(1000))].into();
    let status = reconciled_status(&quota, &pods, |_, _| Milli(0), |_, _| true, at(T)).unwrap();
    assert_eq!(used_of(&status, "A100"), "1");
    assert_eq!(used_of(&status, "T4"), "0");
}

#[test]
fn charges_add_to_used_and_one_pending_total_per_second_and_model() {
    let quota = quota("1", &[]);
    let charges = [
        ("T4", Milli(500), T, ChargeId::None),
        ("T4", Milli(1000), T, ChargeId::None),
        ("T4", Milli(250), T + 1, ChargeId::None),
    ];
    let updated = with_charges(&quota, &charges, Direction::Add).unwrap();
    let status = updated.status.unwrap();
    assert_eq!(used_of(&status, "T4"), "2.75");
    let totals: Vec<(&str, u32)> = status
        .pending
        .iter()
        .map(|p| (p.amount.0.as_str(), p.pods))
        .collect();
    assert_eq!(totals, [("1.5", 2), ("0.25", 1)]);
}

#[test]
fn a_release_takes_back_exactly_what_was_charged() {
    let quota = quota("1", &[]);
    let charge = [("T4", Milli(500), T, ChargeId::Stored("pod.1"))];
    let charged = with_charges(&quota, &charge, Direction::Add).unwrap();
    let released = with_charges(&charged, &charge, Direction::Remove).unwrap();
    let status = released.status.unwrap();
    assert_eq!(used_of(&status, "T4"), "1");
    assert!(status.pending.is_empty());
}

/// A release whose charge write was cut (sent, its answer lost) takes back exactly its
/// own charge by its id: all of it if the write was stored, nothing if it was not, and
/// nothing the second time; never the same pod's next attempt.
#[test]
fn a_release_taken_back_by_id_is_exact_whether_or_not_its_write_was_stored() {
    let quota = quota("1", &[]);
    let mine = [("T4", Milli(500), T, ChargeId::Unsure("pod.1"))];
    let other = [("T4", Milli(500), T, ChargeId::Unsure("pod.2"))];
    let stored = with_charges(&quota, &mine, Direction::Add).unwrap();
    let stored = with_charges(&stored, &other, Direction::Add).unwrap();
    let back = with_charges(&stored, &mine, Direction::Remove).unwrap();
    assert_eq!(
        used_of(back.status.as_ref().unwrap(), "T4"),
        "1.5",
        "mine only"
    );
    let again = with_charges(&back, &mine, Direction::Remove).unwrap();
    assert_eq!(again.status, back.status, "taken back once");
    let never_stored = with_charges(&quota, &other, Direction::Add).unwrap();
    let back = with_charges(&never_stored, &mine, Direction::Remove).unwrap();
    assert_eq!(back.status, never_stored.status, "nothing of another pod's");
}

#[test]
fn a_charge_for_a_model_the_quota_does_not_list_leaves_it_alone() {
    let quota = quota("1", &[]);
    let updated = with_charges(
        &quota,
        &[("A100", Milli(1000), T, ChargeId::None)],
        Direction::Add,
    )
    .unwrap();
    assert_eq!(
        updated.status,
        quota.status.map(|mut s| {
            s.pending = vec![];
            s
        })
    );
}
