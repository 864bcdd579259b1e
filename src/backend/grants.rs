//! API mode: the grants this replica holds (docs/design.md, "Grants"; the arithmetic is
//! `quota::grant`). Far from `hard`, an admission is decided on the cache's copy of its
//! quotas with the room this replica holds counted as free, and admitted without a write
//! when every quota that lists what it charges is a `Deny` quota outside any cohort and a
//! grant of ours covers it. One keeper task per namespace writes everything else: it takes
//! a grant after an admission that had to write, moves admitted charges into the pending
//! totals, and gives back what is idle, ending, or wanted by a denial waiting on it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use foldhash::HashMap;
use kube::Client;
use kube::api::{Api, PostParams};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tracing::Instrument;

use crate::cache::CacheWriter;
use crate::placement::models::WantedModels;
use crate::placement::quantity::Milli;
use crate::quota::grant::{self, Admitted, GrantWrite};
use crate::quota::pending::{CreatedSecond, now_second};
use crate::quota::status::views_with_status;
use crate::quota::{AdmitRules, Charge, Costs, GPUQuota, ModelAmounts, OnExceed, QuotaView, admit};

/// How often the keeper moves admitted charges into the pending totals.
const TICK: Duration = Duration::from_millis(200);
/// A grant nobody admitted from for this long is given back.
const IDLE: Duration = Duration::from_millis(600);
/// A grant holds at most this share of the room left (`hard` − `used`) when it is taken...
const SHARE: u64 = 8;
/// ...and at most this many of the charges it is taken for; it is not taken for fewer
/// than [`MIN_CHARGES`] (near `hard`, every admission writes).
const MAX_CHARGES: u64 = 32;
const MIN_CHARGES: u64 = 2;
/// How long the keeper's write may keep losing races before its grants are abandoned
/// (they lapse: `quota::grant`).
const WRITE_DEADLINE: Duration = Duration::from_secs(5);

/// A grant this replica holds in one quota, for one quota key.
#[derive(Debug)]
struct Held {
    quota: String,
    model: String,
    id: String,
    until: CreatedSecond,
    /// Room not admitted from yet.
    remaining: Milli,
    /// Charges admitted from it, not yet moved into the pending totals, per second.
    admitted: BTreeMap<CreatedSecond, (Milli, u32)>,
    last_used: Instant,
    /// Taken for charges of this amount: given back when less than one is left.
    unit: Milli,
    /// What was taken: another is taken when less than a quarter of it is left.
    taken: Milli,
    /// Another was asked for already.
    renewed: bool,
    /// Given back (or being given back): admits nothing more.
    closing: bool,
}

impl Held {
    fn open(&self, now: CreatedSecond) -> bool {
        !self.closing && now < self.until - grant::MARGIN.as_secs() as i64
    }

    /// Whether it is time to take the next grant, before this one runs out.
    fn running_low(&self) -> bool {
        !self.renewed && self.remaining.0.saturating_mul(4) < self.taken.0
    }

    fn unmoved(&self) -> Vec<Admitted> {
        let admitted = self.admitted.iter();
        admitted.map(|(s, (a, p))| (*s, *a, *p)).collect()
    }
}

/// What one namespace's keeper has to do besides moving charges.
#[derive(Debug, Default)]
struct Namespace {
    held: Vec<Held>,
    /// Quota keys an admission had to write for: (quota, key, the charge).
    wanted: Vec<(String, String, Milli)>,
    /// A denial waits on grants: give ours back, take none for a while.
    yield_until: Option<Instant>,
    keeper: bool,
    /// Wakes the keeper before its tick: a grant to take, or one running low.
    wake: Arc<Notify>,
}

/// The grants of this process.
pub(crate) struct Grants {
    client: Client,
    process: u128,
    count: AtomicU64,
    namespaces: Mutex<HashMap<String, Namespace>>,
}

impl Grants {
    pub(crate) fn new(client: Client) -> Arc<Self> {
        let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        Arc::new(Grants {
            client,
            process: since.map_or(0, |d| d.as_nanos()) ^ u128::from(std::process::id()),
            count: AtomicU64::new(0),
            namespaces: Mutex::new(HashMap::default()),
        })
    }

    /// Admit a pod of `namespace` created in second `created`, wanting `wanted` at
    /// `costs`, from a grant of ours, without a write; `false` when it takes the writer's
    /// path (the caller's to decide: a dry run or a queue release always does).
    pub(crate) fn admit(
        &self,
        cache: &CacheWriter,
        namespace: &str,
        (wanted, costs, rules): (&WantedModels, &Costs, AdmitRules),
        created: CreatedSecond,
    ) -> bool {
        self.try_admit(cache, namespace, (wanted, costs, rules), created)
            .is_some()
    }

