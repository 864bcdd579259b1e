//! API mode: one replica at a time acts where two would act twice (docs/design.md,
//! "One actor at a time"). Two GPU scheduler sidecars each reclaiming for the same
//! cohort evicted 4 pods for 3 borrowed GPUs (each pass counts only the evictions *it*
//! made), and each told every queued pod why it waits (two Events a pod). Reclaim and
//! those Events therefore come only from the replica holding a `coordination.k8s.io`
//! Lease in gpu-admission's namespace, as Kubernetes' own leader election does: the
//! holder renews it every [`RENEW`]; another replica takes it over only once it has seen
//! the Lease unchanged for a whole lease duration by its own clock (no clocks compared
//! across machines), with the resourceVersion it read, so two never take it at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use tokio_util::sync::CancellationToken;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, PostParams};

/// How long a holder that stopped renewing keeps the Lease from the others.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How often the holder renews it (and the others look at it).
const RENEW: Duration = Duration::from_secs(2);
/// The Lease of the replica that reclaims and tells queued pods why they wait.
pub const CONTROLLER_LEASE: &str = "gpu-admission-controller";

/// Whether this replica holds the Lease now; clones share it. It holds it while its last
/// renewal is younger than [`TRUSTED`]: a renewal that hangs (an API server gone silent)
/// ends the holding well before another replica may take the Lease over.
#[derive(Clone, Default)]
pub struct Leader(Arc<Mutex<Option<Instant>>>);

/// How long a renewal is trusted: less than [`LEASE_DURATION`], with room for clocks
/// that run a little apart.
const TRUSTED: Duration = Duration::from_secs(10);

impl Leader {
    pub fn holds(&self) -> bool {
        self.0
            .lock()
            .is_some_and(|renewed| renewed.elapsed() < TRUSTED)
    }

    /// Held from a renewal made at `renewed`, or not held (`None`).
    fn set(&self, renewed: Option<Instant>) {
        *self.0.lock() = renewed;
    }
}

/// What a replica may do with the Lease as it read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseAction {
    /// It holds it (or nobody does, or its holder stopped renewing): write it as ours.
    Take,
    /// Another replica holds it and renewed it within the lease duration.
    Wait,
}

/// Whether `me` may take (or keep) a Lease held by `holder`, which this replica has seen
/// unchanged for `unchanged` (by its own clock).
pub(crate) fn lease_action(holder: Option<&str>, me: &str, unchanged: Duration) -> LeaseAction {
    match holder {
        None | Some("") => LeaseAction::Take,
        Some(holder) if holder == me => LeaseAction::Take,
        Some(_) if unchanged >= LEASE_DURATION => LeaseAction::Take,
        Some(_) => LeaseAction::Wait,
    }
}

/// One replica's side of a Lease.
pub struct Leadership {
    api: Api<Lease>,
    name: String,
    me: String,
    /// The resourceVersion last read, and since when this replica has seen it.
    seen: Option<(String, Instant)>,
}

