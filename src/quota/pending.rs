//! Charges of admitted pods the reconciler has not counted yet, kept in `GPUQuota.status`
//! as a few running totals instead of one entry per pod (docs/design.md, "The ledger").
//!
//! Admission adds a pod's charge to the total of the second the pod was created (the API
//! server stamps `creationTimestamp` before validating admission runs) and its model.
//! The reconciler knows, for each such second, how much of that model the pods it has
//! seen created in that second account for (`seen`). Whatever a total holds beyond that
//! is still in flight (or was never created) and stays part of `used`; pods that were
//! seen count as pods. So a write costs the same whether ten pods are being created or
//! ten thousand, and nothing admitted is released before it can be counted.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::placement::quantity::Milli;

use super::ModelAmounts;
use super::PendingCharges;

/// A total is dropped once this old, and not before, even when all its pods were seen:
/// by then every pod admitted in that second has been created (and is counted) or never
/// will be. Kept that long because another replica's reconciler may write from a pod view
/// that lags: while the total is there, pods it has not seen yet count through the total,
/// never through nothing (docs/design.md, "The ledger").
pub(crate) const PENDING_TTL: Duration = Duration::from_secs(120);

/// Which second a pod was created in: unix seconds of its `creationTimestamp`.
pub(crate) type CreatedSecond = i64;

/// One running total: charges of pods created in second `created`, to `model`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct BucketKey<'a> {
    pub(super) created: CreatedSecond,
    pub(super) model: &'a str,
}

/// The most charge ids one total keeps: a charge past it cannot be taken back by its id,
/// and holds its room until the total expires, as any other (a status write stays small).
const MAX_IDS: usize = 256;

/// One charge as the ledger writes it: `amount` of quota key `model`, in the total of
/// second `created`, and how it is known (see [`ChargeId`]).
pub(crate) type Entry<'a> = (&'a str, Milli, CreatedSecond, ChargeId<'a>);

/// How a charge is known to the ledger, which decides how it is taken back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChargeId<'a> {
    /// By its amount: a charge whose write is known to be stored, without an id
    /// (admission's, the extender's).
    None,
    /// A quota queue release's charge (one id per attempt, never reused) whose write
    /// may or may not have been stored: taken back only while its total holds the id.
    Unsure(&'a str),
    /// A quota queue release's charge whose write was stored: taken back by its id, or,
    /// when its total was too full to keep the id, as one of the charges kept without one.
    Stored(&'a str),
}

/// The id of a quota queue release's charge: the pod's uid, then what makes the attempt
/// unique (`<uid>.<process>.<count>`).
pub(crate) fn release_id(uid: &str, process: u128, count: u64) -> String {
    format!("{uid}.{process:x}.{count}")
}

/// The uid of the pod a [`release_id`] charges.
pub(crate) fn release_of(id: &str) -> &str {
    id.split('.').next().unwrap_or_default()
}

impl<'a> ChargeId<'a> {
    fn id(self) -> Option<&'a str> {
        match self {
            ChargeId::None => None,
            ChargeId::Unsure(id) | ChargeId::Stored(id) => Some(id),
        }
    }
}

/// One running total.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Total {
    amount: Milli,
    pods: u32,
    /// The ids of the charges that can be taken back exactly (see [`Entry`]).
    ids: Vec<String>,
}

/// The totals of one quota, by (second, model).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Pending {
    totals: BTreeMap<(CreatedSecond, String), Total>,
}

/// Why a status's pending totals cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("status.pending[{index}]: {reason}")]
pub(super) struct PendingError {
    index: usize,
    reason: String,
}

