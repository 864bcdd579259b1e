//! A defragmentation plan's holds, as the pending pod carries them (docs/defrag.md,
//! "Holds"): the mover writes them onto the pod it makes room for, in one annotation,
//! so every replica's extender keeps the freed GPUs for that pod and each moved pod's
//! destination for its replacement. Only the placement writers may set or change the
//! annotation (the webhooks drop it from a new pod and refuse anyone else's change), and
//! every hold lapses at its `until`, whoever wrote it.

use serde::{Deserialize, Serialize};

use crate::placement::{Assignment, GpuRequest, NodeGpus};

/// The annotation that carries a plan's holds on the pending pod.
pub(crate) const PLAN_HOLD_ANNOTATION: &str = "gpu-admission.io/defrag-hold";

/// An annotation longer than this is not read: a real plan's is a few hundred bytes.
const MAX_TEXT: usize = 8 * 1024;
/// At most this many destinations (the most moves a plan may make), and GPUs per hold.
const MAX_SLOTS: usize = 4;
const MAX_GPUS: usize = 64;

/// The holds one plan keeps until `until` (unix seconds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PlanHold {
    /// The GPU model the plan is for: one plan at a time per model.
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
/// controller and GPU request ([`shape_of`]) that is not the moved pod itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Slot {
    /// The moved pod, `namespace/name`.
    pub(crate) moved: String,
    /// Its uid: a StatefulSet's replacement has the same name, never the same uid.
    pub(crate) uid: String,
    /// The uid of its controller (the controlling ownerReference).
    pub(crate) owner: String,
    pub(crate) shape: String,
    pub(crate) held: GpusKept,
}

impl PlanHold {
    /// The holds an annotation names, if it is one we could have written.
    pub(crate) fn parse(text: &str) -> Option<PlanHold> {
        if text.len() > MAX_TEXT {
            return None;
        }
        let hold: PlanHold = serde_json::from_str(text).ok()?;
        let holds = std::iter::once(&hold.target).chain(hold.slots.iter().map(|s| &s.held));
        let sane =
            hold.slots.len() <= MAX_SLOTS && holds.into_iter().all(|h| h.gpus.len() <= MAX_GPUS);
        sane.then_some(hold)
    }

    pub(crate) fn to_text(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Whether the holds still stand at `now` (unix seconds).
    pub(crate) fn stands(&self, now: i64) -> bool {
        now < self.until
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
        fn namespace(key: &str) -> Option<&str> {
            key.split_once('/').map(|(ns, _)| ns)
        }
        namespace(key) == namespace(&self.moved)
            && uid != self.uid
            && owner == Some(self.owner.as_str())
            && shape_of(request) == self.shape
    }
}

/// A GPU request's fingerprint: a replacement asks for exactly what the moved pod did.
pub(crate) fn shape_of(request: &GpuRequest) -> String {
    use std::hash::BuildHasher;
    let hash = foldhash::fast::FixedState::with_seed(0).hash_one(request);
    format!("{hash:016x}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

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
            slots: vec![Slot {
                moved: "team-b/infer-1".into(),
                uid: "u1".into(),
                owner: "rs-1".into(),
                shape: shape_of(&GpuRequest::default()),
                held: GpusKept {
                    node: "n2".into(),
                    gpus: vec![],
                },
            }],
        }
    }

    #[test]
    fn a_hold_reads_back_what_was_written_and_lapses_at_its_until() {
        let written = hold();
        let read = PlanHold::parse(&written.to_text()).unwrap();
        assert_eq!(read, written);
        assert!(read.stands(159));
        assert!(!read.stands(160));
    }

    #[test]
    fn an_annotation_we_could_not_have_written_is_not_read() {
        assert!(PlanHold::parse("not json").is_none());
        assert!(PlanHold::parse(&"x".repeat(MAX_TEXT + 1)).is_none());
        let mut many = hold();
        many.slots = vec![many.slots[0].clone(); MAX_SLOTS + 1];
        assert!(PlanHold::parse(&many.to_text()).is_none());
        let mut extra: serde_json::Value = serde_json::to_value(hold()).unwrap();
        extra["priority"] = 9.into();
        assert!(PlanHold::parse(&extra.to_string()).is_none());
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
}
