//! What only gpu-admission (or gpu-manager) writes on a pod: one list, [`MARKS`].
//!
//! Every guard is derived from it (docs/security.md, "What only gpu-admission writes"):
//! - the mutating webhook drops the annotations of the list from a pod being created
//!   ([`Mark::drops_at_create`]), and the validating webhook refuses a create that still
//!   carries one (another webhook added it after ours);
//! - the validating webhook refuses an update that changes a mark by anyone but its
//!   writers ([`first_change`]);
//! - the validating webhook's `matchConditions`, which decide which updates the API
//!   server sends it at all, are generated from the list ([`update_condition`]): deploy/
//!   and the chart ship that text, and tests hold both to it;
//! - the status conditions of the list are written through `pods/status`, which no role
//!   a tenant is given may write; the RBAC that deploy/ and the chart ship gives each
//!   writer exactly the verb its marks need, and tests hold it to the list.
//!
//! A new annotation, gate or condition gpu-admission writes is added here, and nowhere
//! else: a test fails on any `gpu-admission.io/` key written in the code that the list
//! does not classify (as a mark, or as one of the keys a tenant writes).
//!
//! This module names no other module of the crate: its callers hand it the names and
//! users the configuration gives ([`MarkNames`], [`Writers`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The scheduling gate of the quota queue: a pod waits behind it, charged nothing.
pub(crate) const QUOTA_GATE: &str = "gpu-admission.io/quota";
/// When the quota queue let the pod go: the second its charge was made.
pub(crate) const RELEASED_ANNOTATION: &str = "gpu-admission.io/quota-released";
/// The model a pod runs on with GPUs its namespace borrowed from its cohort.
pub(crate) const BORROWED_ANNOTATION: &str = "gpu-admission.io/borrowed";
/// How borrowed GPUs may be taken back from the pod.
pub(crate) const RECLAIM_ANNOTATION: &str = "gpu-admission.io/reclaim";
/// A defragmentation plan's holds, on the pending pod they are for.
pub(crate) const PLAN_HOLD_ANNOTATION: &str = "gpu-admission.io/defrag-hold";
/// Why a GPU pod waits: the explain verdict, on the pod's status.
pub(crate) const WAITING_CONDITION: &str = "gpu-admission.io/Waiting";

/// A name in a pod that the configuration may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Name {
    /// Always this name.
    Fixed(&'static str),
    /// `<resources.annotationPrefix>` followed by this (gpu-manager's protocol).
    UnderPrefix(&'static str),
    /// The configured `typeAnnotation`.
    TypeAnnotation,
}

/// Where in a pod a mark is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Field {
    /// `metadata.annotations[name]`.
    Annotation(Name),
    /// Every `metadata.annotations` key that starts with the name.
    AnnotationPrefix(Name),
    /// `spec.schedulingGates[].name`. Once a pod exists the API server lets a gate only
    /// be removed, never added.
    Gate(&'static str),
    /// `status.conditions[].type`: written through `pods/status`, which no webhook of
    /// ours sees and no role a tenant is given may write.
    Condition(&'static str),
}

/// Who may write a mark once the pod exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Writer {
    /// Nobody: it is fixed when the pod is created (the tenant's word then).
    Nobody,
    /// `placementWriters`: the GPU scheduler's sidecar and gpu-manager.
    Placement,
    /// gpu-admission itself: `queue.releasers`, the GPU scheduler's sidecar (the quota
    /// queue's releaser, reclaim, the defragmentation mover, the Waiting teller).
    GpuAdmission,
}

/// One thing only gpu-admission (or gpu-manager) writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark {
    pub(crate) field: Field,
    pub(crate) writer: Writer,
    /// What it says, for the denial: "annotation K {says}".
    says: &'static str,
}

