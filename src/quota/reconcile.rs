//! API mode: keep `GPUQuota.status` true. Periodically, and soon after a pod leaves,
//! recompute `used` from the pods the cache holds plus the reservations of admitted
//! pods it has not seen yet; release what finished, deleted or never-created pods held.
//! Writes carry the resourceVersion read, so a concurrent admission is never undone.

use std::sync::Arc;
use std::time::Duration;

use kube::Api;
use kube::Client;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::cache::ClusterCache;

use super::GPUQuota;
use super::reserve::{reconciled_status, replace_status};

pub async fn run(
    cache: ClusterCache,
    client: Client,
    every: Duration,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let mut ticker = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = wake.notified() => {}
            _ = shutdown.cancelled() => return,
        }
        if cache.is_ready() {
            reconcile_once(&cache, &client).await;
        }
    }
}

/// One pass over every quota; returns how many statuses were rewritten.
pub async fn reconcile_once(cache: &ClusterCache, client: &Client) -> usize {
    let now = time::OffsetDateTime::now_utc();
    let changed: Vec<GPUQuota> = cache.with_state(|state| {
        state
            .quotas()
            .filter_map(|quota| {
                let namespace = quota.metadata.namespace.as_deref().unwrap_or_default();
                let usage = state.usage(namespace);
                let seen = |name: &str, uid: &str| {
                    state
                        .pod(&format!("{namespace}/{name}"))
                        .is_some_and(|pod| uid.is_empty() || &*pod.uid == uid)
                };
                let status = reconciled_status(quota, &usage, seen, now);
                (quota.status.as_ref() != Some(&status)).then(|| {
                    let mut updated = quota.clone();
                    updated.status = Some(status);
                    updated
                })
            })
            .collect()
    });
    let mut written = 0;
    for quota in changed {
        let namespace = quota.metadata.namespace.clone().unwrap_or_default();
        let api: Api<GPUQuota> = Api::namespaced(client.clone(), &namespace);
        match replace_status(&api, &quota).await {
            Ok(()) => written += 1,
            // Someone (an admission) wrote first; the next pass starts from fresh data.
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => {
                tracing::warn!(%namespace, quota = quota.metadata.name.as_deref().unwrap_or_default(), %error, "cannot update GPUQuota status")
            }
        }
    }
    written
}
