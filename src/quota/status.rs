//! The GPUQuota status as arithmetic: charges added to or taken from `used` and the
//! pending totals, the views the admission rule reads, and the status the reconciler
//! wants. Pure: the writer that sends these to the API server is `backend::quota_writer`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::placement::quantity::Milli;

use super::pending::{ChargeId, CreatedSecond, Entry, Pending};
use super::{GPUQuota, GpuQuotaStatus, QuotaReservation, StatusError, quota_name};
use super::{ModelAmounts, QuotaView};

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    Add,
    Remove,
}

/// `quota` with `charges` added to (or taken from) `used` and the pending totals, for the
/// models it lists.
pub(crate) fn with_charges(
    quota: &GPUQuota,
    charges: &[Entry<'_>],
    direction: Direction,
) -> Result<GPUQuota, StatusError> {
    let mut updated = quota.clone();
    // Left out, the API server keeps them as they are: less to send and to decode.
    updated.metadata.managed_fields = None;
    let status = updated.status.get_or_insert_with(GpuQuotaStatus::default);
    let mut pending = Pending::from_status(&status.pending).map_err(|e| StatusError {
        quota: quota_name(quota),
        reason: e.to_string(),
    })?;
    for &entry in charges {
        let (model, amount, ..) = entry;
        if !quota.spec.hard.contains_key(model) {
            continue;
        }
        let used = status
            .used
            .get(model)
            .and_then(|q| Milli::parse(&q.0).ok())
            .unwrap_or_default();
        let used = match direction {
            Direction::Add => {
                pending.add_entry(entry);
                used.0.saturating_add(amount.0)
            }
            // A charge with an id that is not there (its write was never stored, or it was
            // taken back already) leaves `used` alone too.
            Direction::Remove if !pending.remove(entry) && entry.3 != ChargeId::None => continue,
            Direction::Remove => used.0.saturating_sub(amount.0),
        };
        status
            .used
            .insert(model.to_string(), Quantity(Milli(used).to_string()));
    }
    status.pending = pending.to_status();
    Ok(updated)
}

/// Quota views whose `used` is what the status says (pending charges included).
pub(crate) fn views_with_status(quotas: &[GPUQuota]) -> Result<Vec<QuotaView>, StatusError> {
    let view = |quota: &GPUQuota| with_recorded_use(QuotaView::from_crd(quota)?, quota);
    quotas.iter().map(view).collect()
}

/// `view` (of `quota`'s spec) with `used` as `quota`'s status records it.
pub(crate) fn with_recorded_use(
    mut view: QuotaView,
    quota: &GPUQuota,
) -> Result<QuotaView, StatusError> {
    let invalid = |reason: String| StatusError {
        quota: quota_name(quota),
        reason,
    };
    for (model, quantity) in quota.status.iter().flat_map(|s| &s.used) {
        let amount =
            Milli::parse(&quantity.0).map_err(|e| invalid(format!("status.used.{model}: {e}")))?;
        view.used.insert(model.clone(), amount);
    }
    Ok(view)
}

/// The status the reconciler wants: usage from the pods it sees (`pod_usage`, what this
/// quota reports of its namespace's usage), plus what the pending totals hold beyond
/// the pods seen created in their second (`seen`, per second and model: see
/// `quota::pending`), plus the grants that have not lapsed (`quota::grant`), plus
/// reservations of earlier versions for pods not seen yet that have not expired
/// (`seen_pod(name, uid)`).
pub(crate) fn reconciled_status(
    quota: &GPUQuota,
    pod_usage: &ModelAmounts,
    seen: impl Fn(CreatedSecond, &str) -> Milli,
    seen_pod: impl Fn(&str, &str) -> bool,
    now: time::OffsetDateTime,
) -> Result<GpuQuotaStatus, StatusError> {
    let current = quota.status.clone().unwrap_or_default();
    let pending = Pending::from_status(&current.pending).map_err(|e| StatusError {
        quota: quota_name(quota),
        reason: e.to_string(),
    })?;
    let (in_flight, kept) =
        pending.settle(|key| seen(key.created, key.model), now.unix_timestamp());
    let (grants, held) = super::grant::live(quota, now.unix_timestamp())?;
    let legacy: Vec<QuotaReservation> = current
        .reservations
        .into_iter()
        .filter(|r| !seen_pod(&r.pod, &r.uid))
        .filter(|r| {
            time::OffsetDateTime::parse(&r.expires, &time::format_description::well_known::Rfc3339)
                .is_ok_and(|expires| expires > now)
        })
        .collect();
    let mut used: BTreeMap<String, Milli> = pod_usage.clone();
    for model in quota.spec.hard.keys() {
        used.entry(model.clone()).or_default();
    }
    let legacy_amounts = legacy.iter().map(|r| {
        (
            r.model.clone(),
            Milli::parse(&r.amount.0).unwrap_or_default(),
        )
    });
    let counted = in_flight.into_iter().chain(held).chain(legacy_amounts);
    for (model, amount) in counted {
        let entry = used.entry(model).or_default();
        entry.0 = entry.0.saturating_add(amount.0);
    }
    Ok(GpuQuotaStatus {
        borrowed: borrowed(quota, &used),
        used: used
            .into_iter()
            .map(|(m, a)| (m, Quantity(a.to_string())))
            .collect(),
        pending: kept.to_status(),
        grants,
        reservations: legacy,
        queued: current.queued,
        lent: current.lent,
    })
}

/// `status.borrowed`: per model, the use past `hard` of a quota in a cohort.
fn borrowed(quota: &GPUQuota, used: &ModelAmounts) -> BTreeMap<String, Quantity> {
    if quota.spec.cohort.is_none() {
        return BTreeMap::new();
    }
    let hard = |model: &str| {
        let listed = quota.spec.hard.get(model);
        listed.and_then(|q| Milli::parse(&q.0).ok())
    };
    used.iter()
        .filter_map(|(model, amount)| {
            if crate::placement::mig::is_profile_key(model) {
                return None; // a profile cap is not lent
            }
            let past = amount.0.saturating_sub(hard(model)?.0);
            (past > 0).then(|| (model.clone(), Quantity(Milli(past).to_string())))
        })
        .collect()
}

#[cfg(test)]
#[path = "status_tests.rs"]
pub(crate) mod tests;
