//! The backend: the one place that knows the run mode, decided once at start-up.
//!
//! - **API mode**: the cluster cache is fed by watches; a quota charge is written into
//!   `GPUQuota.status` by the [`QuotaWriter`] before it is answered, placements are
//!   written onto pods (a merge patch, or a Binding), and a pod the watch has not
//!   brought yet is read from the API server. The controllers that keep the cluster
//!   true (the reconciler, the queue's releaser, ...) run beside it (`controllers`),
//!   with its client.
//! - **Offline mode** (`--cluster FILE`): the in-memory cache *is* the cluster. A charge
//!   is decided against usage counted from the cached pods and the admitted object joins
//!   the cache under the same lock, so concurrent creates never over-admit; a placement
//!   is recorded by holding it.
//!
//! Everything above (webhooks, extender, metrics) calls one method per act — charge,
//! release, record, bind, read a pod not cached yet — and never asks which mode it is
//! in. The cache below is synchronous state with no client and no writer
//! (docs/design.md, "Layers").

pub(crate) mod access;
mod cohort_lease;
mod grants;
pub mod quota_writer;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use tokio_util::sync::CancellationToken;

use crate::cache::pod::key_parts;
use crate::cache::{
    CacheError, CacheWriter, CachedPod, ClusterCache, ClusterState, PodKey, Projection, Subject,
};
use crate::quota::pending::{ChargeId, CreatedSecond};
use crate::quota::{Charge, ModelAmounts};

pub(crate) use cohort_lease::lease_namespace;
pub use quota_writer::{Ask, ChargeError, ChargeOutcome, QuotaWriter};

/// Recording a placement on the pod failed; the hold is rolled back.
#[derive(Debug, thiserror::Error)]
#[error("recording the GPU choice on pod {pod} failed: {source}")]
pub struct WriteError {
    pod: String,
    source: kube::Error,
}

impl WriteError {
    fn of(key: &PodKey, source: kube::Error) -> Self {
        WriteError {
            pod: key.to_string(),
            source,
        }
    }

    /// The API server's status code, when it answered.
    pub(crate) fn api_code(&self) -> Option<u16> {
        match &self.source {
            kube::Error::Api(status) => Some(status.code),
            _ => None,
        }
    }
}

#[derive(Clone)]
pub struct Backend {
    /// The cache's writer: the backend records here what it wrote (offline: what it
    /// decided), and hands it to the few that record what they place or write.
    cache: CacheWriter,
    mode: Mode,
    /// kube-scheduler has called the bind verb: it binds, so the filter only holds.
    binds_seen: Arc<AtomicBool>,
}

#[derive(Clone)]
enum Mode {
    Api {
        client: kube::Client,
        quotas: Arc<QuotaWriter>,
    },
    Offline,
}

impl Backend {
    /// Offline mode over `cache` (tests and benchmarks fill it through `write`).
    pub fn offline(cache: CacheWriter) -> Self {
        Backend {
            cache,
            mode: Mode::Offline,
            binds_seen: Arc::default(),
        }
    }

    /// API mode over `cache` (ready as it is) with `client`, and nothing running: for
    /// tests of what asks the API server (the admin port's callers).
    #[cfg(test)]
    pub(crate) fn api_for_tests(cache: CacheWriter, client: kube::Client) -> Self {
        Backend {
            cache,
            mode: Mode::Api {
                quotas: QuotaWriter::new(client.clone()),
                client,
            },
            binds_seen: Arc::default(),
        }
    }

    /// Offline mode: the YAML file is the cluster.
    pub fn from_file(path: &std::path::Path, projection: Projection) -> Result<Self, CacheError> {
        Ok(Self::offline(CacheWriter::from_file(path, projection)?))
    }

    /// API mode: the backend (its cache not ready until every watch has listed once) and
    /// the future that runs the watches until `shutdown`. The controllers that keep the
    /// cluster true run beside it (`controllers::spawn_all`).
    pub(crate) fn from_api(
        client: kube::Client,
        projection: Projection,
        shutdown: CancellationToken,
    ) -> (Self, impl std::future::Future<Output = ()>) {
        let (cache, watches) = CacheWriter::from_api(client.clone(), projection, shutdown);
        let backend = Backend {
            cache,
            mode: Mode::Api {
                quotas: QuotaWriter::new(client.clone()),
                client,
            },
            binds_seen: Arc::default(),
        };
        (backend, watches)
    }

    pub fn cache(&self) -> &ClusterCache {
        self.cache.cache()
    }

    /// The cache's writer, for those that record what they place or write (the
    /// extender's placement transaction and bind, the quota reconciler; tests and
    /// benchmarks fill a cache through it): `tests/structure.rs` keeps the list.
    pub fn writer(&self) -> &CacheWriter {
        &self.cache
    }

    /// API mode: the client the background controllers read and write with
    /// (`controllers`). Offline there is none: nothing runs beside the file.
    pub(crate) fn client(&self) -> Option<kube::Client> {
        match &self.mode {
            Mode::Api { client, .. } => Some(client.clone()),
            Mode::Offline => None,
        }
    }

