//! API mode: the background controllers (docs/design.md, "Controllers"), each a
//! [`skeleton::Controller`] run by the one skeleton ([`skeleton::run`]): a pass at a
//! time, on a tick and whenever woken, requeued with backoff after a failed pass, its
//! passes counted in the `gpu_admission_controller_*` metrics.
//!
//! - the quota reconciler (`reconcile`): keeps `GPUQuota.status` true, on every replica;
//! - the quota queue's releaser (`release`, docs/quota.md): lets queued pods go;
//! - cohorts' reclaimer (`reclaim`): takes back what a lender lent, within its bound;
//! - the tellers, which write what gpu-admission judges of pending pods onto them: why a
//!   pod waits (`waiting`, docs/explain.md), and with `defrag.mode: DryRun | Evict` the
//!   defragmentation planner's plan, told or carried out (`defrag`, `mover`;
//!   docs/defrag.md).
//!
//! Reclaim and the tellers act on one replica at a time, the holder of the controller
//! Lease (`leadership`); their Events go through `pod_events`. [`spawn_all`] is the one
//! place they are wired. Offline nothing runs: the file is the cluster and nothing
//! schedules its pods.

pub(crate) mod defrag;
pub(crate) mod leadership;
pub(crate) mod mover;
pub(crate) mod pod_events;
pub(crate) mod reclaim;
pub(crate) mod reconcile;
pub(crate) mod release;
pub(crate) mod skeleton;
pub(crate) mod waiting;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::DefragMode;
use crate::server::AppState;
use crate::snapshot::LiveWorld;

use leadership::{CONTROLLER_LEASE, Leader, Leadership};
use skeleton::{Harness, run};

/// Spawn, each in a span of its name, the controllers this replica runs until
/// `shutdown`: in API mode the reconciler always; with `writes_pods` (`--release-queue`,
/// the GPU scheduler's sidecar, whose identity may patch and evict pods) also the
/// releaser, the controller Lease, reclaim and the tellers. Returns the Lease's task,
/// for the caller to await at shutdown: a holder gives the Lease up before it exits.
pub(crate) fn spawn_all(
    state: &AppState,
    writes_pods: bool,
    shutdown: &CancellationToken,
) -> Option<JoinHandle<()>> {
    let client = state.backend.client()?;
    let cache = state.cache();
    let harness = Harness {
        cache: cache.clone(),
        metrics: state.metrics.controllers.clone(),
        shutdown: shutdown.clone(),
    };
    let reconciler = reconcile::Reconciler {
        cache: state.backend.writer().clone(),
        client: client.clone(),
    };
    let reconcile = run(reconciler, Some(cache.usage_moved()), harness.clone());
    tokio::spawn(reconcile.instrument(tracing::info_span!("reconcile")));
    if !writes_pods {
        return None;
    }
    let leader = Leader::default();
    let rules = state.config.queue_rules();
    let waits = state.metrics.quota_queue_wait.clone();
    let backend = state.backend.clone();
    let releaser = release::Releaser::new(backend, client.clone(), rules, waits, leader.clone());
    let release = run(releaser, Some(cache.queue_moved()), harness.clone());
    tokio::spawn(release.instrument(tracing::info_span!("queue_release")));
    let lease = Leadership::new(client.clone(), CONTROLLER_LEASE);
    let hold = lease.run(leader.clone(), shutdown.clone());
    let lease_task = tokio::spawn(hold.instrument(tracing::info_span!("controller_lease")));
    let evictions = state.metrics.reclaim_evictions.clone();
    let bound = state.config.reclaim.clone();
    let reclaimer = reclaim::Reclaimer::new(
        state.backend.clone(),
        client.clone(),
        evictions,
        bound,
        leader.clone(),
    );
    let reclaim = run(reclaimer, None, harness.clone());
    tokio::spawn(reclaim.instrument(tracing::info_span!("reclaim")));
    spawn_tellers(state, client, &leader, &harness);
    Some(lease_task)
}

/// The tellers, acting while `leader` holds the controller Lease: the Waiting condition
/// and, with `defrag.mode` DryRun or Evict, the planner's plans.
fn spawn_tellers(state: &AppState, client: kube::Client, leader: &Leader, harness: &Harness) {
    let (cache, placer, config) = (state.cache(), &state.placer, &state.config);
    let teller = waiting::Teller::new(
        cache.clone(),
        client.clone(),
        placer.clone(),
        config.clone(),
        leader.clone(),
    );
    let tell = run(teller, None, harness.clone());
    tokio::spawn(tell.instrument(tracing::info_span!("waiting")));
    if config.defrag.mode != DefragMode::Off {
        let world = LiveWorld::default();
        let watches = world.clone().run(client.clone(), harness.shutdown.clone());
        tokio::spawn(watches.instrument(tracing::info_span!("defrag_world")));
        let planner = defrag::Planner::new(
            cache.clone(),
            world,
            client,
            placer.clone(),
            config.clone(),
            state.metrics.clone(),
            leader.clone(),
        );
        let plan = run(planner, None, harness.clone());
        tokio::spawn(plan.instrument(tracing::info_span!("defrag")));
    }
}
