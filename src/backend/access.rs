//! Who may read what the admin port's `/explain` tells (docs/explain.md, "On the admin
//! port"): in API mode, the caller's bearer token is reviewed by the API server
//! (TokenReview), and the person it belongs to must be allowed to `get` pods in the
//! pod's namespace (for a manifest: `create` them) by the cluster's own RBAC
//! (SubjectAccessReview), as `kubectl get pod` would be. What an annotation or a header
//! other than the token claims is never asked.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

/// The longest bearer token reviewed (service account tokens are about 1 KiB).
const TOKEN_MAX: usize = 16 << 10;
/// Each review answers within this, or the request fails (503).
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

/// What the caller wants to do with pods of a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PodVerb {
    /// Read an existing pod's verdict.
    Get,
    /// Judge a manifest as if it were created now.
    Create,
}

impl PodVerb {
    fn as_str(self) -> &'static str {
        match self {
            PodVerb::Get => "get",
            PodVerb::Create => "create",
        }
    }
}

/// Why a caller may not have the answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AccessError {
    #[error("no bearer token: send `Authorization: Bearer <token>`")]
    NoToken,
    #[error("the bearer token is not valid")]
    BadToken,
    #[error("{user} may not {verb} pods in namespace {namespace}")]
    Forbidden {
        user: String,
        verb: &'static str,
        namespace: String,
    },
    /// Our side: the API server did not review the token in time, or refused to.
    #[error("the API server could not review the caller: {0}")]
    Unavailable(String),
}

/// Who asks: a user the API server vouched for, or (offline, where there is nobody to
/// ask) anyone.
#[derive(Debug, Clone)]
pub(crate) enum Caller {
    Anyone,
    User(UserInfo),
}

/// Who owns the bearer `token`, as the API server's TokenReview says. No token, or
/// one longer than any token the API server issues, is refused without asking it.
pub(super) async fn identify(
    client: &kube::Client,
    token: Option<&str>,
) -> Result<Caller, AccessError> {
    let token = token
        .filter(|t| !t.is_empty())
        .ok_or(AccessError::NoToken)?;
    if token.len() > TOKEN_MAX {
        return Err(AccessError::BadToken);
    }
    let user = within_timeout(authenticate(client, token)).await?;
    Ok(Caller::User(user))
}

/// Whether `caller` may `verb` pods in `namespace`, as the API server's
/// SubjectAccessReview says (`Anyone` may).
pub(super) async fn review(
    client: &kube::Client,
    caller: &Caller,
    namespace: &str,
    verb: PodVerb,
) -> Result<(), AccessError> {
    match caller {
        Caller::Anyone => Ok(()),
        Caller::User(user) => {
            within_timeout(authorize(client, user.clone(), namespace, verb)).await
        }
    }
}

async fn within_timeout<T>(
    review: impl Future<Output = Result<T, AccessError>>,
) -> Result<T, AccessError> {
    let answered = tokio::time::timeout(REVIEW_TIMEOUT, review).await;
    answered.map_err(|_| AccessError::Unavailable("no answer within 5 s".into()))?
}

async fn authenticate(client: &kube::Client, token: &str) -> Result<UserInfo, AccessError> {
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_string()),
            audiences: None,
        },
        ..Default::default()
    };
    let reviews: Api<TokenReview> = Api::all(client.clone());
    let answer = (reviews.create(&PostParams::default(), &review).await)
        .map_err(|e| AccessError::Unavailable(e.to_string()))?;
    let status = answer.status.unwrap_or_default();
    match (status.authenticated, status.user) {
        (Some(true), Some(user)) => Ok(user),
        _ => Err(AccessError::BadToken),
    }
}

async fn authorize(
    client: &kube::Client,
    user: UserInfo,
    namespace: &str,
    verb: PodVerb,
) -> Result<(), AccessError> {
    let name = user.username.clone().unwrap_or_default();
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username,
            groups: user.groups,
            uid: user.uid,
            extra: user.extra,
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(namespace.to_string()),
                verb: Some(verb.as_str().into()),
                group: Some(String::new()),
                resource: Some("pods".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    let answer = (reviews.create(&PostParams::default(), &review).await)
        .map_err(|e| AccessError::Unavailable(e.to_string()))?;
    if answer.status.is_some_and(|s| s.allowed) {
        Ok(())
    } else {
        Err(AccessError::Forbidden {
            user: name,
            verb: verb.as_str(),
            namespace: namespace.to_string(),
        })
    }
}
