//! A defragmentation plan's holds, as the pending pod carries them (docs/defrag.md,
//! "Holds"): the mover writes them onto the pod it makes room for, in one annotation,
//! so every replica's extender keeps the freed GPUs for that pod and each moved pod's
//! destination for its replacement. Only gpu-admission may set or change the annotation
//! (`crate::marks`: the webhooks drop it from a new pod and refuse anyone else's
//! change), and a hold counts only while it can be honest (docs/security.md): read only
//! under `defrag.mode: Evict`, for at most `defrag.holdSeconds` from its `since`, which
//! is neither before its pod was created nor ahead of the clock, while its pod is charged.
//!
//! The tenant whose pod carries the annotation reads it: it names no other namespace's
//! pods. A slot keeps digests of the moved pod's uid and of what its replacement is
//! (namespace, controller uid, GPU request), never the pods themselves.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::placement::{Assignment, GpuRequest, NodeGpus};

/// The annotation that carries a plan's holds on the pending pod (`crate::marks`).
pub(crate) use crate::marks::PLAN_HOLD_ANNOTATION;

/// An annotation longer than this is not read: a real plan's is a few hundred bytes.
const MAX_TEXT: usize = 8 * 1024;
/// At most this many destinations (the most moves a plan may make), and GPUs per hold.
const MAX_SLOTS: usize = 4;
const MAX_GPUS: usize = 64;
/// How far ahead of this replica's clock a hold's `since` may be (the mover's clock may
/// run a little ahead of ours): a hold stands until at most this plus
/// `defrag.holdSeconds` from now.
const CLOCK_SKEW: i64 = 30;

/// The holds one plan keeps until `until` (unix seconds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PlanHold {
    /// The GPU model the plan is for.
    pub(crate) model: String,
    /// When the plan started: a replacement is a pod created at or after it.
    pub(crate) since: i64,
    pub(crate) until: i64,
    /// The GPUs freed for the pending pod.
    pub(crate) target: GpusKept,
    /// Where each moved pod's replacement goes.
    pub(crate) slots: Vec<Slot>,
}

/// GPU use kept on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GpusKept {
    pub(crate) node: String,
    pub(crate) gpus: Vec<GpuKept>,
}

/// The vcuda-core (100 a GPU) and GPU memory (MiB) kept on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GpuKept {
    pub(crate) index: u8,
    pub(crate) core: u32,
    pub(crate) memory: u32,
}

/// A moved pod's destination, kept for its replacement: a pod of the same namespace,
/// controller and GPU request that is not the moved pod itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Slot {
    /// [`digest`] of the moved pod's uid: a StatefulSet's replacement has the same
    /// name, never the same uid.
    pub(crate) moved: String,
    /// [`digest`] of the replacement's namespace, controller uid and [`shape_of`] its
    /// GPU request.
    pub(crate) replacement: String,
    pub(crate) held: GpusKept,
}

impl PlanHold {
    /// The holds an annotation names, if it is one the mover could have written under
    /// `defrag.holdSeconds` = `max_seconds` for a pod created at `created` (unix
    /// seconds): bounded in size, keeping some GPU for the pod, standing at most
    /// `max_seconds` from a `since` not before the pod.
    pub(crate) fn parse(text: &str, max_seconds: u32, created: i64) -> Option<PlanHold> {
        if text.len() > MAX_TEXT {
            return None;
        }
        let hold: PlanHold = serde_json::from_str(text).ok()?;
        let holds = std::iter::once(&hold.target).chain(hold.slots.iter().map(|s| &s.held));
        let sane = hold.slots.len() <= MAX_SLOTS
            && holds.into_iter().all(|h| h.gpus.len() <= MAX_GPUS)
            && !hold.target.gpus.is_empty();
        let bounded = created <= hold.since
            && hold.since <= hold.until
            && hold.until - hold.since <= i64::from(max_seconds);
        (sane && bounded).then_some(hold)
    }