    fn try_admit(
        &self,
        cache: &CacheWriter,
        namespace: &str,
        (wanted, costs, rules): (&WantedModels, &Costs, AdmitRules),
        created: CreatedSecond,
    ) -> Option<()> {
        let now = now_second();
        let mut namespaces = self.namespaces.lock();
        let held = &mut namespaces.get_mut(namespace)?.held;
        if !held.iter().any(|h| h.open(now)) {
            return None;
        }
        let quotas: Vec<GPUQuota> =
            cache.read(|state| state.namespace_quotas(namespace).cloned().collect());
        let mut views = views_with_status(&quotas).ok()?;
        for view in &mut views {
            for h in held.iter().filter(|h| h.open(now) && h.quota == view.name) {
                if let Some(used) = view.used.get_mut(&h.model) {
                    used.0 = used.0.saturating_sub(h.remaining.0);
                }
            }
        }
        let charged = admit(namespace, &views, wanted, costs, rules);
        let Ok(Charge::Model { charge, over, .. }) = charged else {
            return None;
        };
        let covering = covering(&views, held, &charge, now).filter(|_| over.is_empty())?;
        let at = Instant::now();
        let mut low = false;
        for (index, amount) in covering {
            let h = &mut held[index];
            h.remaining.0 -= amount.0;
            let total = h.admitted.entry(created).or_default();
            *total = (Milli(total.0.0 + amount.0), total.1 + 1);
            h.last_used = at;
            low |= h.running_low();
        }
        if low {
            namespaces[namespace].wake.notify_one();
        }
        Some(())
    }

    /// An admission had to write its charge: the keeper may take grants for it.
    pub(crate) fn wanted(
        self: &Arc<Self>,
        cache: &CacheWriter,
        namespace: &str,
        views: &[QuotaView],
        charge: &ModelAmounts,
    ) {
        let now = Instant::now();
        let mut namespaces = self.namespaces.lock();
        let known = namespaces.get(namespace);
        if known.is_some_and(|ns| ns.yield_until.is_some_and(|until| now < until)) {
            return;
        }
        let asked = |quota: &str, key: &str| {
            known.is_some_and(|ns| {
                let held = ns.held.iter().any(|h| h.quota == quota && h.model == key);
                held || ns.wanted.iter().any(|(q, k, _)| q == quota && k == key)
            })
        };
        let mut wanted = Vec::new();
        for (key, amount) in charge {
            for view in views.iter().filter(|v| grantable(v, key)) {
                if !asked(&view.name, key) {
                    wanted.push((view.name.clone(), key.clone(), *amount));
                }
            }
        }
        if wanted.is_empty() {
            return;
        }
        let ns = namespaces.entry(namespace.to_string()).or_default();
        ns.wanted.append(&mut wanted);
        ns.wake.notify_one();
        self.start_keeper(ns, cache, namespace);
    }

    /// A denial in `namespace` waits while grants hold room: give ours back now.
    pub(crate) fn yield_to_denial(self: &Arc<Self>, cache: &CacheWriter, namespace: &str) {
        let mut namespaces = self.namespaces.lock();
        let Some(ns) = namespaces.get_mut(namespace) else {
            return;
        };
        ns.yield_until = Some(Instant::now() + 5 * IDLE);
        ns.wanted.clear();
        if !ns.held.is_empty() {
            ns.wake.notify_one();
            self.start_keeper(ns, cache, namespace);
        }
    }

    fn start_keeper(self: &Arc<Self>, ns: &mut Namespace, cache: &CacheWriter, namespace: &str) {
        if std::mem::replace(&mut ns.keeper, true) {
            return;
        }
        let (grants, cache, namespace) = (self.clone(), cache.clone(), namespace.to_string());
        let wake = ns.wake.clone();
        // Not the admission's span: the keeper outlives the request that started it.
        let span = tracing::info_span!(parent: None, "grant_keeper", %namespace);
        let keep = async move { grants.keep(&cache, &namespace, &wake).await };
        tokio::spawn(keep.instrument(span));
    }

    /// The keeper of one namespace: runs while it holds grants or has some to take.
    async fn keep(&self, cache: &CacheWriter, namespace: &str, wake: &Notify) {
        let api: Api<GPUQuota> = Api::namespaced(self.client.clone(), namespace);
        loop {
            let Some(plans) = self.plan(namespace) else {
                return;
            };
            for plan in plans {
                let outcome = self.write(&api, cache, &plan).await;
                self.settled(namespace, &plan, outcome);
            }
            let _ = tokio::time::timeout(TICK, wake.notified()).await;
        }
    }

