//! Cohorts (docs/quota.md, "Cohorts"), pure: GPUQuotas with the same `cohort` lend each
//! other what they leave unused, one GPU model at a time.
//!
//! The arithmetic is a shared pool, as Kueue's cohorts have it. Of its `hard`, a member
//! *guarantees* itself `hard - lendingLimit` (all of `hard` may be lent when no limit is
//! set); the rest is *lendable* and goes into the cohort's pool. A member that uses more
//! than its guaranteed part draws the excess from the pool, and the pool is never
//! overdrawn. From that one rule follow:
//!
//! - the cohort never uses more than its members own (the guaranteed parts plus the pool);
//! - what the borrowers use past their `hard` is at most what the others leave unused of
//!   their lendable parts, so no member lends more than its `lendingLimit`;
//! - a member's guaranteed part is always its own.
//!
//! A member taking back what it lent (using its lendable part while others borrow it) is
//! [`Reclaim`]: with `Evict` it gets it at once and the borrowers' pods are evicted until
//! the pool is whole again ([`reclaim`]); with `Never` it waits for them to finish.

use std::collections::BTreeMap;

use crate::placement::quantity::Milli;

use super::ModelAmounts;
use super::{GPUQuota, StatusError, quota_name};

/// The annotation on a pod whose GPUs its namespace borrows from its cohort, naming the
/// model: the member's pods reclaim would take first, as many as its use past `hard`
/// (see [`borrowing_pods`](super::pool::borrowing_pods)). For people and tools to read; nothing charges by it.
pub(crate) use crate::marks::BORROWED_ANNOTATION;

/// How a member takes back what it lent.
#[derive(
    serde::Deserialize,
    serde::Serialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    schemars::JsonSchema,
)]
pub(crate) enum Reclaim {
    /// Its pod is admitted (or let go) at once, and borrowing pods are evicted.
    #[default]
    Evict,
    /// Its pod waits (`Queue`) or is refused (`Deny`) until the borrowers finish.
    Never,
}

impl Reclaim {
    pub(super) fn is_evict(&self) -> bool {
        *self == Reclaim::Evict
    }
}

/// One member's standing in its cohort, for one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Share {
    pub(crate) hard: Milli,
    pub(crate) used: Milli,
    /// How far past `hard` it may go; `None`: as far as the pool allows.
    pub(crate) borrowing_limit: Option<Milli>,
    /// How much of its `hard` it lends at most; `None`: all of it.
    pub(crate) lending_limit: Option<Milli>,
}

impl Share {
    /// What no other member can ever use.
    fn guaranteed(&self) -> Milli {
        Milli(self.hard.0 - self.lendable().0)
    }

    /// What this member puts in the cohort's pool.
    pub(super) fn lendable(&self) -> Milli {
        Milli(self.lending_limit.unwrap_or(self.hard).0.min(self.hard.0))
    }

    /// What it draws from the pool: its use past its guaranteed part.
    pub(crate) fn drawn(&self) -> Milli {
        Milli(self.used.0.saturating_sub(self.guaranteed().0))
    }

    /// Its use past its own `hard`.
    pub(super) fn borrowed(&self) -> Milli {
        Milli(self.used.0.saturating_sub(self.hard.0))
    }

    /// What it leaves for others to borrow: its lendable part less what it uses of it.
    pub(super) fn lends(&self) -> Milli {
        Milli(self.lendable().0.saturating_sub(self.drawn().0))
    }
}

/// A cohort's pool, for one model: what its members lend, and what is drawn from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Pool {
    pub(crate) size: u128,
    pub(crate) drawn: u128,
}

impl Pool {
    pub(crate) fn of<'a>(shares: impl IntoIterator<Item = &'a Share>) -> Pool {
        shares
            .into_iter()
            .fold(Pool::default(), |pool, share| Pool {
                size: pool.size + u128::from(share.lendable().0),
                drawn: pool.drawn + u128::from(share.drawn().0),
            })
    }

    /// What may still be drawn.
    fn free(&self) -> u128 {
        self.size.saturating_sub(self.drawn)
    }

    /// How far it is overdrawn (a member took back what it lent, `reclaim: Evict`).
    pub(crate) fn overdrawn(&self) -> u128 {
        self.drawn.saturating_sub(self.size)
    }
}

/// How a charge fits a member of a cohort.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fits {
    /// Within its own `hard`.
    Own,
    /// Past its own `hard`: this much of the charge is borrowed.
    Borrowing(Milli),
}

/// Why a cohort has no room for a member's charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Short {
    /// Past `hard` by more than its `borrowingLimit`.
    BorrowingLimit { limit: Milli },
    /// Past `hard`, and the others lend less than that.
    NothingToBorrow { free: Milli },
    /// Within `hard`, but others borrow what it lent (`reclaim: Never`).
    Lent { free: Milli },
}

/// What a person reads after the quota's own refusal.
impl std::fmt::Display for Short {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Short::BorrowingLimit { limit } => write!(f, "borrowing limit {limit} reached"),
            Short::NothingToBorrow { free } => write!(f, "the other members lend {free} more"),
            Short::Lent { free } => write!(
                f,
                "its own quota is lent to other members (reclaim: Never; {free} free to lend)"
            ),
        }
    }
}

