//! What a webhook route expects of the reviews it judges (the group, kind and resource)
//! and how a review can fail to add up: the route's side of `Review::expect`, apart so
//! that the decode error can name a mismatch without knowing the review.

/// What a route judges: the group, kind and resource its reviews must be about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    pub(super) group: &'static str,
    pub(super) kind: &'static str,
    pub(super) resource: &'static str,
}

/// Reviews of Pods (`/validate`, `/mutate`).
pub(crate) const PODS: Expected = Expected {
    group: "",
    kind: "Pod",
    resource: "pods",
};

/// Reviews of ResourceClaims (`/validate/resourceclaims`, `/mutate/resourceclaims`).
pub(crate) const RESOURCE_CLAIMS: Expected = Expected {
    group: "resource.k8s.io",
    kind: "ResourceClaim",
    resource: "resourceclaims",
};

/// A review that does not add up (`Review::expect`, `Review::check_namespace`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    #[error("request.operation {0:?} is not one of CREATE, UPDATE, DELETE, CONNECT")]
    Operation(String),
    #[error("request.namespace is missing; {} are namespaced", .0.resource)]
    NoNamespace(Expected),
    #[error("{}; this route judges {}", found_kind(.found), route.kind_name())]
    Kind {
        /// The kind and group the review names, if any.
        found: Option<(String, String)>,
        route: Expected,
    },
    #[error("{}; this route judges {}", found_resource(.found), route.resource)]
    Resource {
        found: Option<(String, String)>,
        route: Expected,
    },
    #[error("request.{field}.metadata.namespace {own:?} is not request.namespace {request:?}")]
    Namespace {
        field: &'static str,
        own: String,
        request: String,
    },
}

impl Mismatch {
    /// The metric label of the mismatch (`DecodeError::kind`).
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Mismatch::Operation(_) => "bad_operation",
            Mismatch::NoNamespace(_) => "missing_field",
            Mismatch::Kind { .. } => "wrong_kind",
            Mismatch::Resource { .. } => "wrong_resource",
            Mismatch::Namespace { .. } => "namespace_mismatch",
        }
    }
}

fn found_kind(found: &Option<(String, String)>) -> String {
    match found {
        Some((kind, group)) => format!("request.kind is {kind:?} of group {group:?}"),
        None => "request.kind is missing".into(),
    }
}

fn found_resource(found: &Option<(String, String)>) -> String {
    match found {
        Some((resource, group)) => format!("request.resource is {resource:?} of group {group:?}"),
        None => "request.resource is missing".into(),
    }
}

impl Expected {
    /// `core/Pod`, `resource.k8s.io/ResourceClaim`.
    fn kind_name(&self) -> String {
        match self.group {
            "" => format!("core/{}", self.kind),
            group => format!("{group}/{}", self.kind),
        }
    }
}
