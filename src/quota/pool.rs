//! A cohort's pools as its members' quota views make them (docs/quota.md, "Cohorts"),
//! pure: which cohorts views belong to, each pool's size and what is drawn from it,
//! what each member lends, and which pods reclaim takes back. The arithmetic of one
//! share and one pool is `quota::cohort`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::placement::mig;
use crate::placement::quantity::Milli;

use super::charge::ModelAmounts;
use super::cohort::{Borrower, Pool, Share, Standing, reclaim};
use super::view::QuotaView;

/// One pod as [`reclaim_plan`] sees it: its key, priority, creation second and charge.
type MemberPod<K> = (K, i32, i64, Milli);

/// What reclaim does in one cohort for one model: the pods to take back (with their
/// member's index), and the members taking back what they lent (using their lendable
/// part within their own `hard`), for the Events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReclaimPlan<K> {
    pub(crate) evict: Vec<(K, usize)>,
    pub(crate) by: Vec<usize>,
}

/// The pods to take back so that `members` (one cohort) are back within what they own
/// of `model`, each member's use counted from its charged pods (`pods[i]`, of member
/// `i`, those being deleted included: they hold their GPUs until they are gone), in the
/// order [`reclaim`](super::cohort::reclaim) gives with each pod's `standing`. A pod already leaving is chosen
/// before any other, so its charge is never taken back twice. Counting from pods rather
/// than from the ledger leaves out what is still being created, so a plan can only take
/// too few (the next one takes the rest), never too many.
pub(crate) fn reclaim_plan<K: Clone>(
    members: &[QuotaView],
    model: &str,
    pods: &[Vec<MemberPod<K>>],
    standing: impl Fn(&K) -> Standing,
) -> ReclaimPlan<K> {
    let shares: Vec<Share> = members
        .iter()
        .zip(pods)
        .map(|(member, pods)| {
            let used = Milli(pods.iter().map(|p| p.3.0).sum());
            let hard = member.hard.get(model).copied().unwrap_or_default();
            match member.cohort.as_ref() {
                Some(terms) => terms.share(model, hard, used),
                None => Share::default(),
            }
        })
        .collect();
    let by = (0..shares.len())
        .filter(|&i| shares[i].used.0 <= shares[i].hard.0 && shares[i].drawn().0 > 0)
        .collect();
    if Pool::of(&shares).overdrawn() == 0 {
        return ReclaimPlan { evict: vec![], by };
    }
    let candidates: Vec<Borrower<K>> = (0..shares.len())
        .filter(|&i| shares[i].borrowed().0 > 0)
        .flat_map(|i| {
            let standing = &standing;
            pods[i]
                .iter()
                .map(move |(key, priority, created, amount)| Borrower {
                    key: key.clone(),
                    member: i,
                    priority: *priority,
                    admitted: *created,
                    amount: *amount,
                    standing: standing(key),
                })
        })
        .collect();
    let evict = reclaim(&shares, &candidates)
        .into_iter()
        .map(|b| (b.key.clone(), b.member))
        .collect();
    ReclaimPlan { evict, by }
}

/// The pods of `member` that borrow `model`: of its pods (`pods`), those reclaim would take
/// first (lowest priority, then the most recently created), until they cover its use past
/// its own `hard`.
pub(crate) fn borrowing_pods<K: Clone>(
    member: &QuotaView,
    model: &str,
    pods: &[MemberPod<K>],
) -> Vec<K> {
    let used: u64 = pods.iter().map(|p| p.3.0).sum();
    let hard = member.hard.get(model).copied().unwrap_or_default().0;
    let mut past = used.saturating_sub(hard);
    let mut order: Vec<&MemberPod<K>> = pods.iter().collect();
    order.sort_by_key(|(_, priority, created, _)| (*priority, std::cmp::Reverse(*created)));
    let mut borrowing = Vec::new();
    for (key, _, _, amount) in order {
        if past == 0 {
            break;
        }
        past = past.saturating_sub(amount.0);
        borrowing.push(key.clone());
    }
    borrowing
}