/// Everything only gpu-admission (or gpu-manager) writes on a pod. docs/security.md,
/// "What only gpu-admission writes", is this list in words.
pub(crate) const MARKS: [Mark; 9] = [
    Mark {
        field: Field::Annotation(Name::TypeAnnotation),
        writer: Writer::Nobody,
        says: "decides the quota charge",
    },
    Mark {
        field: Field::AnnotationPrefix(Name::UnderPrefix("/predicate-")),
        writer: Writer::Placement,
        says: "says which GPUs the pod holds",
    },
    Mark {
        field: Field::Annotation(Name::UnderPrefix("/gpu-assigned")),
        writer: Writer::Placement,
        says: "says which GPUs the pod holds",
    },
    Mark {
        field: Field::Annotation(Name::Fixed(PLAN_HOLD_ANNOTATION)),
        writer: Writer::GpuAdmission,
        says: "keeps GPUs for a defragmentation plan",
    },
    Mark {
        field: Field::Annotation(Name::Fixed(RELEASED_ANNOTATION)),
        writer: Writer::GpuAdmission,
        says: "says when the quota queue let the pod go (the second its charge was made)",
    },
    Mark {
        field: Field::Annotation(Name::Fixed(BORROWED_ANNOTATION)),
        writer: Writer::GpuAdmission,
        says: "says the pod runs on GPUs its namespace borrowed from its cohort",
    },
    Mark {
        field: Field::Annotation(Name::Fixed(RECLAIM_ANNOTATION)),
        writer: Writer::GpuAdmission,
        says: "says how borrowed GPUs are taken back from the pod",
    },
    Mark {
        field: Field::Gate(QUOTA_GATE),
        writer: Writer::GpuAdmission,
        says: "holds the pod in its namespace's GPU quota queue until it is charged",
    },
    Mark {
        field: Field::Condition(WAITING_CONDITION),
        writer: Writer::GpuAdmission,
        says: "says why the pod waits",
    },
];

/// The names the configuration gives to [`Name::UnderPrefix`] and
/// [`Name::TypeAnnotation`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct MarkNames<'a> {
    /// `resources.annotationPrefix` (`tencent.com`).
    pub(crate) annotation_prefix: &'a str,
    /// `typeAnnotation` (`gpu-admission.io/gpu-type`).
    pub(crate) type_annotation: &'a str,
}

/// The users of each [`Writer`], as the API server authenticates them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Writers<'a> {
    /// `placementWriters`.
    pub(crate) placement: &'a [String],
    /// `queue.releasers`.
    pub(crate) gpu_admission: &'a [String],
}

impl Writers<'_> {
    /// Whether `user` may write marks of `writer`.
    pub(crate) fn may(&self, writer: Writer, user: &str) -> bool {
        let users = match writer {
            Writer::Nobody => return false,
            Writer::Placement => self.placement,
            Writer::GpuAdmission => self.gpu_admission,
        };
        users.iter().any(|u| u == user)
    }

    /// Who writes marks of `writer`, in words.
    fn described(writer: Writer) -> &'static str {
        match writer {
            Writer::Nobody => "nobody once the pod exists",
            Writer::Placement => "the GPU scheduler and gpu-manager (placementWriters)",
            Writer::GpuAdmission => "gpu-admission (queue.releasers)",
        }
    }
}

impl Name {
    /// The name as the configuration spells it.
    pub(crate) fn resolve(&self, names: MarkNames<'_>) -> String {
        match self {
            Name::Fixed(name) => (*name).to_string(),
            Name::UnderPrefix(rest) => format!("{}{rest}", names.annotation_prefix),
            Name::TypeAnnotation => names.type_annotation.to_string(),
        }
    }

    /// Whether `key` is this name (`prefix`: or starts with it), without allocating.
    fn matches(&self, key: &str, names: MarkNames<'_>, prefix: bool) -> bool {
        let rest = match self {
            Name::Fixed(name) => {
                return if prefix {
                    key.starts_with(name)
                } else {
                    key == *name
                };
            }
            Name::TypeAnnotation => return !prefix && key == names.type_annotation,
            Name::UnderPrefix(rest) => rest,
        };
        let Some(tail) = key.strip_prefix(names.annotation_prefix) else {
            return false;
        };
        if prefix {
            tail.starts_with(rest)
        } else {
            tail == *rest
        }
    }
}

