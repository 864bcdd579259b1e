//! API mode: keep `GPUQuota.status` true. Periodically, and soon after a pod leaves,
//! recompute `used` from the pods the cache holds plus the pending charges of admitted
//! pods it has not seen yet (`quota::pending`); release what finished, deleted or
//! never-created pods held.
//! Writes carry the resourceVersion read, so a concurrent admission is never undone.

use std::time::Duration;

use kube::Api;
use kube::Client;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::cache::{CacheWriter, ClusterCache};
use crate::quota::pending::PENDING_TTL;
use crate::quota::pool;
use crate::quota::status::reconciled_status;
use crate::quota::status::views_with_status;
use crate::quota::{GPUQuota, ModelAmounts, StatusError, quota_name};

use super::skeleton::{Controller, Failures, PassError, bounded};
use crate::backend::quota_writer::replace_status;

/// How often GPUQuota status is recomputed from the pods even when nothing left.
const QUOTA_RESYNC: Duration = Duration::from_secs(15);

/// The reconciler: every replica keeps the status true (its writes carry the version
/// read, so replicas never undo each other).
pub(crate) struct Reconciler {
    pub(crate) cache: CacheWriter,
    pub(crate) client: Client,
}

impl Controller for Reconciler {
    const NAME: &'static str = "reconcile";
    const EVERY: Duration = QUOTA_RESYNC;

    async fn pass(&mut self) -> Result<usize, PassError> {
        reconcile_once(&self.cache, &self.client).await
    }
}

/// One pass over every quota: how many statuses were rewritten, or what failed (a
/// status that could not be read or written; the other quotas are still reconciled).
async fn reconcile_once(cache: &CacheWriter, client: &Client) -> Result<usize, PassError> {
    let now = time::OffsetDateTime::now_utc();
    cache.write(|state| state.expire_deletions(now.unix_timestamp()));
    let quotas: Vec<GPUQuota> = cache.read(|state| state.quotas().cloned().collect());
    let lent = lent_by_quota(&quotas);
    let mut written = 0;
    let mut failures = Failures::default();
    for cached in quotas {
        let namespace = cached.metadata.namespace.clone().unwrap_or_default();
        let name = cached.metadata.name.clone().unwrap_or_default();
        let api: Api<GPUQuota> = Api::namespaced(client.clone(), &namespace);
        // The cached copy may be behind the admissions' writes: on a conflict, read the
        // quota fresh and try once more, so busy quotas still get their reservations pruned.
        let mut quota = Some(cached);
        for attempt in 0..2 {
            let Some(current) = quota.take() else { break };
            let lent = lent.get(&quota_name(&current));
            let updated = match reconciled(cache, &current, lent, now) {
                Ok(Some(updated)) => updated,
                Ok(None) => break,
                Err(error) => {
                    tracing::warn!(%namespace, %error, "cannot reconcile GPUQuota status");
                    failures.note(error);
                    break;
                }
            };
            match bounded(replace_status(&api, &updated)).await {
                Ok(stored) => {
                    cache.write(|state| state.apply_quota(stored));
                    cache.queue_moved().notify_one();
                    written += 1;
                    break;
                }
                Err(kube::Error::Api(status)) if status.code == 409 && attempt == 0 => {
                    match bounded(api.get_opt(&name)).await {
                        Ok(fresh) => quota = fresh,
                        Err(error) => failures.note(error),
                    }
                }
                // Busy: the next pass reads it again.
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(error) => {
                    tracing::warn!(%namespace, quota = %name, %error, "cannot update GPUQuota status");
                    failures.note(error);
                    break;
                }
            }
        }
    }
    failures.outcome(written)
}

/// The quota with the status the cache's pods call for, or `None` when it already has
/// it; an error when its status cannot be read.
fn reconciled(
    cache: &ClusterCache,
    quota: &GPUQuota,
    lent: Option<&ModelAmounts>,
    now: time::OffsetDateTime,
) -> Result<Option<GPUQuota>, StatusError> {
    cache.read(|state| {
        let namespace = quota.metadata.namespace.as_deref().unwrap_or_default();
        let usage = state.quota_usage(quota);
        let since = now.unix_timestamp() - PENDING_TTL.as_secs() as i64;
        let seen = state.seen_charges(namespace, since);
        let seen = |created: i64, model: &str| {
            seen.get(&(created, model.to_string()))
                .copied()
                .unwrap_or_default()
        };
        let seen_pod = |name: &str, uid: &str| {
            state
                .pod(&format!("{namespace}/{name}"))
                .is_some_and(|pod| uid.is_empty() || &*pod.uid == uid)
        };
        let mut status = reconciled_status(quota, &usage, seen, seen_pod, now)?;
        status.queued = queued_status(quota, &state.queued_usage(namespace));
        status.lent = lent.map(amounts_status).unwrap_or_default();
        Ok((quota.status.as_ref() != Some(&status)).then(|| {
            let mut updated = quota.clone();
            updated.metadata.managed_fields = None; // kept as they are by the API server
            updated.status = Some(status);
            updated
        }))
    })
}

/// `status.queued`: the part of what waits in the quota queue that `quota` lists.
fn queued_status(quota: &GPUQuota, queued: &ModelAmounts) -> BTreeMap<String, Quantity> {
    let listed = queued
        .iter()
        .filter(|(key, _)| quota.spec.hard.contains_key(*key));
    amounts_status(&listed.map(|(k, a)| (k.clone(), *a)).collect())
}

/// What each quota of a cohort lends (`quota::pool::lent_by_quota`), from the members'
/// statuses as this replica last saw them: computed once per pass.
fn lent_by_quota(quotas: &[GPUQuota]) -> std::collections::HashMap<String, ModelAmounts> {
    let members = quotas.iter().filter(|q| q.spec.cohort.is_some());
    let views = members.filter_map(|q| views_with_status(std::slice::from_ref(q)).ok());
    pool::lent_by_quota(&views.flatten().collect::<Vec<_>>())
}

fn amounts_status(amounts: &ModelAmounts) -> BTreeMap<String, Quantity> {
    let entries = amounts.iter();
    entries
        .map(|(key, amount)| (key.clone(), Quantity(amount.to_string())))
        .collect()
}
