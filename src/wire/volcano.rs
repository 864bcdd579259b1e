//! Volcano's extender plugin predicate request (`{"task": TaskInfo, "node": NodeInfo}`,
//! Go field names, keys in any letter case) and its answer (`PredicateResponse`).
//! What the predicate does with them is `crate::extender::volcano`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;
use serde_json::value::RawValue;

use super::{self as wire, DecodeError, decode_raw, object_parts};

/// Volcano's `PredicateResponse`: an empty status passes.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub(crate) struct PredicateResponse {
    pub(crate) status: String,
    pub(crate) code: i32,
}

/// Volcano's `TaskStatus` bits of the tasks that hold their node's resources:
/// Allocated (placed in this session, not bound yet), Binding, Bound, Running and
/// Releasing; not Pending, Pipelined (waiting for others to leave), Succeeded, Failed
/// or Unknown.
const HOLDING: u32 = (1 << 1) | (1 << 3) | (1 << 4) | (1 << 5) | (1 << 6);

/// Most tasks one request may list on its node (a kubelet runs at most a few hundred
/// pods).
const MAX_NODE_TASKS: usize = 10_000;

/// The pod, node name and the pods of the node's holding tasks of a predicate request
/// (`{"task": TaskInfo, "node": NodeInfo}`, Go field names). The rest of the node
/// object Volcano sends along is not read: the cluster's view of the node decides; its
/// task list only adds what the cluster does not show yet.
pub struct PredicateArgs {
    pub pod: Pod,
    pub(crate) node_name: String,
    /// The pods of `node.Tasks` whose status holds the node ([`HOLDING`]).
    pub node_pods: Vec<Pod>,
}

impl PredicateArgs {
    pub fn from_json(body: &[u8]) -> Result<Self, DecodeError> {
        let [task, node] = object_parts("request", wire::text(body)?, ["task", "node"])
            .map_err(|e| e.expecting("a JSON object with task and node"))?;
        let [pod] = object_parts("task", required("request", "task", task)?, ["Pod"])?;
        let pod = wire::pod::decode("task.Pod", required("task", "Pod", pod)?)?;
        let node = required("request", "node", node)?;
        let [name, tasks] = object_parts("node", node, ["Name", "Tasks"])?;
        let node_name = decode_raw("node.Name", required("node", "Name", name)?)?;
        let node_pods = tasks.map_or(Ok(Vec::new()), holding_pods)?;
        Ok(PredicateArgs {
            pod,
            node_name,
            node_pods,
        })
    }
}

/// The pods of the tasks in `node.Tasks` (a map from task id to TaskInfo) that hold
/// the node.
fn holding_pods(tasks: &RawValue) -> Result<Vec<Pod>, DecodeError> {
    let tasks: BTreeMap<String, &RawValue> = decode_raw("node.Tasks", tasks.get())?;
    if tasks.len() > MAX_NODE_TASKS {
        return Err(DecodeError::TooMany {
            what: "node.Tasks",
            max: MAX_NODE_TASKS,
            entries: "tasks",
        });
    }
    let mut pods = Vec::new();
    for (id, task) in tasks {
        let what = format!("node.Tasks[{id:?}]");
        let [status, pod] = object_parts(&what, task.get(), ["Status", "Pod"])?;
        let status: u32 =
            status.map_or(Ok(0), |s| decode_raw(&format!("{what}.Status"), s.get()))?;
        if status & HOLDING == 0 {
            continue;
        }
        if let Some(pod) = pod {
            pods.push(wire::pod::decode(&format!("{what}.Pod"), pod.get())?);
        }
    }
    Ok(pods)
}