    /// What to write, per quota; `None` (the keeper ends) when there is nothing left.
    fn plan(&self, namespace: &str) -> Option<Vec<Plan>> {
        let (now, wall) = (Instant::now(), now_second());
        let mut namespaces = self.namespaces.lock();
        let ns = namespaces.get_mut(namespace)?;
        let yielding = ns.yield_until.is_some_and(|until| now < until);
        let mut plans: Vec<Plan> = Vec::new();
        let plan_for = |plans: &mut Vec<Plan>, quota: &str| -> usize {
            match plans.iter().position(|p| p.quota == quota) {
                Some(at) => at,
                None => {
                    plans.push(Plan::new(quota));
                    plans.len() - 1
                }
            }
        };
        for h in &mut ns.held {
            let ending = wall + 1 >= h.until - grant::MARGIN.as_secs() as i64;
            let spent = h.remaining < h.unit;
            let idle = now.duration_since(h.last_used) >= IDLE;
            let again = !(yielding || idle);
            if again && !h.closing && !h.renewed && (ending || spent || h.running_low()) {
                // The next one is taken while this one still admits.
                h.renewed = true;
                ns.wanted.push((h.quota.clone(), h.model.clone(), h.unit));
            }
            if !h.closing && (yielding || ending || spent || idle) {
                h.closing = true;
            }
            let give_back = if h.closing { h.remaining } else { Milli(0) };
            if h.admitted.is_empty() && !h.closing {
                continue;
            }
            let at = plan_for(&mut plans, &h.quota);
            plans[at]
                .settles
                .push((h.id.clone(), h.unmoved(), give_back));
        }
        if yielding {
            ns.wanted.clear();
        }
        for (quota, model, unit) in ns.wanted.drain(..) {
            let at = plan_for(&mut plans, &quota);
            let count = self.count.fetch_add(1, Ordering::Relaxed);
            let id = format!("{:x}.{count}", self.process);
            let until = wall + grant::LIFE.as_secs() as i64;
            plans[at].takes.push(Take {
                id,
                model,
                unit,
                until,
            });
        }
        if plans.is_empty() && ns.held.is_empty() {
            namespaces.remove(namespace);
            return None;
        }
        Some(plans)
    }

    /// Write one quota's plan: on the cache's copy, then on fresh copies while it loses
    /// races. `Ok(taken)`: the amounts taken (by take index; zero: not taken).
    async fn write(
        &self,
        api: &Api<GPUQuota>,
        cache: &CacheWriter,
        plan: &Plan,
    ) -> Result<Vec<Milli>, Lost> {
        let deadline = Instant::now() + WRITE_DEADLINE;
        let name = plan.quota.as_str();
        let mut quota = cache.read(|state| {
            let mut quotas = state.namespace_quotas(api_namespace(api));
            quotas
                .find(|q| q.metadata.name.as_deref() == Some(name))
                .cloned()
        });
        while Instant::now() < deadline {
            let Some(current) = quota.take() else {
                match api.get_opt(name).await {
                    Ok(Some(fresh)) => quota = Some(fresh),
                    Ok(None) => return Err(Lost::Gone),
                    Err(_) => return Err(Lost::Unwritten),
                }
                continue;
            };
            let taken: Vec<Milli> = plan
                .takes
                .iter()
                .map(|t| take_amount(&current, t))
                .collect();
            // The charges to move are the plan's own: nothing is copied per attempt.
            let mut writes: Vec<GrantWrite<'_>> = plan
                .settles
                .iter()
                .map(|(id, admitted, give_back)| GrantWrite::Settle {
                    id,
                    admitted,
                    give_back: *give_back,
                })
                .collect();
            for (take, amount) in plan.takes.iter().zip(&taken) {
                if amount.0 > 0 {
                    writes.push(GrantWrite::Take {
                        id: &take.id,
                        model: &take.model,
                        amount: *amount,
                        until: take.until,
                    });
                }
            }
            if writes.is_empty() {
                return Ok(taken);
            }
            let updated = grant::with_grant_writes(&current, &writes).map_err(|error| {
                tracing::warn!(%error, "grant not written");
                Lost::Gone
            })?;
            match api
                .replace_status(name, &PostParams::default(), &updated)
                .await
            {
                Ok(stored) => {
                    cache.write(|state| state.apply_quota(stored));
                    return Ok(taken);
                }
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(kube::Error::Api(status)) if status.code == 404 => return Err(Lost::Gone),
                // No connection: nothing was stored, the grants stand as the quota holds
                // them (and admit until their `until`); tried again at the next tick.
                Err(error) if crate::api_client::never_sent(&error) => {
                    tracing::debug!(%error, quota = name, "grant write not sent");
                    return Err(Lost::Unwritten);
                }
                Err(error) => {
                    tracing::warn!(%error, quota = name, "grant write failed; its grants lapse");
                    return Err(Lost::Unsure);
                }
            }
        }
        Err(Lost::Unwritten)
    }

