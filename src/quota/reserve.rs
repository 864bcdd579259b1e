//! API mode: reserve a pod's charge in `GPUQuota.status` before admitting it, with
//! optimistic concurrency (write with the resourceVersion read, retry on conflict) —
//! how Kubernetes' own ResourceQuota admission avoids over-admission across replicas.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Client;
use kube::api::{Api, PostParams};

use crate::placement::models::WantedModels;
use crate::placement::quantity::Milli;

use super::ledger::{AdmitRules, Charge, Denial, QuotaView, admit};
use super::{GPUQuota, GpuQuotaStatus, QuotaReservation};

/// How long an admitted pod that never shows up keeps its reservation.
pub const RESERVATION_TTL: Duration = Duration::from_secs(120);
const ATTEMPTS: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum ReserveError {
    #[error("GPUQuota API call failed: {0}")]
    Api(#[from] kube::Error),
    #[error("GPUQuota {0} kept changing; gave up after {ATTEMPTS} attempts")]
    Contended(String),
    #[error("GPUQuota {quota}: {reason}")]
    Invalid { quota: String, reason: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserved {
    Yes,
    Denied(Denial),
}

/// Who the reservation is for (validating admission sees the final name and uid).
#[derive(Debug, Clone)]
pub struct PodIdentity {
    pub name: String,
    pub uid: String,
}

impl PodIdentity {
    pub fn of(pod: &Pod) -> Self {
        PodIdentity {
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
        }
    }
}

/// Decide and, for a pod charged to one model, write the charge into every quota that
/// lists the model before answering. The first try decides on `cached` (the watch's
/// copies, when given) and writes with their resourceVersion, so a stale copy can only
/// cost a conflict, never an over-admission; after a conflict, and before any denial,
/// the quotas are read fresh from the API server.
#[allow(clippy::too_many_arguments)]
pub async fn reserve(
    client: &Client,
    cached: Option<Vec<GPUQuota>>,
    namespace: &str,
    wanted: &WantedModels,
    amount: Milli,
    rules: AdmitRules,
    pod: &PodIdentity,
    dry_run: bool,
) -> Result<Reserved, ReserveError> {
    let api: Api<GPUQuota> = Api::namespaced(client.clone(), namespace);
    let mut cached = cached;
    for attempt in 0..ATTEMPTS {
        let started = std::time::Instant::now();
        let (quotas, fresh) = match cached.take() {
            Some(quotas) => (quotas, false),
            None => (api.list(&Default::default()).await?.items, true),
        };
        let listed = started.elapsed();
        let views = views_with_status(&quotas)?;
        let model = match admit(namespace, &views, wanted, amount, rules) {
            Err(denial) if fresh => return Ok(Reserved::Denied(denial)),
            Err(_) => continue, // never deny on a possibly stale copy
            Ok(Charge::Model { .. }) if dry_run => return Ok(Reserved::Yes),
            Ok(Charge::Model { model, .. }) => model,
            Ok(Charge::AtPlacement { .. } | Charge::Unlimited) => return Ok(Reserved::Yes),
        };
        let written = write_all(&api, &quotas, &model, amount, pod).await?;
        tracing::debug!(
            namespace, pod = %pod.name, attempt, fresh, written,
            list_ms = listed.as_secs_f64() * 1e3,
            total_ms = started.elapsed().as_secs_f64() * 1e3,
            "quota reservation"
        );
        match written {
            true => return Ok(Reserved::Yes),
            false => continue, // someone else wrote first: decide again on fresh data
        }
    }
    Err(ReserveError::Contended(format!("{namespace}/*")))
}

/// Quota views whose `used` is what the status says (reservations included).
pub fn views_with_status(quotas: &[GPUQuota]) -> Result<Vec<QuotaView>, ReserveError> {
    quotas
        .iter()
        .map(|quota| {
            let name = format!(
                "{}/{}",
                quota.metadata.namespace.as_deref().unwrap_or_default(),
                quota.metadata.name.as_deref().unwrap_or_default()
            );
            let invalid = |reason: String| ReserveError::Invalid {
                quota: name.clone(),
                reason,
            };
            let mut view = QuotaView::from_crd(quota).map_err(invalid)?;
            for (model, quantity) in quota.status.iter().flat_map(|s| &s.used) {
                let amount = Milli::parse(&quantity.0)
                    .map_err(|e| invalid(format!("status.used.{model}: {e}")))?;
                view.used.insert(model.clone(), amount);
            }
            Ok(view)
        })
        .collect()
}

/// Add the charge to each quota listing `model`, in name order. `Ok(false)` on a write
/// conflict, after undoing the quotas already written.
async fn write_all(
    api: &Api<GPUQuota>,
    quotas: &[GPUQuota],
    model: &str,
    amount: Milli,
    pod: &PodIdentity,
) -> Result<bool, ReserveError> {
    let mut listing: Vec<&GPUQuota> = quotas
        .iter()
        .filter(|q| q.spec.hard.contains_key(model))
        .collect();
    listing.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut written: Vec<String> = Vec::new();
    for quota in listing {
        let updated = with_charge(quota, model, amount, pod);
        match replace_status(api, &updated).await {
            Ok(()) => written.push(updated.metadata.name.clone().unwrap_or_default()),
            // 409: stale resourceVersion; 404: the quota is gone. Decide again, fresh.
            Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => {
                for name in &written {
                    release(api, name, pod).await?;
                }
                return Ok(false);
            }
            Err(error) => {
                for name in &written {
                    let _ = release(api, name, pod).await;
                }
                return Err(error.into());
            }
        }
    }
    Ok(true)
}

fn with_charge(quota: &GPUQuota, model: &str, amount: Milli, pod: &PodIdentity) -> GPUQuota {
    let mut updated = quota.clone();
    let status = updated.status.get_or_insert_with(GpuQuotaStatus::default);
    let used = status
        .used
        .get(model)
        .and_then(|q| Milli::parse(&q.0).ok())
        .unwrap_or_default();
    status.used.insert(
        model.to_string(),
        Quantity(Milli(used.0 + amount.0).to_string()),
    );
    let expires = time::OffsetDateTime::now_utc() + RESERVATION_TTL;
    status.reservations.push(QuotaReservation {
        pod: pod.name.clone(),
        uid: pod.uid.clone(),
        model: model.to_string(),
        amount: Quantity(amount.to_string()),
        expires: expires
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
    });
    updated
}

/// Write `quota.status` with the resourceVersion it was read at (409 when stale).
pub async fn replace_status(api: &Api<GPUQuota>, quota: &GPUQuota) -> Result<(), kube::Error> {
    let name = quota.metadata.name.clone().unwrap_or_default();
    api.replace_status(&name, &PostParams::default(), quota)
        .await
        .map(drop)
}

/// Take a pod's reservation back out of one quota (after a partial multi-quota write).
async fn release(api: &Api<GPUQuota>, name: &str, pod: &PodIdentity) -> Result<(), ReserveError> {
    for _ in 0..ATTEMPTS {
        let mut quota = api.get(name).await?;
        let Some(status) = quota.status.as_mut() else {
            return Ok(());
        };
        let Some(index) = status
            .reservations
            .iter()
            .position(|r| r.pod == pod.name && r.uid == pod.uid)
        else {
            return Ok(());
        };
        let reservation = status.reservations.remove(index);
        let amount = Milli::parse(&reservation.amount.0).unwrap_or_default();
        let used = status
            .used
            .get(&reservation.model)
            .and_then(|q| Milli::parse(&q.0).ok())
            .unwrap_or_default();
        status.used.insert(
            reservation.model,
            Quantity(Milli(used.0.saturating_sub(amount.0)).to_string()),
        );
        match replace_status(api, &quota).await {
            Ok(()) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(error) => return Err(error.into()),
        }
    }
    Err(ReserveError::Contended(name.to_string()))
}

/// The status the reconciler wants: usage from the pods it sees, plus reservations of
/// pods it has not seen yet that have not expired. `pod_usage` is what this quota
/// reports of its namespace's usage ([`reported_usage`](super::ledger::reported_usage)):
/// its own models, and any no quota lists. `seen(name, uid)` says whether a pod is in
/// the cache.
pub fn reconciled_status(
    quota: &GPUQuota,
    pod_usage: &BTreeMap<String, Milli>,
    seen: impl Fn(&str, &str) -> bool,
    now: time::OffsetDateTime,
) -> GpuQuotaStatus {
    let current = quota.status.clone().unwrap_or_default();
    let pending: Vec<QuotaReservation> = current
        .reservations
        .into_iter()
        .filter(|r| !seen(&r.pod, &r.uid))
        .filter(|r| {
            time::OffsetDateTime::parse(&r.expires, &time::format_description::well_known::Rfc3339)
                .is_ok_and(|expires| expires > now)
        })
        .collect();
    let mut used = pod_usage.clone();
    for model in quota.spec.hard.keys() {
        used.entry(model.clone()).or_default();
    }
    for reservation in &pending {
        let amount = Milli::parse(&reservation.amount.0).unwrap_or_default();
        let entry = used.entry(reservation.model.clone()).or_default();
        entry.0 += amount.0;
    }
    GpuQuotaStatus {
        used: used
            .into_iter()
            .map(|(m, a)| (m, Quantity(a.to_string())))
            .collect(),
        reservations: pending,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn quota_with(reservations: &[(&str, &str, &str, &str)]) -> GPUQuota {
        let mut quota = GPUQuota::new(
            "default",
            super::super::GpuQuotaSpec {
                hard: [("T4".to_string(), Quantity("4".into()))].into(),
                pools: vec![],
                default_type: None,
            },
        );
        quota.metadata.namespace = Some("team-a".into());
        quota.status = Some(GpuQuotaStatus {
            used: [("T4".to_string(), Quantity("9".into()))].into(),
            reservations: reservations
                .iter()
                .map(|(pod, uid, amount, expires)| QuotaReservation {
                    pod: pod.to_string(),
                    uid: uid.to_string(),
                    model: "T4".into(),
                    amount: Quantity(amount.to_string()),
                    expires: expires.to_string(),
                })
                .collect(),
        });
        quota
    }

    #[test]
    fn reconciled_status_counts_pods_plus_unseen_unexpired_reservations() {
        let now = time::OffsetDateTime::parse(
            "2026-11-22T10:00:00Z",
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap();
        let quota = quota_with(&[
            ("created", "u1", "1", "2026-11-22T10:01:00Z"), // seen in the cache: counted as a pod
            ("in-flight", "u2", "0.5", "2026-11-22T10:01:00Z"), // not seen, fresh: kept
            ("never-made", "u3", "2", "2026-11-22T09:59:00Z"), // not seen, expired: released
        ]);
        let pods: BTreeMap<String, Milli> = [("T4".to_string(), Milli(1500))].into();
        let status = reconciled_status(
            &quota,
            &pods,
            |name, uid| name == "created" && uid == "u1",
            now,
        );
        assert_eq!(
            status.used,
            [("T4".to_string(), Quantity("2".into()))].into()
        );
        assert_eq!(status.reservations.len(), 1);
        assert_eq!(status.reservations[0].pod, "in-flight");
    }

    #[test]
    fn reconciled_status_shows_use_of_a_model_no_quota_lists() {
        // A pod charged to A100 in a namespace whose quotas list only T4 got around
        // admission; its use shows (against a quota of zero) instead of vanishing.
        let now = time::OffsetDateTime::now_utc();
        let quota = quota_with(&[]);
        let pods: BTreeMap<String, Milli> = [("A100".to_string(), Milli(1000))].into();
        let status = reconciled_status(&quota, &pods, |_, _| true, now);
        assert_eq!(
            status.used,
            [
                ("A100".to_string(), Quantity("1".into())),
                ("T4".to_string(), Quantity("0".into()))
            ]
            .into()
        );
    }

    #[test]
    fn with_charge_adds_to_used_and_records_the_reservation() {
        let quota = quota_with(&[]);
        let pod = PodIdentity {
            name: "p".into(),
            uid: "u".into(),
        };
        let updated = with_charge(&quota, "T4", Milli(500), &pod);
        let status = updated.status.unwrap();
        assert_eq!(status.used["T4"], Quantity("9.5".into()));
        assert_eq!(
            (
                status.reservations[0].pod.as_str(),
                status.reservations[0].amount.0.as_str()
            ),
            ("p", "0.5")
        );
    }
}
