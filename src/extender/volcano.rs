//! Volcano's extender plugin predicate (`POST /scheduler/vpredicates`): feasibility of
//! one (task, node) pair. Volcano calls it for many nodes in parallel and binds by
//! itself, so this writes nothing.

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use crate::cache::ClusterCache;
use crate::config::Config;
use crate::placement::models::pool_admits;
use crate::placement::{GpuRequest, fit};
use crate::quota::NamespaceLimits;

use crate::wire::{self, decode_raw, object_parts};

/// Volcano's `PredicateResponse`: an empty status passes.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct PredicateResponse {
    pub status: String,
    pub code: i32,
}

const SUCCESS: i32 = 0;
const ERROR: i32 = 1;
const UNSCHEDULABLE: i32 = 2;
const UNRESOLVABLE: i32 = 3;

/// The pod and node name of a predicate request (`{"task": TaskInfo, "node": NodeInfo}`).
/// The node object Volcano sends along is not read: the cluster's view of the node
/// decides, never the caller's.
pub struct PredicateArgs {
    pub pod: Pod,
    pub node_name: String,
}

impl PredicateArgs {
    pub fn from_json(body: &[u8]) -> Result<Self, String> {
        let [task, node] = object_parts("request", wire::text(body)?, ["task", "node"])
            .map_err(|e| e.replace("a JSON object", "a JSON object with task and node"))?;
        let [pod] = object_parts("task", task.ok_or("request has no task")?.get(), ["Pod"])?;
        let pod = wire::pod::decode("task.Pod", pod.ok_or("task has no Pod")?.get())?;
        let [name] = object_parts("node", node.ok_or("request has no node")?.get(), ["Name"])?;
        let node_name = decode_raw("node.Name", name.ok_or("node has no Name")?.get())?;
        Ok(PredicateArgs { pod, node_name })
    }
}

pub fn predicate(cache: &ClusterCache, config: &Config, args: PredicateArgs) -> PredicateResponse {
    let projection = cache.projection();
    let request = match GpuRequest::from_pod(&args.pod, &projection.names) {
        Ok(Some(request)) => request,
        Ok(None) => return respond(SUCCESS, String::new()),
        Err(error) => return respond(ERROR, error.to_string()),
    };
    let namespace = args.pod.metadata.namespace.as_deref().unwrap_or("default");
    cache.with_state(|state| {
        let limits = NamespaceLimits::of(state.quotas(), namespace);
        let wanted = limits.wanted_models(&args.pod, config);
        let Some(node) = state.node(&args.node_name) else {
            return respond(
                UNSCHEDULABLE,
                format!("node {} is not in gpu-admission's cache", args.node_name),
            );
        };
        let verdict = wanted
            .admits(node)
            .and_then(|()| pool_admits(&limits.pools, node))
            .and_then(|()| fit(node, &request).map(drop));
        match verdict {
            Ok(()) => respond(SUCCESS, String::new()),
            Err(misfit) if misfit.is_unresolvable() => respond(UNRESOLVABLE, misfit.to_string()),
            Err(misfit) => respond(UNSCHEDULABLE, misfit.to_string()),
        }
    })
}

fn respond(code: i32, status: String) -> PredicateResponse {
    PredicateResponse { status, code }
}