/// Whether `share` may be charged `amount` more, in a cohort whose pool is `pool` (which
/// counts `share` among its members).
pub(super) fn fits(
    share: &Share,
    pool: &Pool,
    amount: Milli,
    reclaim: Reclaim,
) -> Result<Fits, Short> {
    let after = share.used.0.saturating_add(amount.0);
    let guaranteed = share.guaranteed().0;
    let drawn = after.saturating_sub(guaranteed) - share.drawn().0;
    let free = pool.free();
    let free_milli = Milli(u64::try_from(free).unwrap_or(u64::MAX));
    if after <= share.hard.0 {
        return if reclaim.is_evict() || u128::from(drawn) <= free {
            Ok(Fits::Own)
        } else {
            Err(Short::Lent { free: free_milli })
        };
    }
    let past = after - share.hard.0;
    if let Some(limit) = share.borrowing_limit.filter(|limit| past > limit.0) {
        return Err(Short::BorrowingLimit { limit });
    }
    if u128::from(drawn) > free {
        return Err(Short::NothingToBorrow { free: free_milli });
    }
    Ok(Fits::Borrowing(Milli(past - share.borrowed().0)))
}

/// How far a borrowing pod already is on its way to giving its GPUs back: reclaim takes
/// pods in this order, so it never chooses a new pod while one already leaving, or one
/// it may evict within its PodDisruptionBudget, would do (docs/quota.md, "The reclaim
/// bound").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(crate) enum Standing {
    /// Being deleted: it gives its GPUs back without another eviction.
    Leaving,
    /// May be evicted, as far as reclaim knows.
    #[default]
    Evictable,
    /// A PodDisruptionBudget refused its eviction lately.
    Protected,
}

/// A pod that borrows, as reclaim chooses among them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Borrower<K> {
    pub(crate) key: K,
    /// Index of its member in the shares given to [`reclaim`].
    pub(crate) member: usize,
    pub(crate) priority: i32,
    /// When it was admitted (or let go), in seconds: the most recent goes first.
    pub(crate) admitted: i64,
    pub(crate) amount: Milli,
    pub(crate) standing: Standing,
}

/// The pods to take back so the pool is no longer overdrawn: by [`Standing`] (leaving
/// first, protected last), then lowest priority first, then the most recently
/// admitted, each only while its member still borrows. Fewer than needed when the
/// candidates do not suffice.
pub(crate) fn reclaim<'a, K>(
    shares: &[Share],
    candidates: &'a [Borrower<K>],
) -> Vec<&'a Borrower<K>> {
    let mut shares = shares.to_vec();
    let mut order: Vec<&Borrower<K>> = candidates.iter().collect();
    order.sort_by_key(|b| (b.standing, b.priority, std::cmp::Reverse(b.admitted)));
    let mut chosen = Vec::new();
    for pod in order {
        if Pool::of(&shares).overdrawn() == 0 {
            break;
        }
        let Some(share) = shares.get_mut(pod.member) else {
            continue;
        };
        if share.borrowed().0 == 0 {
            continue;
        }
        share.used = Milli(share.used.0.saturating_sub(pod.amount.0));
        chosen.push(pod);
    }
    chosen
}

/// A quota's place in its cohort (`quota::cohort`): its limits and the cohort's pools.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct CohortTerms {
    pub(crate) name: String,
    /// Per model, how far past `hard` it may go; a model not listed: no limit.
    pub(crate) borrowing_limit: ModelAmounts,
    /// Per model, how much of its `hard` it lends; a model not listed: all of it.
    pub(crate) lending_limit: ModelAmounts,
    pub(crate) reclaim: Reclaim,
    /// Per model, the cohort's pool, this quota's own part included.
    pub(crate) pools: BTreeMap<String, Pool>,
}

impl CohortTerms {
    /// The terms `quota` sets (`None` without a cohort), its pools still empty: see
    /// [`attach_pools`](super::pool::attach_pools).
    pub(super) fn from_crd(quota: &GPUQuota) -> Result<Option<Self>, StatusError> {
        let Some(name) = quota.spec.cohort.clone() else {
            return Ok(None);
        };
        let limits = |field: &str, amounts: &BTreeMap<String, _>| {
            let mut parsed = ModelAmounts::new();
            for (model, quantity) in amounts {
                let quantity: &k8s_openapi::apimachinery::pkg::api::resource::Quantity = quantity;
                let amount = Milli::parse(&quantity.0).map_err(|e| StatusError {
                    quota: quota_name(quota),
                    reason: format!("spec.{field}.{model}: {e}"),
                })?;
                parsed.insert(model.clone(), amount);
            }
            Ok::<_, StatusError>(parsed)
        };
        Ok(Some(CohortTerms {
            name,
            borrowing_limit: limits("borrowingLimit", &quota.spec.borrowing_limit)?,
            lending_limit: limits("lendingLimit", &quota.spec.lending_limit)?,
            reclaim: quota.spec.reclaim,
            pools: BTreeMap::new(),
        }))
    }

    /// This quota's standing for `model` (a model: MIG profile keys are not lent).
    pub(super) fn share(&self, model: &str, hard: Milli, used: Milli) -> Share {
        Share {
            hard,
            used,
            borrowing_limit: self.borrowing_limit.get(model).copied(),
            lending_limit: self.lending_limit.get(model).copied(),
        }
    }
}

#[cfg(test)]
#[path = "cohort_tests.rs"]
mod tests;