/// The cohorts `views` belong to.
pub(crate) fn cohorts_of(views: &[QuotaView]) -> BTreeSet<String> {
    views
        .iter()
        .filter_map(|v| v.cohort.as_ref().map(|t| t.name.clone()))
        .collect()
}

/// Each member's standing per model (MIG profile keys are caps, not lent), with its use.
fn shares(member: &QuotaView) -> impl Iterator<Item = (&String, Share)> {
    let terms = member.cohort.as_ref();
    let listed = member
        .hard
        .iter()
        .filter(|(key, _)| !mig::is_profile_key(key));
    listed.filter_map(move |(model, hard)| {
        let used = member.used.get(model).copied().unwrap_or_default();
        Some((model, terms?.share(model, *hard, used)))
    })
}

/// A cohort's pools, per model, from its members' views (each with its use).
fn pools_of<'a>(members: impl IntoIterator<Item = &'a QuotaView>) -> BTreeMap<String, Pool> {
    let mut pools: BTreeMap<String, Pool> = BTreeMap::new();
    for member in members {
        for (model, share) in shares(member) {
            let pool = pools.entry(model.clone()).or_default();
            pool.size += u128::from(share.lendable().0);
            pool.drawn += u128::from(share.drawn().0);
        }
    }
    pools
}

/// Give each view that belongs to a cohort its cohort's pools, from `members`: every
/// quota of those cohorts, these included, each with its use.
pub(crate) fn attach_pools(views: &mut [QuotaView], members: &[QuotaView]) {
    for view in views.iter_mut() {
        let Some(terms) = view.cohort.as_mut() else {
            continue;
        };
        let name = terms.name.clone();
        terms.pools = pools_of(
            members
                .iter()
                .filter(|m| m.cohort.as_ref().is_some_and(|t| t.name == name)),
        );
    }
}

/// What each quota of `members` lends now, per model, by `namespace/name`: its cohort's
/// borrowing (the members' use past their `hard`) attributed to the lenders in proportion
/// to what each leaves unused of its lendable part. `members`: every quota of the
/// cohorts, each with its use; the totals are summed once per cohort and model.
pub(crate) fn lent_by_quota(members: &[QuotaView]) -> HashMap<String, ModelAmounts> {
    let mut totals: HashMap<(&str, &str), (u128, u128)> = HashMap::new();
    for member in members {
        let Some(terms) = member.cohort.as_ref() else {
            continue;
        };
        for (model, share) in shares(member) {
            let total = totals.entry((&terms.name, model)).or_default();
            total.0 += u128::from(share.borrowed().0);
            total.1 += u128::from(share.lends().0);
        }
    }
    let mut lent_by_quota = HashMap::new();
    for member in members {
        let Some(terms) = member.cohort.as_ref() else {
            continue;
        };
        let mut lent = ModelAmounts::new();
        for (model, share) in shares(member) {
            let (borrowed, idle) = totals[&(terms.name.as_str(), model.as_str())];
            let own_idle = u128::from(share.lends().0);
            if borrowed > 0 && own_idle > 0 {
                let part = (borrowed.min(idle) * own_idle / idle).min(own_idle);
                lent.insert(
                    model.clone(),
                    Milli(u64::try_from(part).unwrap_or(u64::MAX)),
                );
            }
        }
        lent_by_quota.insert(format!("{}/{}", member.namespace, member.name), lent);
    }
    lent_by_quota
}

/// Whether counting `charge` changed what views draw from their cohorts' pools: such a
/// charge needed the cohort's room, so the cohort must agree on it.
pub(crate) fn draws_from_pools(before: &[QuotaView], after: &[QuotaView]) -> bool {
    let drawn = |view: &QuotaView| {
        view.cohort
            .as_ref()
            .map(|t| t.pools.values().map(|p| p.drawn).sum::<u128>())
            .unwrap_or_default()
    };
    before.iter().zip(after).any(|(b, a)| drawn(a) > drawn(b))
}