    pub(crate) fn to_text(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Whether the holds still stand at `now` (unix seconds): a `since` ahead of the
    /// clock is not believed.
    pub(crate) fn stands(&self, now: i64) -> bool {
        self.since <= now.saturating_add(CLOCK_SKEW) && now < self.until
    }
}

impl GpusKept {
    /// What `assignment` uses on `node`, to keep it.
    pub(crate) fn of(node: &NodeGpus, assignment: &Assignment) -> GpusKept {
        let mut gpus: Vec<GpuKept> = Vec::new();
        for (index, each) in assignment.charges(node.memory_per_gpu) {
            let Ok(index) = u8::try_from(index) else {
                continue;
            };
            match gpus.iter_mut().find(|g| g.index == index) {
                Some(gpu) => {
                    gpu.core += each.core;
                    gpu.memory += each.memory;
                }
                None => gpus.push(GpuKept {
                    index,
                    core: each.core,
                    memory: each.memory,
                }),
            }
        }
        GpusKept {
            node: node.name.to_string(),
            gpus,
        }
    }

    /// Count this hold as used on `node` (a copy the caller places on).
    pub(crate) fn occupy(&self, node: &mut NodeGpus) {
        for gpu in &self.gpus {
            if let Some(used) = node.used.get_mut(usize::from(gpu.index)) {
                used.core = used.core.saturating_add(gpu.core);
                used.memory = used.memory.saturating_add(gpu.memory);
            }
        }
    }
}

impl Slot {
    /// The slot for the replacement of the pod of `namespace` and `uid` under the
    /// controller `owner`, asking for `request`, kept on `held`.
    pub(crate) fn new(
        namespace: &str,
        uid: &str,
        owner: &str,
        request: &GpuRequest,
        held: GpusKept,
    ) -> Slot {
        Slot {
            moved: digest(&[uid]),
            replacement: digest(&[namespace, owner, &shape_of(request)]),
            held,
        }
    }

