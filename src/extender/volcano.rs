//! Volcano's extender plugin predicate (`POST /scheduler/vpredicates`): feasibility of
//! one (task, node) pair. Volcano calls it for many nodes in parallel and binds by
//! itself, so this writes nothing.

use k8s_openapi::api::core::v1::{Node, Pod};
use serde::Serialize;
use serde_json::Value;

use crate::cache::ClusterCache;
use crate::config::Config;
use crate::placement::models::pool_admits;
use crate::placement::{GpuRequest, NodeGpus, fit};
use crate::quota::NamespaceLimits;

use super::api::{decode, field};

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
pub struct PredicateArgs {
    pub pod: Pod,
    pub node_name: String,
    pub node: Option<Node>,
}

impl PredicateArgs {
    pub fn from_json(body: &[u8]) -> Result<Self, String> {
        let value: Value =
            serde_json::from_slice(body).map_err(|e| format!("request is not valid JSON: {e}"))?;
        let object = value
            .as_object()
            .ok_or("request must be a JSON object with task and node")?;
        let task = field(object, "task")
            .and_then(Value::as_object)
            .ok_or("request has no task")?;
        let pod = decode("task.Pod", field(task, "Pod").ok_or("task has no Pod")?)?;
        let node = field(object, "node")
            .and_then(Value::as_object)
            .ok_or("request has no node")?;
        let node_name = field(node, "Name")
            .and_then(Value::as_str)
            .ok_or("node has no Name")?
            .to_string();
        let node_object = field(node, "Node")
            .map(|n| decode("node.Node", n))
            .transpose()?;
        Ok(PredicateArgs {
            pod,
            node_name,
            node: node_object,
        })
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
        let given = args
            .node
            .as_ref()
            .map(|n| NodeGpus::from_node(n, &projection.names, &projection.labels));
        let Some(node) = state.node(&args.node_name).or(given.as_ref()) else {
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
