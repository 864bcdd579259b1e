//! Grants: room a gpu-admission replica holds in a quota ahead of the pods it admits, so
//! that far from `hard` a create costs no status write (docs/design.md, "Grants"). Pure
//! arithmetic on `GPUQuota.status.grants`; the holder is `backend::grants`.
//!
//! A grant is part of `used` from the write that takes it. The holder admits from it
//! without a write, remembering each charge by the second its pod was created, and moves
//! those charges into the pending totals (`quota::pending`) with a write of its own a
//! moment later: the grant shrinks by what moves, `used` stays. What it no longer needs
//! it gives back (`used` shrinks). The holder admits from a grant only until
//! [`MARGIN`] before its `until`; a holder that died (or lost a write's answer) leaves it
//! behind, and any reconciler drops it [`PENDING_TTL`] after `until`: by then every pod
//! admitted from it has been created and is counted, or never will be — the argument
//! that lets a pending total expire.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::placement::quantity::Milli;

use super::pending::{CreatedSecond, PENDING_TTL, Pending, format_second, parse_second};
use super::{GPUQuota, GpuQuotaStatus, QuotaGrant, StatusError, quota_name};

/// How long a grant is taken for.
pub(crate) const LIFE: Duration = Duration::from_secs(15);

/// The holder stops admitting from a grant this long before its `until`: room for the
/// API server's clock (which stamps `creationTimestamp`) to run ahead of ours.
pub(crate) const MARGIN: Duration = Duration::from_secs(5);

/// The charges admitted from a grant in one second: amount and pods.
pub(crate) type Admitted = (CreatedSecond, Milli, u32);

/// One change to the grants of a quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GrantWrite<'a> {
    /// Hold `amount` of `model` (added to `used`) until `until`.
    Take {
        id: &'a str,
        model: &'a str,
        amount: Milli,
        until: CreatedSecond,
    },
    /// Move `admitted` out of grant `id` into the pending totals, and give `give_back`
    /// of it back (taken from `used`); the grant goes once nothing is left in it.
    Settle {
        id: &'a str,
        admitted: &'a [Admitted],
        give_back: Milli,
    },
}

/// A grant as the status records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) amount: Milli,
    pub(crate) until: CreatedSecond,
}

fn read(quota: &GPUQuota, index: usize, entry: &QuotaGrant) -> Result<Grant, StatusError> {
    let invalid = |reason: String| StatusError {
        quota: quota_name(quota),
        reason: format!("status.grants[{index}]: {reason}"),
    };
    Ok(Grant {
        amount: Milli::parse(&entry.amount.0).map_err(|e| invalid(e.to_string()))?,
        until: parse_second(&entry.until).map_err(|e| invalid(e.to_string()))?,
    })
}

/// Whether a grant ending at `until` may be dropped at `now`.
pub(crate) fn lapsed(until: CreatedSecond, now: CreatedSecond) -> bool {
    now.saturating_sub(until) >= PENDING_TTL.as_secs() as i64
}

/// The grants of `quota` that have not lapsed at `now`, and what they hold per quota key.
pub(crate) fn live(
    quota: &GPUQuota,
    now: CreatedSecond,
) -> Result<(Vec<QuotaGrant>, super::ModelAmounts), StatusError> {
    let (mut kept, mut held) = (Vec::new(), super::ModelAmounts::new());
    let entries = quota.status.iter().flat_map(|s| &s.grants);
    for (index, entry) in entries.enumerate() {
        let grant = read(quota, index, entry)?;
        if lapsed(grant.until, now) {
            continue;
        }
        let total = held.entry(entry.model.clone()).or_default();
        total.0 = total.0.saturating_add(grant.amount.0);
        kept.push(entry.clone());
    }
    Ok((kept, held))
}

/// Grant `id` of `quota`, when the status has it.
#[cfg(test)]
pub(crate) fn find(quota: &GPUQuota, id: &str) -> Result<Option<Grant>, StatusError> {
    let entries = quota.status.iter().flat_map(|s| &s.grants).enumerate();
    for (index, entry) in entries {
        if entry.id == id {
            return read(quota, index, entry).map(Some);
        }
    }
    Ok(None)
}

/// `quota` with `writes` applied to its grants, `used` and pending totals. A settle of a
/// grant the status no longer has changes nothing: it lapsed and was dropped, and so
/// were the totals its charges would have joined.
pub(crate) fn with_grant_writes(
    quota: &GPUQuota,
    writes: &[GrantWrite<'_>],
) -> Result<GPUQuota, StatusError> {
    let mut updated = quota.clone();
    updated.metadata.managed_fields = None;
    let status = updated.status.get_or_insert_with(GpuQuotaStatus::default);
    let invalid = |reason: String| StatusError {
        quota: quota_name(quota),
        reason,
    };
    let mut pending = Pending::from_status(&status.pending).map_err(|e| invalid(e.to_string()))?;
    for write in writes {
        match *write {
            GrantWrite::Take {
                id,
                model,
                amount,
                until,
            } => {
                add_used(status, model, amount.0 as i128);
                status.grants.push(QuotaGrant {
                    id: id.to_string(),
                    model: model.to_string(),
                    amount: Quantity(amount.to_string()),
                    until: format_second(until),
                });
            }
            GrantWrite::Settle {
                id,
                admitted,
                give_back,
            } => {
                let Some(index) = status.grants.iter().position(|g| g.id == id) else {
                    continue;
                };
                let held = read(quota, index, &status.grants[index])?.amount;
                let model = status.grants[index].model.clone();
                let moved: u64 = admitted.iter().map(|(_, amount, _)| amount.0).sum();
                for &(created, amount, pods) in admitted {
                    pending.add(created, &model, amount, pods);
                }
                add_used(status, &model, -(give_back.0 as i128));
                let left = held.0.saturating_sub(moved).saturating_sub(give_back.0);
                if left == 0 {
                    status.grants.remove(index);
                } else {
                    status.grants[index].amount = Quantity(Milli(left).to_string());
                }
            }
        }
    }
    status.pending = pending.to_status();
    Ok(updated)
}

/// Add `delta` (milli) to `used[model]`, never below zero.
fn add_used(status: &mut GpuQuotaStatus, model: &str, delta: i128) {
    let used = status
        .used
        .get(model)
        .and_then(|q| Milli::parse(&q.0).ok())
        .unwrap_or_default();
    let sum = (used.0 as i128 + delta).clamp(0, u64::MAX as i128) as u64;
    status
        .used
        .insert(model.to_string(), Quantity(Milli(sum).to_string()));
}

#[cfg(test)]
#[path = "grant_tests.rs"]
mod tests;
