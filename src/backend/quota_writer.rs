//! API mode: the GPUQuota quota writer. A pod's charge is written into `GPUQuota.status`
//! before it is admitted, with optimistic concurrency — the decision is made on the
//! watch's copy of the quota and written with its resourceVersion; a conflict means
//! another writer went first, so read fresh and decide again — which is how Kubernetes'
//! own ResourceQuota admission stays exact across replicas.
//!
//! Concurrent charges in one namespace are decided together and written once per quota
//! (group commit): while one write is in flight the next charges queue, and the next
//! write carries all of them. The status keeps running totals of pending charges
//! (`quota::pending`), so a write costs the same however many pods are being created.
//!
//! Far from `hard`, an admission does not come here at all: it is taken out of a grant
//! this replica holds (`backend::grants`, docs/design.md "Grants"). A denial here waits a
//! bound for grants of the key it is short of to come back.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use foldhash::HashMap;
use kube::Client;
use kube::api::{Api, PostParams};
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tracing::Instrument;

use super::cohort_lease::{Agreement, CohortLeases};
use super::grants::Grants;
use crate::cache::CacheWriter;
use crate::placement::models::WantedModels;
use crate::quota::GPUQuota;
use crate::quota::StatusError;
use crate::quota::pending::{ChargeId, CreatedSecond, Entry};
use crate::quota::pool;
use crate::quota::status::{Direction, views_with_status, with_charges};
use crate::quota::view::count_charge;
use crate::quota::{AdmitRules, Charge, Costs, Denial, Exceeded, ModelAmounts, QuotaView, admit};

/// How long one charge may keep losing write races before it is answered with an error
/// (then the API server's failure policy decides). Webhook calls time out at 10 s.
const COMMIT_DEADLINE: Duration = Duration::from_secs(8);

