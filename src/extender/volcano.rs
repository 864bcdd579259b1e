//! Volcano's extender plugin predicate (`POST /scheduler/vpredicates`): feasibility of
//! one (task, node) pair. Volcano calls it for many nodes in parallel and binds by
//! itself, so this writes nothing.
//!
//! Volcano places every task of a session (a whole gang at once) before it binds any:
//! until the bindings come back through the watch, gpu-admission's cache does not know
//! them. So the tasks Volcano says hold the node (`node.Tasks`: this session's
//! allocations included) and the cache does not have there are charged on a copy of the
//! node before the fit. They can only take GPUs away, never add any: what the caller
//! sends can make the answer stricter, not looser.

use k8s_openapi::api::core::v1::Pod;

use crate::backend::Backend;
use crate::cache::pod_key;
use crate::config::Config;
use crate::placement::{GpuRequest, fit};

use crate::wire::volcano::{PredicateArgs, PredicateResponse};

const SUCCESS: i32 = 0;
const ERROR: i32 = 1;
const UNSCHEDULABLE: i32 = 2;
const UNRESOLVABLE: i32 = 3;

pub(crate) fn predicate(
    backend: &Backend,
    config: &Config,
    args: PredicateArgs,
) -> PredicateResponse {
    let cache = backend.cache();
    let projection = cache.projection();
    let request = match GpuRequest::from_pod(&args.pod, &projection.names) {
        Ok(Some(request)) => request,
        Ok(None) => return respond(SUCCESS, String::new()),
        Err(error) => return respond(ERROR, error.to_string()),
    };
    let namespace = args.pod.metadata.namespace.as_deref().unwrap_or("default");
    // What the node's holding tasks ask for (a request gpu-admission cannot read is
    // charged nowhere, as the cache does with such a pod).
    let own = pod_key(&args.pod);
    let holding: Vec<_> = args
        .node_pods
        .iter()
        .filter_map(|pod| {
            let request = GpuRequest::from_pod(pod, &projection.names).ok()??;
            Some((pod_key(pod), request))
        })
        .filter(|(key, _)| *key != own)
        .collect();
    cache.read(|state| {
        let quota = state.namespace_quota(namespace);
        let wanted = config.wanted_models(&args.pod, quota.limits);
        let Some(cached) = state.node(&args.node_name) else {
            return respond(
                UNSCHEDULABLE,
                format!("node {} is not in gpu-admission's cache", args.node_name),
            );
        };
        // Charge, on a copy, the holding tasks the cache does not have on this node
        // (placed by Volcano but not bound, or bound but not seen yet), where gpu-manager
        // would put them, as the cache charges a pod without GPU indices.
        let unseen = holding.iter().filter(|(key, _)| {
            let here =
                |pod: &crate::cache::CachedPod| pod.node.as_deref() == Some(&*args.node_name);
            !state.pod(key).is_some_and(here)
        });
        let mut copy = None;
        for (_, request) in unseen {
            let node = copy.get_or_insert_with(|| cached.clone());
            if let Ok(assignment) = fit(node, request) {
                assignment.occupy(node);
            }
        }
        let node = copy.as_ref().unwrap_or(cached);
        // The same rules as the filter and bind verbs, then the fit.
        let created = match state.pod(&own) {
            Some(pod) => pod.created,
            None => created_second(&args.pod),
        };
        let mig = &projection.names.mig;
        let eligibility = quota.eligibility(quota.limits, wanted, (&request, created), mig);
        let verdict = eligibility
            .admits(node, &request)
            .and_then(|()| fit(node, &request).map(drop));
        match verdict {
            Ok(()) => respond(SUCCESS, String::new()),
            Err(misfit) if misfit.is_unresolvable() => respond(UNRESOLVABLE, misfit.to_string()),
            Err(misfit) => respond(UNSCHEDULABLE, misfit.to_string()),
        }
    })
}

/// The pod's creation second (0 when it has none: every node counts).
fn created_second(pod: &Pod) -> i64 {
    let created = pod.metadata.creation_timestamp.as_ref();
    created.map_or(0, |t| t.0.as_second())
}