impl Mark {
    /// Whether the annotation `key` is this mark's.
    pub(crate) fn is_annotation(&self, key: &str, names: MarkNames<'_>) -> bool {
        match self.field {
            Field::Annotation(name) => name.matches(key, names, false),
            Field::AnnotationPrefix(name) => name.matches(key, names, true),
            Field::Gate(_) | Field::Condition(_) => false,
        }
    }

    /// Whether the mutating webhook drops it from the annotations of a pod being
    /// created: every annotation but the tenant's own word on the model. (The quota
    /// gate is the mutating webhook's to set or not, `admission::mutate`; the API server
    /// drops the status of a pod being created.)
    pub(crate) fn drops_at_create(&self) -> bool {
        matches!(
            self.field,
            Field::Annotation(_) | Field::AnnotationPrefix(_)
        ) && self.writer != Writer::Nobody
    }

    /// The denial of `user`'s change of `key` (a key of this mark).
    pub(crate) fn refusal(&self, key: &str, user: &str) -> String {
        let who = Writers::described(self.writer);
        match (self.field, self.writer) {
            (_, Writer::Nobody) => format!(
                "the GPU model annotation {key} of a pod is fixed at creation (it {}); delete and recreate the pod to change it",
                self.says
            ),
            (Field::Gate(_), _) => format!(
                "the scheduling gate {key} {} and is removed only by {who}; user {user:?} may not remove it",
                self.says
            ),
            (Field::Condition(_), _) => format!(
                "the condition {key} {} and is written only by {who}; user {user:?} may not write it",
                self.says
            ),
            _ => format!(
                "annotation {key} {} and is written only by {who}; user {user:?} may not set, change or remove it",
                self.says
            ),
        }
    }

    /// The refusal of a pod created with `key` (a key of this mark) still on it.
    pub(crate) fn refusal_at_create(&self, key: &str) -> String {
        format!(
            "annotation {key} {} and is written only by {}; a pod cannot be created with it (copied from another pod? remove it)",
            self.says,
            Writers::described(self.writer)
        )
    }
}

/// Where a mark is in a pod, as [`MarkKey`] says it outside the crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    Annotation,
    /// Every annotation whose key starts with [`MarkKey::key`].
    AnnotationPrefix,
    Gate,
    /// A `status.conditions[]` type.
    Condition,
}

/// A mark spelled under a configuration: what the end-to-end suite writes as a tenant,
/// by every path the API server offers, to see it refused or dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkKey {
    pub place: Place,
    pub key: String,
    /// The tenant's own word when it creates the pod (the GPU model annotation), fixed
    /// after; every other mark is dropped from a pod being created.
    pub tenant_sets_at_creation: bool,
}

/// Every mark of [`MARKS`] under `names`.
pub(crate) fn mark_keys(names: MarkNames<'_>) -> Vec<MarkKey> {
    let name = |name: Name| name.resolve(names);
    MARKS
        .iter()
        .map(|mark| {
            let (place, key) = match mark.field {
                Field::Annotation(n) => (Place::Annotation, name(n)),
                Field::AnnotationPrefix(n) => (Place::AnnotationPrefix, name(n)),
                Field::Gate(gate) => (Place::Gate, gate.to_string()),
                Field::Condition(condition) => (Place::Condition, condition.to_string()),
            };
            MarkKey {
                place,
                key,
                tenant_sets_at_creation: mark.writer == Writer::Nobody,
            }
        })
        .collect()
}

/// What of a pod the marks are read from.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PodMarks<'a> {
    pub(crate) annotations: Option<&'a BTreeMap<String, String>>,
    /// The names of its scheduling gates.
    pub(crate) gates: &'a [&'a str],
}