/// The text of the member `part` of `within`, which the request must have.
fn required<'a>(
    within: &'static str,
    part: &'static str,
    raw: Option<&'a RawValue>,
) -> Result<&'a str, DecodeError> {
    raw.map(RawValue::get)
        .ok_or(DecodeError::Missing { within, part })
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::{Value, json};

    use super::*;

    /// A pod as Volcano's TaskInfo carries it: `core` vcuda-core and 4 vcuda-memory.
    pub(crate) fn pod(name: &str, core: u32, node_name: Option<&str>) -> Value {
        json!({
            "metadata": {"name": name, "namespace": "team", "uid": format!("uid-{name}")},
            "spec": {
                "nodeName": node_name,
                "containers": [{"name": "c", "resources": {"limits": {
                    "tencent.com/vcuda-core": core.to_string(),
                    "tencent.com/vcuda-memory": "4",
                }}}],
            },
        })
    }

    /// A TaskInfo as Volcano marshals it (the fields around `Pod` abridged).
    pub(crate) fn task(pod: &Value, status: u32) -> Value {
        json!({
            "UID": pod["metadata"]["uid"], "Name": pod["metadata"]["name"],
            "Namespace": "team", "Status": status, "Pod": pod,
            "Resreq": {"MilliCPU": 0, "ScalarResources": {"tencent.com/vcuda-core": 60000}},
        })
    }

    /// `{"task": ..., "node": ...}` for `pod` on node `n`, whose `Tasks` are `tasks`.
    pub(crate) fn request(pod: &Value, tasks: &[Value]) -> Vec<u8> {
        let tasks: serde_json::Map<String, Value> = tasks
            .iter()
            .map(|t| (format!("team/{}", t["Name"].as_str().unwrap()), t.clone()))
            .collect();
        let node = json!({"Name": "n", "Node": {"metadata": {"name": "n"}}, "Tasks": tasks});
        serde_json::to_vec(&json!({"task": task(pod, 1), "node": node})).unwrap()
    }

    #[test]
    fn reads_the_pods_of_the_tasks_that_hold_the_node() {
        let statuses = [
            ("pending", 1),
            ("allocated", 2),
            ("pipelined", 4),
            ("binding", 8),
            ("bound", 16),
            ("running", 32),
            ("releasing", 64),
            ("succeeded", 128),
        ];
        let tasks: Vec<Value> = statuses
            .iter()
            .map(|&(name, status)| task(&pod(name, 10, Some("n")), status))
            .collect();
        let args = PredicateArgs::from_json(&request(&pod("p", 60, None), &tasks)).unwrap();
        let mut names: Vec<_> = args
            .node_pods
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["allocated", "binding", "bound", "releasing", "running"]
        );

        for node in [json!({"Name": "n"}), json!({"Name": "n", "Tasks": null})] {
            let body = json!({"task": {"Pod": pod("p", 60, None)}, "node": node});
            let args = PredicateArgs::from_json(body.to_string().as_bytes()).unwrap();
            assert!(args.node_pods.is_empty());
        }
        let body = json!({"task": {"Pod": pod("p", 60, None)}, "node": {"Name": "n", "Tasks": []}});
        let error = PredicateArgs::from_json(body.to_string().as_bytes())
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("node.Tasks"), "{error}");
    }

    #[test]
    fn errors_name_the_part_that_is_missing_or_wrong() {
        let err = |body: Value| {
            PredicateArgs::from_json(body.to_string().as_bytes())
                .err()
                .unwrap()
        };
        let shown = |body: Value| err(body).to_string();
        assert_eq!(
            shown(json!([])),
            "request must be a JSON object with task and node"
        );
        assert_eq!(shown(json!({"node": {}})), "request has no task");
        assert_eq!(shown(json!({"task": {}, "node": {}})), "task has no Pod");
        assert_eq!(shown(json!({"task": {"Pod": {}}})), "request has no node");
        assert_eq!(
            shown(json!({"task": {"Pod": {}}, "node": {}})),
            "node has no Name"
        );
        assert_eq!(
            err(json!({"task": {"Pod": {}}, "node": {}})).kind(),
            "missing_field"
        );
        let tasks: serde_json::Map<String, Value> = (0..=MAX_NODE_TASKS)
            .map(|i| (i.to_string(), json!({})))
            .collect();
        let crowded = json!({"task": {"Pod": {}}, "node": {"Name": "n", "Tasks": tasks}});
        let error = err(crowded);
        assert_eq!(error.kind(), "over_limit");
        assert_eq!(
            error.to_string(),
            "node.Tasks lists more than 10000 tasks; refusing to decode it"
        );
    }
}
