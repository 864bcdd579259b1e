//! The quota queue (`onExceed: Queue`, docs/quota.md), pure: in which order pods that
//! wait for quota are let go, and which of them the quotas have room for now.
//!
//! A waiting pod was created with the scheduling gate [`QUOTA_GATE`] and charged nothing.
//! The releaser (`controllers::release`) asks [`plan`] which pods to let go, charges each
//! through the same exact ledger as admission, and only then removes the gate.
//!
//! **The order.** Higher `spec.priority` first, then older `creationTimestamp`, then
//! name. A pod that does not fit is passed over: the smaller pods behind it are let go
//! (no head-of-line blocking). But a pod may be passed over only for
//! `queue.maxPassOverSeconds` after it was created: from then on it is *overdue*. Overdue
//! pods go to the front of the line, oldest first, whatever their priority, and no pod
//! behind an overdue pod that wants one of its models is let go before it is. Room that
//! frees up then accumulates for it, so no pod waits forever behind younger ones.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use crate::placement::models::WantedModels;

use super::admit::{AdmitRules, Charge, admit};
use super::charge::Costs;
use super::denial::Denial;
use super::view::QuotaView;
use super::view::count_charge;

/// The scheduling gate a pod waiting in the quota queue is created with; and the
/// annotation gpu-admission sets when it lets a pod go from the queue: the second (RFC
/// 3339) whose pending total its charge went to (`quota::pending`). Only gpu-admission
/// writes either (`crate::marks`).
pub(crate) use crate::marks::{QUOTA_GATE, RELEASED_ANNOTATION};

/// A pod waiting in its namespace's quota queue, as the order sees it.
#[derive(Debug, Clone)]
pub struct Waiting {
    /// `namespace/name`: the last tie-break, and how the caller finds the pod again.
    pub(crate) key: String,
    pub(crate) uid: String,
    pub(crate) priority: i32,
    /// `creationTimestamp`, unix seconds: when it started waiting.
    pub(crate) created: i64,
    pub(crate) wanted: WantedModels,
    pub(crate) costs: Costs,
}

/// What the queue says about one waiting pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Turn {
    /// Let it go now, with this charge (made before the gate is removed).
    LetGo(Charge),
    /// It keeps waiting: `place` in its namespace's line (1 = next), and why.
    Wait { place: usize, why: WaitReason },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitReason {
    /// The quotas have no room for it (or no longer allow its model).
    NoRoom(Denial),
    /// An overdue pod ahead of it wants the same model: `ahead` is its key.
    Behind { ahead: String },
}

/// How long a pod may be passed over, in seconds (`queue.maxPassOverSeconds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueRules {
    pub max_pass_over: i64,
    pub(crate) admit: AdmitRules,
}

/// Decide, for every pod waiting in `namespace`, whether it is let go now (and with what
/// charge) or keeps waiting, given the namespace's quotas with their usage. The turns are
/// in line order. Each pod let go is charged before the next is decided, so together
/// they never go past a quota.
pub fn plan(
    namespace: &str,
    quotas: &[QuotaView],
    mut waiting: Vec<Waiting>,
    now: i64,
    rules: QueueRules,
) -> Vec<(Waiting, Turn)> {
    line_up(&mut waiting, now, rules.max_pass_over);
    let mut views = quotas.to_vec();
    // Models an overdue pod that did not fit holds for itself, and the first such pod.
    let mut held: BTreeSet<String> = BTreeSet::new();
    let mut holder: Option<String> = None;
    let mut place = 0;
    let mut turns = Vec::with_capacity(waiting.len());
    for pod in waiting {
        let overdue = is_overdue(&pod, now, rules.max_pass_over);
        let turn = if let Some(ahead) = holder
            .as_ref()
            .filter(|_| pod.wanted.models.iter().any(|m| held.contains(m)))
        {
            WaitReason::Behind {
                ahead: ahead.clone(),
            }
        } else {
            match admit(namespace, &views, &pod.wanted, &pod.costs, rules.admit) {
                Ok(charge) => {
                    if let Charge::Model { charge, .. } = &charge {
                        count_charge(&mut views, charge); // at placement: counted then
                    }
                    turns.push((pod, Turn::LetGo(charge)));
                    continue;
                }
                Err(denial) => WaitReason::NoRoom(denial),
            }
        };
        if overdue {
            held.extend(pod.wanted.models.iter().cloned());
            holder.get_or_insert_with(|| pod.key.clone());
        }
        place += 1;
        turns.push((pod, Turn::Wait { place, why: turn }));
    }
    turns
}

fn is_overdue(pod: &Waiting, now: i64, max_pass_over: i64) -> bool {
    now.saturating_sub(pod.created) >= max_pass_over
}

/// Where a waiting pod stands in its namespace's line: overdue pods first, oldest
/// first; then the rest by priority (higher first), age (older first) and key. The one
/// line order: [`line_up`] sorts by it, and the cache's index keeps its lines in it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum LinePlace<K> {
    Overdue {
        created: i64,
        key: K,
    },
    OnTime {
        priority: Reverse<i32>,
        created: i64,
        key: K,
    },
}

impl<K> LinePlace<K> {
    pub(crate) fn of(priority: i32, created: i64, key: K, overdue: bool) -> Self {
        match overdue {
            true => LinePlace::Overdue { created, key },
            false => LinePlace::OnTime {
                priority: Reverse(priority),
                created,
                key,
            },
        }
    }

    pub(crate) fn created(&self) -> i64 {
        match self {
            LinePlace::Overdue { created, .. } | LinePlace::OnTime { created, .. } => *created,
        }
    }

    pub(crate) fn key(&self) -> &K {
        match self {
            LinePlace::Overdue { key, .. } | LinePlace::OnTime { key, .. } => key,
        }
    }
}

/// Sort into line order ([`LinePlace`]) for second `now`.
pub(crate) fn line_up(waiting: &mut [Waiting], now: i64, max_pass_over: i64) {
    fn place(pod: &Waiting, now: i64, max_pass_over: i64) -> LinePlace<&str> {
        let overdue = is_overdue(pod, now, max_pass_over);
        LinePlace::of(pod.priority, pod.created, pod.key.as_str(), overdue)
    }
    waiting.sort_by(|a, b| place(a, now, max_pass_over).cmp(&place(b, now, max_pass_over)));
}