impl Pending {
    pub(super) fn from_status(entries: &[PendingCharges]) -> Result<Self, PendingError> {
        let mut pending = Pending::default();
        for (index, entry) in entries.iter().enumerate() {
            let error = |reason: String| PendingError { index, reason };
            let created = parse_second(&entry.created).map_err(|e| error(e.to_string()))?;
            let amount = Milli::parse(&entry.amount.0).map_err(|e| error(e.to_string()))?;
            pending.add(created, &entry.model, amount, entry.pods);
            let total = pending.totals.get_mut(&(created, entry.model.clone()));
            if let Some(total) = total {
                let room = MAX_IDS.saturating_sub(total.ids.len());
                total
                    .ids
                    .extend(entry.charge_ids.iter().take(room).cloned());
            }
        }
        Ok(pending)
    }

    pub(super) fn to_status(&self) -> Vec<PendingCharges> {
        self.totals
            .iter()
            .map(|((created, model), total)| PendingCharges {
                created: format_second(*created),
                model: model.clone(),
                amount: Quantity(total.amount.to_string()),
                pods: total.pods,
                charge_ids: total.ids.clone(),
            })
            .collect()
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.totals.is_empty()
    }

    /// Add `pods` pods' charge of `amount` to the total of (`created`, `model`).
    pub(super) fn add(&mut self, created: CreatedSecond, model: &str, amount: Milli, pods: u32) {
        let total = self.totals.entry((created, model.to_string())).or_default();
        total.amount = Milli(total.amount.0.saturating_add(amount.0));
        total.pods = total.pods.saturating_add(pods);
    }

    /// Add one pod's charge, with its id when given (and room is left).
    pub(super) fn add_entry(&mut self, (model, amount, created, id): Entry<'_>) {
        self.add(created, model, amount, 1);
        let total = self.totals.get_mut(&(created, model.to_string()));
        if let (Some(total), Some(id)) = (total, id.id())
            && total.ids.len() < MAX_IDS
        {
            total.ids.push(id.to_string());
        }
    }

    /// Take back one pod's charge (a placement or release that could not be written). An
    /// [`ChargeId::Unsure`] one only if its total holds its id: taking it back is then
    /// exact whether the write that added it was stored or not, and never takes another
    /// charge. A [`ChargeId::Stored`] one without its id (the total was full of ids) only
    /// if the total holds a charge kept without one. `true` when something was taken back.
    pub(super) fn remove(&mut self, (model, amount, created, id): Entry<'_>) -> bool {
        let key = (created, model.to_string());
        let Some(total) = self.totals.get_mut(&key) else {
            return false;
        };
        let found = id
            .id()
            .and_then(|id| total.ids.iter().position(|i| i == id));
        let anonymous = total.pods as usize > total.ids.len();
        match (id, found) {
            (_, Some(at)) => drop(total.ids.swap_remove(at)),
            (ChargeId::None, None) => {}
            (ChargeId::Stored(_), None) if anonymous => {}
            (ChargeId::Stored(_) | ChargeId::Unsure(_), None) => return false,
        }
        total.amount = Milli(total.amount.0.saturating_sub(amount.0));
        total.pods = total.pods.saturating_sub(1);
        if total.pods == 0 || total.amount.0 == 0 {
            self.totals.remove(&key);
        }
        true
    }