impl PodMarks<'_> {
    /// The annotations of `mark`, in key order.
    fn annotations_of<'p>(
        &'p self,
        mark: &'p Mark,
        names: MarkNames<'p>,
    ) -> impl Iterator<Item = (&'p String, &'p String)> + 'p {
        let all = self.annotations.into_iter().flatten();
        all.filter(move |(k, _)| mark.is_annotation(k, names))
    }

    fn has_gate(&self, gate: &str) -> bool {
        self.gates.contains(&gate)
    }
}

/// A mark an update changes, and the key it changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change {
    pub(crate) mark: Mark,
    pub(crate) key: String,
}

/// The first mark (in list order) that the update from `old` to `new` changes, and
/// that `user` may not write; in a mark of several keys, the first key in order.
/// `gpu`: whether the pod asks for GPUs (the model annotation is fixed only then).
pub(crate) fn first_change(
    old: PodMarks<'_>,
    new: PodMarks<'_>,
    names: MarkNames<'_>,
    writers: Writers<'_>,
    user: &str,
    gpu: bool,
) -> Option<Change> {
    let marks = MARKS.iter().filter(|m| !writers.may(m.writer, user));
    let marks = marks.filter(|m| gpu || m.writer != Writer::Nobody);
    marks.into_iter().find_map(|mark| {
        let key = match mark.field {
            Field::Annotation(_) | Field::AnnotationPrefix(_) => {
                let (mut a, mut b) = (
                    old.annotations_of(mark, names),
                    new.annotations_of(mark, names),
                );
                differing_key(&mut a, &mut b)?
            }
            Field::Gate(gate) => {
                (old.has_gate(gate) != new.has_gate(gate)).then(|| gate.to_string())?
            }
            // Not in a pod update: `pods/status` is not sent to the webhook.
            Field::Condition(_) => return None,
        };
        Some(Change { mark: *mark, key })
    })
}

/// The first key (in order) whose entry two sorted annotation lists do not share.
fn differing_key<'a>(
    a: &mut impl Iterator<Item = (&'a String, &'a String)>,
    b: &mut impl Iterator<Item = (&'a String, &'a String)>,
) -> Option<String> {
    let (mut x, mut y) = (a.next(), b.next());
    loop {
        match (x, y) {
            (None, None) => return None,
            (Some((k, _)), None) | (None, Some((k, _))) => return Some(k.clone()),
            (Some((ka, va)), Some((kb, vb))) => {
                if ka != kb {
                    return Some(ka.min(kb).clone());
                }
                if va != vb {
                    return Some(ka.clone());
                }
                (x, y) = (a.next(), b.next());
            }
        }
    }
}

/// The annotation keys of `pod` that the mutating webhook drops at creation.
pub(crate) fn dropped_at_create<'p>(
    annotations: &'p BTreeMap<String, String>,
    names: MarkNames<'p>,
) -> impl Iterator<Item = (&'p String, &'static Mark)> + 'p {
    annotations
        .keys()
        .filter_map(move |key| Some((key, dropped_at_create_as(key, names)?)))
}