    /// Who owns the bearer `token` (`access`): in API mode as the API server's
    /// TokenReview says. Offline the file is the cluster and there is nobody to ask:
    /// whoever reaches the admin port may ask (docs/explain.md).
    pub(crate) async fn identify(
        &self,
        token: Option<&str>,
    ) -> Result<access::Caller, access::AccessError> {
        match &self.mode {
            Mode::Api { client, .. } => access::identify(client, token).await,
            Mode::Offline => Ok(access::Caller::Anyone),
        }
    }

    /// Whether `caller` may `verb` pods in `namespace`: in API mode as the API server's
    /// SubjectAccessReview says.
    pub(crate) async fn may(
        &self,
        caller: &access::Caller,
        namespace: &str,
        verb: access::PodVerb,
    ) -> Result<(), access::AccessError> {
        match &self.mode {
            Mode::Api { client, .. } => access::review(client, caller, namespace, verb).await,
            Mode::Offline => Ok(()),
        }
    }

    /// For logs: `api` or `offline`.
    pub(crate) fn mode_name(&self) -> &'static str {
        match self.mode {
            Mode::Api { .. } => "api",
            Mode::Offline => "offline",
        }
    }

    /// Whether the filter verb writes its placement (annotations and the charge it
    /// adds) or only holds it for the bind verb: it writes unless the configuration
    /// says the scheduler binds (`placement.bindVerb`) or the scheduler was seen to.
    pub(crate) fn filter_records(&self, bind_verb: bool) -> bool {
        !(bind_verb || self.binds_seen.load(Ordering::Acquire))
    }

    /// A bind call arrived. With `placement.bindVerb` off the configuration disagrees
    /// with the scheduler's (whose extender entry has `bindVerb`): the filter then
    /// stops writing in the scheduling cycle — the bind verb writes, off it — and the
    /// mismatch is logged once, loudly.
    pub(crate) fn note_bind_call(&self, bind_verb: bool) {
        let first = !self.binds_seen.swap(true, Ordering::AcqRel);
        if first && !bind_verb {
            tracing::error!(
                "kube-scheduler calls the bind verb but placement.bindVerb is false: the filter \
                 now only holds placements and bind writes them; set placement.bindVerb: true \
                 (docs/design.md, \"The extender: filter, then bind\")"
            );
        }
    }

    /// Which copy of a pod a placement call places: in API mode the cluster's (the
    /// caller's copy names it by uid only), offline the one offered.
    pub fn subject(&self, offered: CachedPod) -> Subject {
        match self.mode {
            Mode::Api { .. } => Subject::Known { uid: offered.uid },
            Mode::Offline => Subject::Offered(Box::new(offered)),
        }
    }

    /// Decide `ask` for an object in `namespace` and, when it is charged, make the
    /// charge stick before answering: in API mode written to the GPUQuota ledger;
    /// offline, `join` adds the object to the cluster under the lock the decision was
    /// made under (not called for a dry run or a denial).
    pub async fn charge(
        &self,
        namespace: &str,
        ask: Ask,
        join: impl FnOnce(&mut ClusterState, &Charge),
    ) -> Result<ChargeOutcome, ChargeError> {
        match &self.mode {
            Mode::Api { quotas, .. } => quotas.admit(&self.cache, namespace, ask).await,
            Mode::Offline => self.cache.write(|state| {
                state.expire_deletions(crate::quota::pending::now_second());
                let quota = state.namespace_quota(namespace);
                Ok(match quota.admit(&ask.wanted, &ask.costs, ask.rules)? {
                    Err(denial) => ChargeOutcome::Denied(denial),
                    Ok(charge) => {
                        if !ask.dry_run {
                            join(state, &charge);
                        }
                        ChargeOutcome::Charged {
                            over: charge.into_over(),
                        }
                    }
                })
            }),
        }
    }

    /// Charge what a placement adds to a pod's admission charge (all of it for a pod
    /// that accepts several models). In API mode it is written to the GPUQuota ledger
    /// like any charge; offline the usage is counted from the cached pods, the held one
    /// among them, so the hold is the charge.
    pub(crate) async fn charge_at_placement(
        &self,
        namespace: &str,
        ask: Ask,
    ) -> Result<ChargeOutcome, ChargeError> {
        match &self.mode {
            Mode::Api { quotas, .. } => quotas.charge(&self.cache, namespace, ask).await,
            Mode::Offline => Ok(ChargeOutcome::Charged { over: Vec::new() }),
        }
    }

    /// An object admitted without a charge joins the cluster: offline it is added to the
    /// cache now; in API mode the watch brings it.
    pub fn admitted(&self, join: impl FnOnce(&mut ClusterState)) {
        if let Mode::Offline = self.mode {
            self.cache.write(join);
        }
    }

    /// Take back a charge (per quota key) written for a pod whose placement then failed.
    /// Offline nothing was written: freeing the hold is the give-back.
    pub(crate) async fn give_back(
        &self,
        namespace: &str,
        charge: &ModelAmounts,
        charged_at: (CreatedSecond, ChargeId<'_>),
    ) -> Result<(), ChargeError> {
        match &self.mode {
            Mode::Api { quotas, .. } => {
                quotas
                    .give_back(&self.cache, namespace, charge, charged_at)
                    .await
            }
            Mode::Offline => Ok(()),
        }
    }

    /// Write the placement annotations onto the pod (one merge patch). The pod's uid
    /// rides along as a precondition: uid is immutable, so the patch fails on a pod
    /// that was deleted and created again under the same name. Offline, the hold in
    /// the cache already is the record.
    pub async fn record(
        &self,
        key: &PodKey,
        uid: &str,
        annotations: BTreeMap<String, String>,
    ) -> Result<(), WriteError> {
        let Some((pods, _, name)) = self.pods_of(key) else {
            return Ok(());
        };
        let patch = serde_json::json!({"metadata": {"uid": uid, "annotations": annotations}});
        pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop)
            .map_err(|source| WriteError::of(key, source))
    }

    /// Bind the pod to `node` and write the placement annotations in one call: the
    /// binding subresource copies a Binding's annotations onto the pod as it sets
    /// `spec.nodeName`, and refuses a pod whose uid differs. So gpu-manager, which reads
    /// the annotations once the pod is on its node, always finds them. Offline, the
    /// cache is the record.
    pub async fn bind(
        &self,
        key: &PodKey,
        uid: &str,
        node: &str,
        annotations: BTreeMap<String, String>,
    ) -> Result<(), WriteError> {
        let Some((pods, namespace, name)) = self.pods_of(key) else {
            return Ok(());
        };
        let binding = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": annotations},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        });
        pods.create_subresource::<_, serde_json::Value>(
            "binding",
            name,
            &Default::default(),
            &binding,
        )
        .await
        .map(drop)
        .map_err(|source| WriteError::of(key, source))
    }

    /// API mode: the pods API of `key`'s namespace, the namespace and the pod's name;
    /// `None` offline, where nothing is written to or read from a cluster.
    fn pods_of<'k>(&self, key: &'k str) -> Option<(Api<Pod>, &'k str, &'k str)> {
        let Mode::Api { client, .. } = &self.mode else {
            return None;
        };
        let (namespace, name) = key_parts(key);
        Some((Api::namespaced(client.clone(), namespace), namespace, name))
    }

    /// API mode: the cluster's copy of pod `key` (`explain` reads a pod the cache does
    /// not keep: one whose GPUs come only through ResourceClaims). Offline: none.
    pub(crate) async fn read_pod(&self, key: &str) -> Option<Pod> {
        let (pods, _, name) = self.pods_of(key)?;
        pods.get_opt(name).await.ok().flatten()
    }

    /// API mode: make sure the cache holds `namespace`'s GPUQuotas before anything is
    /// decided on them. The watch can lag (an API server under load, a relist): a quota
    /// created moments ago and not delivered yet would let pods in uncharged, as in a
    /// namespace without one, and such an admission writes nothing a stale copy could
    /// conflict on. So when the cache holds none, they are read from the API server (the
    /// API server's own ResourceQuota admission looks up live when its lister holds
    /// none). A quota the cache holds needs no read: every charge is written against its
    /// resourceVersion (docs/design.md, "A quota the watch has not delivered").
    pub(crate) async fn ensure_quotas(&self, namespace: &str) -> Result<(), ChargeError> {
        let Mode::Api { client, .. } = &self.mode else {
            return Ok(());
        };
        // The hot path: the namespace has a quota, cached.
        if self
            .cache
            .read(|state| state.namespace_quotas(namespace).next().is_some())
        {
            return Ok(());
        }
        let api = Api::namespaced(client.clone(), namespace);
        quota_writer::read_quotas(&api, &self.cache, namespace, true).await?;
        Ok(())
    }

    /// API mode: make sure the cache holds pod `key` before a filter or bind call looks
    /// for it. kube-scheduler can see a new pod before this process's watch does; rather
    /// than refuse it (the scheduler would back off a second), read the cluster's copy.
    pub(crate) async fn ensure_pod(&self, key: &PodKey) {
        // The hot path (every filter and bind call): offline, or cached already.
        if matches!(self.mode, Mode::Offline) || self.cache.read(|state| state.pod(key).is_some()) {
            return;
        }
        let Some((pods, _, name)) = self.pods_of(key) else {
            return;
        };
        let Ok(Some(pod)) = pods.get_opt(name).await else {
            return;
        };
        let Ok(cached) = CachedPod::from_pod(&pod, self.cache.projection()) else {
            return;
        };
        self.cache.write(|state| {
            if state.pod(key).is_none() {
                state.apply_pod(key.clone(), cached);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn the_filter_stops_writing_once_the_scheduler_is_seen_to_bind() {
        let projection = Projection::from_config(&Config::default());
        let backend = Backend::offline(CacheWriter::in_memory(projection));
        assert!(
            backend.filter_records(false),
            "tkestack's protocol: the filter writes"
        );
        assert!(
            !backend.filter_records(true),
            "placement.bindVerb: bind writes"
        );
        backend.clone().note_bind_call(false);
        assert!(
            !backend.filter_records(false),
            "a bind call seen (by any clone): the filter only holds"
        );
    }
}