    /// What is still in flight, per model: each total less what the pods seen created in
    /// its second account for (never below zero), and the totals worth keeping. `seen`
    /// answers for (second, model); `now` is unix seconds.
    pub(super) fn settle(
        &self,
        seen: impl Fn(BucketKey<'_>) -> Milli,
        now: CreatedSecond,
    ) -> (ModelAmounts, Pending) {
        let mut in_flight = ModelAmounts::new();
        let mut kept = Pending::default();
        for ((created, model), total) in &self.totals {
            let age = now.saturating_sub(*created);
            if age >= PENDING_TTL.as_secs() as i64 {
                continue;
            }
            let seen = seen(BucketKey {
                created: *created,
                model,
            });
            let unseen = Milli(total.amount.0.saturating_sub(seen.0));
            if unseen.0 > 0 {
                let entry = in_flight.entry(model.clone()).or_default();
                entry.0 = entry.0.saturating_add(unseen.0);
            }
            kept.totals.insert((*created, model.clone()), total.clone());
        }
        (in_flight, kept)
    }
}

/// A time that is not RFC 3339.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not an RFC 3339 time: {source}")]
pub(crate) struct BadTime {
    text: String,
    source: time::error::Parse,
}

/// Unix seconds of an RFC 3339 time (a `creationTimestamp`).
pub(crate) fn parse_second(text: &str) -> Result<CreatedSecond, BadTime> {
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map(|t| t.unix_timestamp())
        .map_err(|source| BadTime {
            text: text.to_string(),
            source,
        })
}

pub(crate) fn format_second(second: CreatedSecond) -> String {
    time::OffsetDateTime::from_unix_timestamp(second)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

/// Now, in unix seconds.
pub(crate) fn now_second() -> CreatedSecond {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const T: CreatedSecond = 1_790_000_000;

    fn seen_from<'a>(
        pods: &'a [(CreatedSecond, &'a str, u64)],
    ) -> impl Fn(BucketKey<'_>) -> Milli + 'a {
        move |key| {
            Milli(
                pods.iter()
                    .filter(|(c, m, _)| *c == key.created && *m == key.model)
                    .map(|(_, _, a)| *a)
                    .sum(),
            )
        }
    }

    #[test]
    fn a_charge_stays_in_flight_until_its_pod_is_seen() {
        let mut pending = Pending::default();
        pending.add(T, "T4", Milli(1000), 1);
        pending.add(T, "T4", Milli(500), 1);
        let (in_flight, kept) = pending.settle(seen_from(&[]), T + 1);
        assert_eq!(in_flight["T4"], Milli(1500));
        assert_eq!(kept, pending);
        // One of the two pods shows up: only the other is still in flight.
        let (in_flight, _) = pending.settle(seen_from(&[(T, "T4", 1000)]), T + 1);
        assert_eq!(in_flight["T4"], Milli(500));
    }

    #[test]
    fn pods_of_another_second_or_model_do_not_cover_a_charge() {
        let mut pending = Pending::default();
        pending.add(T, "T4", Milli(1000), 1);
        let seen = [(T + 1, "T4", 1000), (T, "A100", 1000)];
        let (in_flight, _) = pending.settle(seen_from(&seen), T + 2);
        assert_eq!(in_flight["T4"], Milli(1000));
    }

    #[test]
    fn a_total_whose_pods_were_all_seen_is_kept_for_a_reconciler_that_has_not_seen_them() {
        let mut pending = Pending::default();
        pending.add(T, "T4", Milli(1000), 1);
        let seen = [(T, "T4", 1000)];
        let ttl = PENDING_TTL.as_secs() as i64;
        // Seen: nothing in flight, but the total stays until it expires...
        let (in_flight, kept) = pending.settle(seen_from(&seen), T + ttl - 1);
        assert!(in_flight.is_empty());
        assert_eq!(kept, pending);
        // ...so a replica whose pod watch lags (the pod not seen yet) still counts it.
        let (in_flight, _) = kept.settle(seen_from(&[]), T + ttl - 1);
        assert_eq!(in_flight["T4"], Milli(1000));
        let (_, kept) = pending.settle(seen_from(&seen), T + ttl);
        assert!(kept.is_empty());
    }

    #[test]
    fn a_charge_whose_pod_never_came_is_released_after_the_ttl() {
        let mut pending = Pending::default();
        pending.add(T, "T4", Milli(2000), 2);
        let just_before = T + PENDING_TTL.as_secs() as i64 - 1;
        let (in_flight, _) = pending.settle(seen_from(&[]), just_before);
        assert_eq!(in_flight["T4"], Milli(2000));
        let (in_flight, kept) = pending.settle(seen_from(&[]), just_before + 1);
        assert!(in_flight.is_empty() && kept.is_empty());
    }

    #[test]
    fn status_round_trip_and_removal() {
        let mut pending = Pending::default();
        pending.add(T, "T4", Milli(1500), 2);
        pending.add(T + 3, "A100", Milli(250), 1);
        let status = pending.to_status();
        assert_eq!(status[0].created, "2026-09-21T14:13:20Z");
        assert_eq!((status[0].amount.0.as_str(), status[0].pods), ("1.5", 2));
        let mut read = Pending::from_status(&status).unwrap();
        assert_eq!(read, pending);
        read.remove(("A100", Milli(250), T + 3, ChargeId::None));
        read.remove(("T4", Milli(500), T, ChargeId::None));
        assert_eq!(read.to_status().len(), 1);
        assert_eq!(read.to_status()[0].amount.0, "1");
    }

    /// A charge with an id is taken back exactly: all of it while its total holds the
    /// id (in the status as in memory), nothing once it was taken back or if it was never
    /// stored, and never another charge of the same pod in the same second.
    #[test]
    fn a_charge_is_taken_back_by_its_id_exactly_once() {
        let mut pending = Pending::default();
        pending.add_entry(("T4", Milli(1000), T, ChargeId::Unsure("pod-a.1")));
        pending.add_entry(("T4", Milli(1000), T, ChargeId::Unsure("pod-a.2")));
        pending.add_entry(("T4", Milli(500), T + 1, ChargeId::None));
        let mut read = Pending::from_status(&pending.to_status()).unwrap();
        assert_eq!(read, pending, "the ids ride in the status");
        assert!(read.remove(("T4", Milli(1000), T, ChargeId::Unsure("pod-a.1"))));
        assert!(
            !read.remove(("T4", Milli(1000), T, ChargeId::Unsure("pod-a.1"))),
            "once"
        );
        assert!(
            !read.remove(("T4", Milli(1000), T, ChargeId::Unsure("pod-a.3"))),
            "never stored"
        );
        assert!(
            !read.remove(("T4", Milli(500), T + 1, ChargeId::Unsure("pod-a.2"))),
            "not its total"
        );
        let (in_flight, _) = read.settle(seen_from(&[]), T + 2);
        assert_eq!(in_flight["T4"], Milli(1500), "the pod's other charge stays");
    }

    #[test]
    fn a_total_keeps_a_bounded_number_of_ids() {
        let mut pending = Pending::default();
        let ids: Vec<String> = (0..MAX_IDS + 10).map(|i| format!("c{i}")).collect();
        for id in &ids {
            pending.add_entry(("T4", Milli(1), T, ChargeId::Unsure(id)));
        }
        assert_eq!(pending.to_status()[0].charge_ids.len(), MAX_IDS);
        assert_eq!(pending.to_status()[0].pods as usize, MAX_IDS + 10);
        let past = |i: usize| ("T4", Milli(1), T, ChargeId::Unsure(&ids[MAX_IDS + i]));
        assert!(
            !pending.remove(past(0)),
            "unsure: it may never have been stored"
        );
        // A charge known stored whose id the full total did not keep is taken back as one
        // of the ten kept without an id: a second queue replica losing a race for a pod
        // in a busy second gives its charge back (it held room for minutes before).
        for i in 0..10 {
            let stored = ("T4", Milli(1), T, ChargeId::Stored(&ids[MAX_IDS + i]));
            assert!(pending.remove(stored), "stored charge {i}");
        }
        let stored = ("T4", Milli(1), T, ChargeId::Stored("never-added"));
        assert!(!pending.remove(stored), "no charge is left without an id");
        assert_eq!(pending.to_status()[0].pods as usize, MAX_IDS);
        assert!(pending.remove(("T4", Milli(1), T, ChargeId::Stored(&ids[0]))));
        assert_eq!(pending.to_status()[0].charge_ids.len(), MAX_IDS - 1);
    }

    #[test]
    fn unreadable_totals_are_named() {
        let bad = PendingCharges {
            created: "yesterday".into(),
            model: "T4".into(),
            amount: Quantity("1".into()),
            pods: 1,
            charge_ids: vec![],
        };
        let error = Pending::from_status(&[bad]).unwrap_err();
        assert_eq!(error.index, 0);
        assert!(error.reason.contains("yesterday"), "{error}");
    }
}