/// The mark an annotation `key` is, when the mutating webhook drops it from a pod being
/// created.
pub(crate) fn dropped_at_create_as(key: &str, names: MarkNames<'_>) -> Option<&'static Mark> {
    MARKS
        .iter()
        .find(|m| m.drops_at_create() && m.is_annotation(key, names))
}

/// How [`update_condition`] spells the users of each writer: the users themselves, or a
/// placeholder the chart replaces.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Spelled<'a> {
    Users(Writers<'a>),
    /// `__PLACEMENT_WRITERS__`, `__GPU_ADMISSION_USERS__` (a JSON list each): what the
    /// chart's copy holds (`marks_tests`).
    #[cfg(test)]
    Placeholders,
}

/// The CEL `matchConditions` expression of the validating webhook for pods: every
/// CREATE; of the UPDATEs, those that change a mark of [`MARKS`] by a user who may not
/// write it. The API server sends the webhook nothing else, so the writers' own patches
/// never wait on it, and a tenant's change of a mark is always judged.
///
/// Evaluation never fails (a failing condition would refuse the request under
/// `failurePolicy: Fail`): a map is read only where the key is known to be there.
pub(crate) fn update_condition(names: MarkNames<'_>, users: Spelled<'_>) -> String {
    let mut out = String::from("request.operation == 'CREATE'");
    for writer in [Writer::Nobody, Writer::Placement, Writer::GpuAdmission] {
        let marks: Vec<&Mark> = MARKS.iter().filter(|m| m.writer == writer).collect();
        let changes = changes_of(&marks, names);
        if changes.is_empty() {
            continue;
        }
        let changes = changes.join(" || ");
        match writer {
            Writer::Nobody => {
                let _ = write!(out, " || {changes}");
            }
            _ => {
                let users = match users {
                    Spelled::Users(writers) => {
                        let list = match writer {
                            Writer::Placement => writers.placement,
                            _ => writers.gpu_admission,
                        };
                        serde_json::to_string(list).unwrap_or_default()
                    }
                    #[cfg(test)]
                    Spelled::Placeholders if writer == Writer::Placement => {
                        "__PLACEMENT_WRITERS__".into()
                    }
                    #[cfg(test)]
                    Spelled::Placeholders => "__GPU_ADMISSION_USERS__".into(),
                };
                let _ = write!(
                    out,
                    " || (!(request.userInfo.username in {users}) && ({changes}))"
                );
            }
        }
    }
    out
}

/// The CEL for "one of `marks` changes": exact annotation keys one by one; keys under a
/// prefix (with any exact key beside them) in one pass over each side's annotations;
/// gates by presence.
fn changes_of(marks: &[&Mark], names: MarkNames<'_>) -> Vec<String> {
    let annotations = |object: &str| format!("{object}.metadata.annotations");
    let has = |object: &str| format!("has({})", annotations(object));
    let mut out = Vec::new();
    let prefixed = marks
        .iter()
        .any(|m| matches!(m.field, Field::AnnotationPrefix(_)));
    let mut keys = Vec::new();
    for mark in marks {
        match mark.field {
            Field::AnnotationPrefix(name) => {
                keys.push(format!("k.startsWith('{}')", name.resolve(names)));
            }
            Field::Annotation(name) if prefixed => {
                keys.push(format!("k == '{}'", name.resolve(names)));
            }
            Field::Annotation(name) => {
                let key = name.resolve(names);
                let present = |object: &str| {
                    format!("({} && '{key}' in {})", has(object), annotations(object))
                };
                out.push(format!(
                    "{} != {} || ({} && object.metadata.annotations['{key}'] != oldObject.metadata.annotations['{key}'])",
                    present("object"),
                    present("oldObject"),
                    present("object"),
                ));
            }
            Field::Gate(gate) => {
                let gated = |object: &str| {
                    format!(
                        "(has({object}.spec.schedulingGates) && {object}.spec.schedulingGates.exists(g, g.name == '{gate}'))"
                    )
                };
                out.push(format!("{} != {}", gated("oldObject"), gated("object")));
            }
            Field::Condition(_) => {}
        }
    }
    if !keys.is_empty() {
        let key = format!("({})", keys.join(" || "));
        // Added or changed, then removed.
        out.insert(
            0,
            format!(
                "({has_new} && object.metadata.annotations.exists(k, {key} && !({has_old} && k in oldObject.metadata.annotations && oldObject.metadata.annotations[k] == object.metadata.annotations[k]))) || ({has_old} && oldObject.metadata.annotations.exists(k, {key} && !({has_new} && k in object.metadata.annotations)))",
                has_new = has("object"),
                has_old = has("oldObject"),
            ),
        );
    }
    out
}

#[cfg(test)]
#[path = "marks_tests.rs"]
mod tests;