    /// Whether the pod (`key`, `uid`, its controller and request) is this slot's
    /// replacement.
    pub(crate) fn takes(
        &self,
        key: &str,
        uid: &str,
        owner: Option<&str>,
        request: &GpuRequest,
    ) -> bool {
        // Pod keys are `namespace/name` (`pod_key`).
        let (Some((namespace, _)), Some(owner)) = (key.split_once('/'), owner) else {
            return false;
        };
        digest(&[namespace, owner, &shape_of(request)]) == self.replacement
            && digest(&[uid]) != self.moved
    }
}

/// A GPU request's fingerprint: a replacement asks for exactly what the moved pod did.
pub(crate) fn shape_of(request: &GpuRequest) -> String {
    use std::hash::BuildHasher;
    let hash = foldhash::fast::FixedState::with_seed(0).hash_one(request);
    format!("{hash:016x}")
}

/// SHA-256 of `parts` (each length-prefixed), 128 bits in hex: what a slot keeps of
/// pods that may be another namespace's. Nobody can find parts of their own that match
/// another's digest; the tenant reading it learns nothing it does not know.
pub(crate) fn digest(parts: &[&str]) -> String {
    let mut sha = Sha256::new();
    for part in parts {
        sha.update((part.len() as u64).to_le_bytes());
        sha.update(part.as_bytes());
    }
    let sum = sha.finalize();
    sum[..16]
        .iter()
        .fold(String::with_capacity(32), |mut out, b| {
            use std::fmt::Write as _;
            let _ = write!(out, "{b:02x}");
            out
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const MAX: u32 = 60;

    fn hold() -> PlanHold {
        PlanHold {
            model: "T4".into(),
            since: 100,
            until: 160,
            target: GpusKept {
                node: "n1".into(),
                gpus: vec![GpuKept {
                    index: 0,
                    core: 100,
                    memory: 15_000,
                }],
            },
            slots: vec![Slot::new(
                "team-b",
                "u1",
                "rs-1",
                &GpuRequest::default(),
                GpusKept {
                    node: "n2".into(),
                    gpus: vec![],
                },
            )],
        }
    }

    #[test]
    fn a_hold_reads_back_what_was_written_and_lapses_at_its_until() {
        let written = hold();
        let read = PlanHold::parse(&written.to_text(), MAX, 90).unwrap();
        assert_eq!(read, written);
        assert!(read.stands(159));
        assert!(!read.stands(160));
    }

    #[test]
    fn an_annotation_we_could_not_have_written_is_not_read() {
        let read = |hold: &PlanHold| PlanHold::parse(&hold.to_text(), MAX, 90);
        assert!(PlanHold::parse("not json", MAX, 0).is_none());
        assert!(PlanHold::parse(&"x".repeat(MAX_TEXT + 1), MAX, 0).is_none());
        let mut many = hold();
        many.slots = vec![many.slots[0].clone(); MAX_SLOTS + 1];
        assert!(read(&many).is_none());
        let mut extra: serde_json::Value = serde_json::to_value(hold()).unwrap();
        extra["priority"] = 9.into();
        assert!(PlanHold::parse(&extra.to_string(), MAX, 0).is_none());
        // Longer than defrag.holdSeconds, ten years ahead, ending before it began.
        let mut long = hold();
        long.until = long.since + i64::from(MAX) + 1;
        assert!(read(&long).is_none());
        long.until = long.since + 10 * 365 * 86_400;
        assert!(read(&long).is_none());
        let mut backwards = hold();
        backwards.until = backwards.since - 1;
        assert!(read(&backwards).is_none());
        // Begun before its pod existed, or keeping nothing for it (a model alone).
        assert!(PlanHold::parse(&hold().to_text(), MAX, 101).is_none());
        let mut empty = hold();
        empty.target.gpus.clear();
        empty.slots.clear();
        assert!(read(&empty).is_none());
    }

    #[test]
    fn a_hold_whose_since_is_ahead_of_the_clock_does_not_stand() {
        let mut ahead = hold();
        ahead.since = 10_000;
        ahead.until = 10_060;
        assert!(!ahead.stands(100), "written for a time to come");
        assert!(ahead.stands(10_000 - CLOCK_SKEW));
    }

    #[test]
    fn a_slot_takes_only_a_new_pod_of_the_same_namespace_controller_and_shape() {
        let slot = &hold().slots[0];
        let shape = GpuRequest::default();
        assert!(slot.takes("team-b/infer-2", "u2", Some("rs-1"), &shape));
        // A StatefulSet's replacement: the same name, another uid.
        assert!(slot.takes("team-b/infer-1", "u9", Some("rs-1"), &shape));
        assert!(
            !slot.takes("team-b/infer-1", "u1", Some("rs-1"), &shape),
            "the moved pod itself"
        );
        assert!(
            !slot.takes("team-a/infer-2", "u2", Some("rs-1"), &shape),
            "another namespace"
        );
        assert!(
            !slot.takes("team-b/infer-2", "u2", Some("rs-2"), &shape),
            "another controller"
        );
        assert!(
            !slot.takes("team-b/infer-2", "u2", None, &shape),
            "no controller"
        );
        let mut other = GpuRequest::default();
        other.containers.push(crate::placement::ContainerGpu {
            container: 0,
            demand: crate::placement::GpuDemand::Whole { gpus: 1 },
        });
        assert!(
            !slot.takes("team-b/infer-2", "u2", Some("rs-1"), &other),
            "another shape"
        );
    }

    /// The pod that carries the annotation is a tenant's: the text names none of the
    /// moved pod's namespace, name, uid or controller.
    #[test]
    fn the_annotation_names_no_moved_pod() {
        let text = hold().to_text();
        for secret in ["team-b", "infer-1", "\"u1\"", "rs-1"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        // Parts are length-prefixed: ("ab", "c") and ("a", "bc") differ.
        assert_ne!(digest(&["ab", "c"]), digest(&["a", "bc"]));
    }
}