    /// Bring what was written (or lost) into the held grants.
    fn settled(&self, namespace: &str, plan: &Plan, outcome: Result<Vec<Milli>, Lost>) {
        let mut namespaces = self.namespaces.lock();
        let Some(ns) = namespaces.get_mut(namespace) else {
            return;
        };
        let taken = match outcome {
            Ok(taken) => taken,
            // Tried again at the next tick.
            Err(Lost::Unwritten) => return,
            // Not known to be written, or the quota is gone: these grants admit nothing
            // more and are never written again; what they hold lapses (`quota::grant`).
            Err(Lost::Unsure | Lost::Gone) => {
                ns.held
                    .retain(|h| !plan.settles.iter().any(|(id, ..)| *id == h.id));
                return;
            }
        };
        for (id, moved, _) in &plan.settles {
            let Some(at) = ns.held.iter().position(|h| h.id == *id) else {
                continue;
            };
            let h = &mut ns.held[at];
            for (second, amount, pods) in moved {
                if let Some(total) = h.admitted.get_mut(second) {
                    *total = (Milli(total.0.0 - amount.0), total.1 - pods);
                    if total.1 == 0 {
                        h.admitted.remove(second);
                    }
                }
            }
            if h.closing && h.admitted.is_empty() {
                ns.held.remove(at);
            }
        }
        let now = Instant::now();
        for (take, amount) in plan.takes.iter().zip(taken) {
            if amount.0 == 0 {
                continue;
            }
            ns.held.push(Held {
                quota: plan.quota.clone(),
                model: take.model.clone(),
                id: take.id.clone(),
                until: take.until,
                remaining: amount,
                admitted: BTreeMap::new(),
                last_used: now,
                unit: take.unit,
                taken: amount,
                renewed: false,
                closing: false,
            });
        }
    }
}

/// Whether a quota's room for `key` may be held in grants: a `Deny` quota outside any
/// cohort that lists it (a `Warn` or `Queue` quota, and borrowing, take the exact path).
fn grantable(view: &QuotaView, key: &str) -> bool {
    view.on_exceed == OnExceed::Deny && view.cohort.is_none() && view.hard.contains_key(key)
}

/// The grants (by index in `held`) that cover `charge`, with the amount each gives, when
/// every quota that lists a charged key may be granted and an open grant of ours in it
/// covers the key; `None` otherwise (or when no quota lists any key).
fn covering(
    views: &[QuotaView],
    held: &[Held],
    charge: &ModelAmounts,
    now: CreatedSecond,
) -> Option<Vec<(usize, Milli)>> {
    let mut covering = Vec::new();
    for (key, amount) in charge {
        for view in views.iter().filter(|v| v.hard.contains_key(key)) {
            if !grantable(view, key) {
                return None;
            }
            let index = held.iter().position(|h| {
                h.open(now) && h.quota == view.name && h.model == *key && h.remaining >= *amount
            })?;
            covering.push((index, *amount));
        }
    }
    (!covering.is_empty()).then_some(covering)
}

/// How much to take for `take` from `quota` as it stands: a share of the room left,
/// whole charges of the size it is taken for; zero when that is too little.
fn take_amount(quota: &GPUQuota, take: &Take) -> Milli {
    let Ok(views) = views_with_status(std::slice::from_ref(quota)) else {
        return Milli(0);
    };
    let Some(view) = views.first().filter(|v| grantable(v, &take.model)) else {
        return Milli(0);
    };
    let hard = view.hard.get(&take.model).copied().unwrap_or_default();
    let used = view.used.get(&take.model).copied().unwrap_or_default();
    let unit = take.unit.0.max(1);
    let charges = (hard.0.saturating_sub(used.0) / SHARE / unit).min(MAX_CHARGES);
    if charges < MIN_CHARGES {
        return Milli(0);
    }
    Milli(charges * unit)
}

fn api_namespace(api: &Api<GPUQuota>) -> &str {
    api.namespace().unwrap_or_default()
}

/// One quota's write: grants settled (id, charges to move, amount given back) and taken.
struct Plan {
    quota: String,
    settles: Vec<(String, Vec<Admitted>, Milli)>,
    takes: Vec<Take>,
}

impl Plan {
    fn new(quota: &str) -> Self {
        Plan {
            quota: quota.to_string(),
            settles: Vec::new(),
            takes: Vec::new(),
        }
    }
}

struct Take {
    id: String,
    model: String,
    unit: Milli,
    until: CreatedSecond,
}

/// Why a plan was not written.
#[derive(Debug)]
enum Lost {
    /// The quota is gone (or unreadable): its grants went with it.
    Gone,
    /// The write may or may not have been stored.
    Unsure,
    /// Nothing was written (a read failed, no connection could be made, or every write
    /// lost its race).
    Unwritten,
}

#[cfg(test)]
#[path = "grants_tests.rs"]
mod tests;