fn respond(code: i32, status: String) -> PredicateResponse {
    PredicateResponse { status, code }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::{Value, json};

    use super::*;
    use crate::cache::{CacheWriter, CachedPod, Projection};
    use crate::placement::testing::node;
    use crate::wire::volcano::tests::{pod, request, task};

    /// A cache holding node `n` (two GPUs of 16 vcuda-memory) and `bound` pods on it.
    fn cache_with(bound: &[Value]) -> (CacheWriter, Config) {
        let config = Config::default();
        let projection = Projection::from_config(&config);
        let cache = CacheWriter::in_memory(projection.clone());
        cache.write(|state| {
            state.apply_node(node("n", 2, 16));
            for pod in bound {
                let pod: Pod = serde_json::from_value(pod.clone()).unwrap();
                let cached = CachedPod::from_pod(&pod, &projection).unwrap();
                state.apply_pod(pod_key(&pod), cached);
            }
        });
        (cache, config)
    }

    fn judge(cache: &CacheWriter, config: &Config, body: &[u8]) -> PredicateResponse {
        let backend = Backend::offline(cache.clone());
        predicate(&backend, config, PredicateArgs::from_json(body).unwrap())
    }

    /// A gang of three 60% tasks: Volcano's own accounting lets all three onto a
    /// two-GPU node (180 of 200 vcuda-core), and none is bound while it places them.
    #[test]
    fn tasks_volcano_placed_in_this_session_take_their_gpus() {
        let (cache, config) = cache_with(&[]);
        let (a, b, c) = (pod("a", 60, None), pod("b", 60, None), pod("c", 60, None));
        assert_eq!(judge(&cache, &config, &request(&a, &[])).code, SUCCESS);
        let one = [task(&a, 2)];
        assert_eq!(judge(&cache, &config, &request(&b, &one)).code, SUCCESS);
        let two = [task(&a, 2), task(&b, 2)];
        assert_eq!(
            judge(&cache, &config, &request(&c, &two)),
            PredicateResponse {
                status: "no single GPU has 60 free vcuda-core (largest free: 40)".into(),
                code: UNSCHEDULABLE,
            }
        );
        // Tasks that do not hold the node (pipelined, pending) take nothing.
        let waiting = [task(&a, 4), task(&b, 1)];
        assert_eq!(judge(&cache, &config, &request(&c, &waiting)).code, SUCCESS);
        // Nor does the task being judged, were it listed.
        let itself = [task(&a, 2), task(&c, 2)];
        assert_eq!(judge(&cache, &config, &request(&c, &itself)).code, SUCCESS);
        // The cache is not written.
        assert!(cache.read(|s| s.pod("team/a").is_none()));
    }

    /// The finding: Volcano's predicate skipped the MIG profile cap that the filter and
    /// bind verbs check (the rules were written twice); now they are one chain.
    #[test]
    fn a_capped_mig_profile_is_refused_as_the_filter_refuses_it() {
        let (cache, config) = cache_with(&[]);
        cache.write(|state| {
            let mut slices = node("n", 7, 0);
            slices.model = Some("A100-SXM4-40GB-MIG-1g.5gb".into());
            state.apply_node(slices);
            state.apply_quota(
                serde_json::from_value(json!({
                    "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUQuota",
                    "metadata": {"name": "q", "namespace": "team"},
                    "spec": {"hard": {"A100-SXM4-40GB": "2", "A100-SXM4-40GB/1g.5gb": "1"}}
                }))
                .unwrap(),
            );
        });
        let slice_pod = |name: &str, model: &str| {
            json!({
                "metadata": {"name": name, "namespace": "team", "uid": name,
                    "annotations": {"gpu-admission.io/gpu-type": model}},
                "spec": {"containers": [{"name": "c",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            })
        };
        let around = slice_pod("around", "A100-SXM4-40GB");
        let answer = judge(&cache, &config, &request(&around, &[]));
        assert_eq!(answer.code, UNSCHEDULABLE, "{answer:?}");
        assert!(
            answer
                .status
                .contains("caps MIG profile A100-SXM4-40GB/1g.5gb"),
            "{answer:?}"
        );
        // A pod that names the profile's label (and is charged for it) may.
        let named = slice_pod("named", "A100-SXM4-40GB-MIG-1g.5gb");
        assert_eq!(judge(&cache, &config, &request(&named, &[])).code, SUCCESS);
    }

    #[test]
    fn a_task_the_cache_already_charges_on_the_node_is_not_charged_again() {
        let bound = pod("a", 60, Some("n"));
        let (cache, config) = cache_with(std::slice::from_ref(&bound));
        let c = pod("c", 60, None);
        assert_eq!(
            judge(&cache, &config, &request(&c, &[task(&bound, 16)])).code,
            SUCCESS,
            "one 60% pod leaves a GPU free"
        );
        let b = pod("b", 60, None);
        let two = [task(&bound, 16), task(&b, 2)];
        assert_eq!(
            judge(&cache, &config, &request(&c, &two)).code,
            UNSCHEDULABLE
        );
    }
}