/// How long a denial waits while grants hold room in the namespace's quotas: their
/// holders give back what they do not use within it (`backend::grants`); a dead holder's
/// grant does not come back that soon, and the denial is given.
const GRANT_WAIT: Duration = Duration::from_secs(2);
/// How often a waiting denial reads the quotas again.
const GRANT_POLL: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum ChargeError {
    #[error("GPUQuota API call failed: {0}")]
    Api(#[from] kube::Error),
    #[error("GPUQuotas in namespace {0} kept changing; gave up after {secs} s", secs = COMMIT_DEADLINE.as_secs())]
    Contended(String),
    #[error(transparent)]
    Invalid(#[from] StatusError),
    #[error("writing GPUQuota charges failed: {0}")]
    Write(String),
    #[error("the quota writer stopped before answering")]
    Abandoned,
}

impl ChargeError {
    /// Whether the charge may have been stored all the same: a write whose answer was
    /// lost, or a writer gone mid-write. Not when every write was refused (`Contended`:
    /// each conflicted) or none was tried (`Invalid`).
    pub(crate) const fn may_be_stored(&self) -> bool {
        !matches!(self, ChargeError::Contended(_) | ChargeError::Invalid(_))
    }

    /// A bounded label for metrics: the quota itself is unreadable, or the API failed.
    pub const fn kind(&self) -> &'static str {
        match self {
            ChargeError::Invalid(_) => "bad_quota",
            _ => "api",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChargeOutcome {
    /// Charged; `over`: the `Warn` quotas the charge went past (reported, not refused).
    Charged {
        over: Vec<Exceeded>,
    },
    Denied(Denial),
}

/// One charge to decide: what the pod wants, how much, and which pending total it joins.
#[derive(Debug, Clone)]
pub struct Ask {
    pub wanted: WantedModels,
    /// What the pod costs on each model it wants.
    pub costs: Costs,
    pub rules: AdmitRules,
    /// The pod's `creationTimestamp` in unix seconds (its pending total).
    pub created: CreatedSecond,
    /// The charge's id, written with it so it can be taken back exactly: the quota
    /// queue's releases only (`quota::pending::Entry`).
    pub charge_id: Option<String>,
    /// Evaluate only (`dryRun`): nothing is written.
    pub dry_run: bool,
}

type Answer = Result<ChargeOutcome, ChargeError>;

/// A charge waiting for its namespace's next group write, and who waits for the answer.
struct PendingWrite {
    ask: Ask,
    reply: oneshot::Sender<Answer>,
    /// An admission's: once written, this replica may take a grant for the next ones.
    grantable: bool,
    arrived: Instant,
}

impl PendingWrite {
    fn answer(self, answer: Answer) {
        let _ = self.reply.send(answer); // the caller may have gone (client timeout)
    }
}

#[derive(Default)]
struct Lane {
    queue: Vec<PendingWrite>,
    draining: bool,
}

/// The quota writer of one gpu-admission process: one lane of queued charges per
/// namespace, drained by one task at a time.
pub struct QuotaWriter {
    client: Client,
    lanes: Mutex<HashMap<String, Lane>>,
    leases: CohortLeases,
    grants: Arc<Grants>,
}

impl QuotaWriter {
    pub fn new(client: Client) -> Arc<Self> {
        Arc::new(QuotaWriter {
            leases: CohortLeases::new(client.clone()),
            grants: Grants::new(client.clone()),
            client,
            lanes: Mutex::new(HashMap::default()),
        })
    }

    /// Decide an admission's `ask`: from a grant this replica holds when one covers it
    /// (no write), otherwise as [`charge`](Self::charge) does.
    pub async fn admit(self: &Arc<Self>, cache: &CacheWriter, namespace: &str, ask: Ask) -> Answer {
        let grantable = ask.charge_id.is_none() && !ask.dry_run;
        let decision = (&ask.wanted, &ask.costs, ask.rules);
        if grantable && self.grants.admit(cache, namespace, decision, ask.created) {
            return Ok(ChargeOutcome::Charged { over: Vec::new() });
        }
        self.enqueue(cache, namespace, ask, grantable).await
    }

    /// Decide `ask` for a pod in `namespace` and, when it is charged to one model, write
    /// the charge into every quota that lists the model before answering.
    pub async fn charge(
        self: &Arc<Self>,
        cache: &CacheWriter,
        namespace: &str,
        ask: Ask,
    ) -> Answer {
        self.enqueue(cache, namespace, ask, false).await
    }

    async fn enqueue(
        self: &Arc<Self>,
        cache: &CacheWriter,
        namespace: &str,
        ask: Ask,
        grantable: bool,
    ) -> Answer {
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut lanes = self.lanes.lock();
            let lane = lanes.entry(namespace.to_string()).or_default();
            lane.queue.push(PendingWrite {
                ask,
                reply,
                grantable,
                arrived: Instant::now(),
            });
            !std::mem::replace(&mut lane.draining, true)
        };
        if start {
            // A task of its own: the caller's request may be cancelled mid-write, the
            // charges of the others it carries must not be.
            let (writer, cache, namespace) = (self.clone(), cache.clone(), namespace.to_string());
            let span = tracing::info_span!("quota_write", %namespace);
            let drain = async move { writer.drain(&cache, &namespace).await };
            tokio::spawn(drain.instrument(span));
        }
        answer.await.unwrap_or(Err(ChargeError::Abandoned))
    }

    async fn drain(&self, cache: &CacheWriter, namespace: &str) {
        loop {
            let batch = {
                let mut lanes = self.lanes.lock();
                let Some(lane) = lanes.get_mut(namespace) else {
                    return;
                };
                if lane.queue.is_empty() {
                    lanes.remove(namespace);
                    return;
                }
                std::mem::take(&mut lane.queue)
            };
            self.commit(cache, namespace, batch).await;
        }
    }

    /// Take back a charge (per quota key) this writer wrote for a pod whose placement
    /// then failed.
    pub(crate) async fn give_back(
        &self,
        cache: &CacheWriter,
        namespace: &str,
        charge: &ModelAmounts,
        (created, id): (CreatedSecond, ChargeId<'_>),
    ) -> Result<(), ChargeError> {
        let api: Api<GPUQuota> = Api::namespaced(self.client.clone(), namespace);
        let listing: Vec<String> = cache.read(|state| {
            state
                .namespace_quotas(namespace)
                .filter(|q| charge.keys().any(|key| q.spec.hard.contains_key(key)))
                .filter_map(|q| q.metadata.name.clone())
                .collect()
        });
        let charges: Vec<Entry<'_>> = charge
            .iter()
            .map(|(key, amount)| (key.as_str(), *amount, created, id))
            .collect();
        for name in listing {
            release_one(&api, cache, &name, &charges).await?;
        }
        Ok(())
    }
}

/// A charge decided in this round, waiting for its write.
struct Decided {
    waiting: PendingWrite,
    /// Per quota key.
    charge: ModelAmounts,
    /// The `Warn` quotas it goes past.
    over: Vec<Exceeded>,
}

impl QuotaWriter {
    /// Decide and write one batch, retrying on fresh data until every charge is
    /// answered. A round whose charges draw on a cohort's pool is decided again under
    /// the cohort's agreement (`cohort_lease`) before anything is written.
    async fn commit(&self, cache: &CacheWriter, namespace: &str, batch: Vec<PendingWrite>) {
        let api: Api<GPUQuota> = Api::namespaced(self.client.clone(), namespace);
        let deadline = Instant::now() + COMMIT_DEADLINE;
        let mut waiting = batch;
        let (mut fresh, mut agreeing) = (false, false);
        while !waiting.is_empty() {
            if Instant::now() >= deadline {
                for w in waiting {
                    w.answer(Err(ChargeError::Contended(namespace.to_string())));
                }
                return;
            }
            let round = match self
                .read_round(&api, cache, namespace, fresh, agreeing)
                .await
            {
                Ok(round) => round,
                Err(error) => return answer_all(waiting, &error),
            };
            let Round {
                quotas,
                mut views,
                agreement,
            } = round;
            let before = views.clone();
            let granted: BTreeSet<&str> = quotas
                .iter()
                .flat_map(|q| q.status.iter().flat_map(|s| &s.grants))
                .map(|g| g.model.as_str())
                .collect();
            let (decided, retry) = decide_round(namespace, &mut views, waiting, fresh, &granted);
            // On fresh data, only a denial waiting on grants is tried again.
            let waits_on_grants = fresh && !retry.is_empty();
            waiting = retry;
            fresh = true;
            if waits_on_grants {
                self.grants.yield_to_denial(cache, namespace);
            }
            if decided.is_empty() {
                if waits_on_grants {
                    tokio::time::sleep(GRANT_POLL).await;
                }
                continue;
            }
            if agreement.is_none() && pool::draws_from_pools(&before, &views) {
                agreeing = true;
                requeue(decided, &mut waiting);
                continue;
            }
            let started = Instant::now();
            let written = match write_round(&api, cache, &quotas, &decided).await {
                Ok(Some(written)) => written,
                // Someone else wrote first: decide these again on fresh data.
                Ok(None) => {
                    requeue(decided, &mut waiting);
                    continue;
                }
                Err(error) => {
                    let error = error.to_string();
                    for d in decided {
                        d.waiting.answer(Err(ChargeError::Write(error.clone())));
                    }
                    continue;
                }
            };
            if let Some(agreement) = agreement {
                match self.agree(&api, cache, agreement, &written, &decided).await {
                    Ok(true) => {}
                    Ok(false) => {
                        requeue(decided, &mut waiting);
                        continue;
                    }
                    Err(error) => {
                        answer_all(decided.into_iter().map(|d| d.waiting).collect(), &error);
                        continue;
                    }
                }
            }
            tracing::debug!(
                namespace,
                charges = decided.len(),
                write_ms = started.elapsed().as_secs_f64() * 1e3,
                "quota charges written"
            );
            for d in decided {
                if d.waiting.grantable {
                    self.grants.wanted(cache, namespace, &before, &d.charge);
                }
                d.waiting
                    .answer(Ok(ChargeOutcome::Charged { over: d.over }));
            }
        }
    }

    /// What a round decides on: the namespace's quotas, their views with their cohorts'
    /// pools and, when `agreeing`, the cohorts' Leases read before every member's quota
    /// (all of them read fresh then).
    async fn read_round(
        &self,
        api: &Api<GPUQuota>,
        cache: &CacheWriter,
        namespace: &str,
        fresh: bool,
        agreeing: bool,
    ) -> Result<Round, ChargeError> {
        let cohorts = cache.read(|state| {
            let quotas = state.namespace_quotas(namespace);
            quotas
                .filter_map(|q| q.spec.cohort.clone())
                .collect::<BTreeSet<_>>()
        });
        let (quotas, members, agreement) = if agreeing && !cohorts.is_empty() {
            let agreement = self.leases.read(&cohorts).await?;
            let every: Api<GPUQuota> = Api::all(self.client.clone());
            let all = every.list(&Default::default()).await?.items;
            cache.write(|state| all.iter().for_each(|q| state.apply_quota(q.clone())));
            let in_namespace = |q: &&GPUQuota| q.metadata.namespace.as_deref() == Some(namespace);
            let quotas: Vec<GPUQuota> = all.iter().filter(in_namespace).cloned().collect();
            let in_cohorts =
                |q: &&GPUQuota| q.spec.cohort.as_ref().is_some_and(|c| cohorts.contains(c));
            let members: Vec<GPUQuota> = all.iter().filter(in_cohorts).cloned().collect();
            (quotas, members, Some(agreement))
        } else {
            let quotas = read_quotas(api, cache, namespace, fresh).await?;
            let members = cache.read(|state| state.cohort_quotas(&cohorts).cloned().collect());
            (quotas, members, None)
        };
        let mut views = views_with_status(&quotas)?;
        if !members.is_empty() {
            pool::attach_pools(&mut views, &views_with_status(&members)?);
        }
        Ok(Round {
            quotas,
            views,
            agreement,
        })
    }

    /// Agree on a round's draws; when another draw was agreed first (`Ok(false)`: decide
    /// again) or the Lease cannot be written, the round's charges are given back.
    async fn agree(
        &self,
        api: &Api<GPUQuota>,
        cache: &CacheWriter,
        agreement: Agreement,
        written: &[String],
        decided: &[Decided],
    ) -> Result<bool, ChargeError> {
        let agreed = self.leases.agree(agreement).await;
        if matches!(agreed, Ok(true)) {
            return Ok(true);
        }
        let charges = round_charges(decided);
        for name in written {
            release_one(api, cache, name, &charges).await?;
        }
        agreed.map_err(ChargeError::from)
    }
}

/// Put a round's charges back in line to be decided again, ahead of those that arrived
/// after them.
fn requeue(decided: Vec<Decided>, waiting: &mut Vec<PendingWrite>) {
    let mut again: Vec<PendingWrite> = decided.into_iter().map(|d| d.waiting).collect();
    again.append(waiting);
    *waiting = again;
}

/// What one round decides on (`QuotaWriter::read_round`).
struct Round {
    quotas: Vec<GPUQuota>,
    views: Vec<QuotaView>,
    /// The cohorts' Leases, when the round decides under their agreement.
    agreement: Option<Agreement>,
}

/// Every charge of a round, as the ledger writes it.
fn round_charges(decided: &[Decided]) -> Vec<Entry<'_>> {
    decided
        .iter()
        .flat_map(|d| {
            let created = d.waiting.ask.created;
            let id = d
                .waiting
                .ask
                .charge_id
                .as_deref()
                .map_or(ChargeId::None, ChargeId::Unsure);
            d.charge
                .iter()
                .map(move |(key, amount)| (key.as_str(), *amount, created, id))
        })
        .collect()
}

fn answer_all(waiting: Vec<PendingWrite>, error: &ChargeError) {
    let reason = error.to_string();
    for w in waiting {
        w.answer(Err(ChargeError::Write(reason.clone())));
    }
}

/// The namespace's quotas: the cache's copies (the watch's, or our own last writes), or
/// read from the API server when `fresh` (and then put in the cache).
pub(crate) async fn read_quotas(
    api: &Api<GPUQuota>,
    cache: &CacheWriter,
    namespace: &str,
    fresh: bool,
) -> Result<Vec<GPUQuota>, ChargeError> {
    if !fresh {
        return Ok(cache.read(|state| state.namespace_quotas(namespace).cloned().collect()));
    }
    let quotas = api.list(&Default::default()).await?.items;
    cache.write(|state| quotas.iter().for_each(|q| state.apply_quota(q.clone())));
    Ok(quotas)
}

/// Decide every waiting charge in arrival order, each seeing the ones before it. A
/// denial is final only on fresh data (a stale copy may still count a pod that has
/// gone), and while grants hold room of a key it is short of (`granted`: the keys
/// with grants) only once it has waited [`GRANT_WAIT`] for them to come back; otherwise
/// it is tried again. Returns the charges to write and those to retry.
fn decide_round(
    namespace: &str,
    views: &mut [QuotaView],
    waiting: Vec<PendingWrite>,
    fresh: bool,
    granted: &BTreeSet<&str>,
) -> (Vec<Decided>, Vec<PendingWrite>) {
    let (mut decided, mut retry) = (Vec::new(), Vec::new());
    for w in waiting {
        let ask = &w.ask;
        let patient = w.arrived.elapsed() < GRANT_WAIT;
        match admit(namespace, views, &ask.wanted, &ask.costs, ask.rules) {
            Err(_) if !fresh => retry.push(w),
            Err(denial) if patient && denial.short_of().any(|m| granted.contains(m)) => {
                retry.push(w);
            }
            Err(denial) => w.answer(Ok(ChargeOutcome::Denied(denial))),
            Ok(Charge::Model { charge, over, .. }) if !ask.dry_run => {
                count_charge(views, &charge);
                decided.push(Decided {
                    waiting: w,
                    charge,
                    over,
                });
            }
            // A dry run, or nothing to write now.
            Ok(charge) => w.answer(Ok(ChargeOutcome::Charged {
                over: charge.into_over(),
            })),
        }
    }
    (decided, retry)
}

/// Write the round's charges into each quota listing one of their models, in name order,
/// each with the resourceVersion it was decided on; returns the quotas written. `Ok(None)`
/// on a conflict, after the quotas already written were given their charges back.
async fn write_round(
    api: &Api<GPUQuota>,
    cache: &CacheWriter,
    quotas: &[GPUQuota],
    decided: &[Decided],
) -> Result<Option<Vec<String>>, ChargeError> {
    let charges = round_charges(decided);
    let mut listing: Vec<&GPUQuota> = quotas
        .iter()
        .filter(|q| charges.iter().any(|(m, ..)| q.spec.hard.contains_key(*m)))
        .collect();
    listing.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut written: Vec<String> = Vec::new();
    for quota in listing {
        let updated = with_charges(quota, &charges, Direction::Add)?;
        match replace_status(api, &updated).await {
            Ok(stored) => {
                written.push(stored.metadata.name.clone().unwrap_or_default());
                cache.write(|state| state.apply_quota(stored));
            }
            // 409: stale resourceVersion; 404: the quota is gone. Decide again, fresh.
            Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => {
                for name in &written {
                    release_one(api, cache, name, &charges).await?;
                }
                return Ok(None);
            }
            Err(error) => {
                for name in &written {
                    let _ = release_one(api, cache, name, &charges).await;
                }
                return Err(error.into());
            }
        }
    }
    Ok(Some(written))
}

/// Write `quota.status` with the resourceVersion it was read at (409 when stale).
pub async fn replace_status(
    api: &Api<GPUQuota>,
    quota: &GPUQuota,
) -> Result<GPUQuota, kube::Error> {
    let name = quota.metadata.name.clone().unwrap_or_default();
    api.replace_status(&name, &PostParams::default(), quota)
        .await
}

/// Take `charges` back out of one quota, reading it fresh until the write goes through.
async fn release_one(
    api: &Api<GPUQuota>,
    cache: &CacheWriter,
    name: &str,
    charges: &[Entry<'_>],
) -> Result<(), ChargeError> {
    let deadline = Instant::now() + COMMIT_DEADLINE;
    while Instant::now() < deadline {
        let quota = api.get(name).await?;
        let updated = with_charges(&quota, charges, Direction::Remove)?;
        match replace_status(api, &updated).await {
            Ok(stored) => {
                cache.write(|state| state.apply_quota(stored));
                return Ok(());
            }
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
            Err(error) => return Err(error.into()),
        }
    }
    Err(ChargeError::Contended(name.to_string()))
}

#[cfg(test)]
#[path = "quota_writer_tests.rs"]
mod tests;