impl Leadership {
    /// Leadership of the Lease `name` in gpu-admission's namespace, for this process.
    pub fn new(client: Client, name: &str) -> Self {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "gpu-admission".into());
        Leadership {
            api: Api::namespaced(client, &crate::backend::lease_namespace()),
            name: name.to_string(),
            me: format!("{host}_{}_{}", std::process::id(), started_nanos()),
            seen: None,
        }
    }

    /// Hold the Lease whenever it may, every [`RENEW`], until `shutdown`; `leader` says
    /// whether it holds it now. On shutdown a holder stops acting and gives the Lease up,
    /// so another replica (or this one restarted) takes over at once instead of after
    /// [`LEASE_DURATION`] (a rolling update, a restart).
    pub async fn run(mut self, leader: Leader, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(RENEW);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = shutdown.cancelled() => {
                    if leader.holds() {
                        leader.set(None);
                        let given_up = tokio::time::timeout(RENEW, self.give_up()).await;
                        tracing::info!(lease = %self.name, given_up = matches!(given_up, Ok(Ok(true))), "controller lease given up at shutdown");
                    }
                    return;
                }
            }
            let asked = Instant::now();
            let held = self.hold().await;
            if held != leader.holds() {
                tracing::info!(lease = %self.name, held, "controller lease");
            }
            leader.set(held.then_some(asked));
        }
    }

    /// Take or renew the Lease: `true` while this replica holds it. Any failure to read
    /// or write it (a conflict: another replica wrote first) is `false`, for this pass.
    async fn hold(&mut self) -> bool {
        match self.try_hold().await {
            Ok(held) => held,
            Err(error) => {
                tracing::debug!(lease = %self.name, %error, "lease not held this pass");
                false
            }
        }
    }

    async fn try_hold(&mut self) -> Result<bool, kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = self.ours(Lease::default(), true);
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
                Err(error) => Err(error),
            };
        };
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        let since = match &self.seen {
            Some((seen, at)) if *seen == version => *at,
            _ => Instant::now(),
        };
        self.seen = Some((version, since));
        let spec = lease.spec.as_ref();
        let holder = spec.and_then(|s| s.holder_identity.as_deref());
        if lease_action(holder, &self.me, since.elapsed()) == LeaseAction::Wait {
            return Ok(false);
        }
        let new_holder = holder != Some(self.me.as_str());
        lease.metadata.managed_fields = None;
        let lease = self.ours(lease, new_holder);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Clear the Lease's holder if it is still this replica: `true` when written.
    async fn give_up(&self) -> Result<bool, kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(false);
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.me.as_str()) {
            return Ok(false);
        }
        spec.holder_identity = None;
        lease.metadata.managed_fields = None;
        let params = PostParams::default();
        self.api.replace(&self.name, &params, &lease).await?;
        Ok(true)
    }

    /// `lease` renewed by this replica now (taken over when `new_holder`).
    fn ours(&self, mut lease: Lease, new_holder: bool) -> Lease {
        lease.metadata.name = Some(self.name.clone());
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(self.me.clone());
        spec.lease_duration_seconds = Some(LEASE_DURATION.as_secs() as i32);
        spec.renew_time = Some(now.clone());
        if new_holder {
            spec.acquire_time = Some(now);
            let transitions = spec.lease_transitions.unwrap_or_default();
            spec.lease_transitions = Some(transitions.saturating_add(1));
        }
        lease
    }
}

/// When this process started to hold leases, in nanoseconds: with the host name and pid,
/// an identity no other replica (nor this one restarted) has.
fn started_nanos() -> u128 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |d| d.as_nanos())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_taken_only_when_free_ours_or_left_unrenewed_for_its_duration() {
        let second = Duration::from_secs(1);
        assert_eq!(lease_action(None, "me", Duration::ZERO), LeaseAction::Take);
        assert_eq!(
            lease_action(Some(""), "me", Duration::ZERO),
            LeaseAction::Take
        );
        assert_eq!(
            lease_action(Some("me"), "me", Duration::ZERO),
            LeaseAction::Take
        );
        assert_eq!(
            lease_action(Some("other"), "me", Duration::ZERO),
            LeaseAction::Wait
        );
        let almost = LEASE_DURATION - second;
        assert_eq!(lease_action(Some("other"), "me", almost), LeaseAction::Wait);
        assert_eq!(
            lease_action(Some("other"), "me", LEASE_DURATION),
            LeaseAction::Take
        );
    }

    /// A holder whose renewals stop (hung or failing) stops acting long before another
    /// replica may take the Lease over.
    #[test]
    fn a_holder_stops_acting_before_another_may_take_over() {
        let leader = Leader::default();
        assert!(!leader.holds());
        leader.set(Some(Instant::now()));
        assert!(leader.holds());
        let stale = Instant::now()
            .checked_sub(TRUSTED)
            .expect("the machine has run 10 s");
        leader.set(Some(stale));
        assert!(!leader.holds());
        assert!(TRUSTED + RENEW < LEASE_DURATION);
    }
}
