//! A cluster that looks like a real one, for `benches/filter.rs`: three GPU models,
//! random (seeded) occupancy by pods of mixed shapes (10%, 30% of a GPU, one and two
//! whole GPUs), a quota namespace among them. The uniform cluster the benchmark had
//! before (identical T4 nodes, identical 20% pods) lets the placement memo answer almost
//! everything from cache; this one does not.

use gpu_admission::cache::{CacheWriter, CachedPod, pod_key};
use gpu_admission::placement::{GpuUse, NodeGpus};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

/// The namespace with a GPUQuota over the three models (no default type: its pods
/// that name no model accept all three, and are charged at placement).
pub const QUOTA_NAMESPACE: &str = "team-q";

/// Model label, vcuda-memory units per GPU (256 MiB each), share of the nodes (%).
pub const MODELS: [(&str, u32, u64); 3] = [
    ("Tesla-T4", 64, 50),
    ("Tesla-V100-SXM2-32GB", 128, 30),
    ("A100-SXM4-40GB", 160, 20),
];

/// The shapes of the pods already running and of the pods the filter is asked about:
/// vcuda-core (100 per whole GPU) and the share of a GPU's memory (share pods only).
pub const SHAPES: [(u32, u32); 4] = [(10, 10), (30, 30), (100, 0), (200, 0)];

/// xorshift64*: seeded, so both builds of an A/B run see the same cluster.
pub struct Random(u64);

impl Random {
    pub fn new(seed: u64) -> Self {
        Random(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) % n
    }
}

/// Which of [`MODELS`] node `i` has (seeded by `i`, so the same in every run).
pub fn model_of(i: usize) -> usize {
    let roll = Random::new(i as u64 + 1_000_003).below(100);
    let mut below = 0;
    MODELS
        .iter()
        .position(|&(_, _, share)| {
            below += share;
            roll < below
        })
        .unwrap_or(0)
}

/// A GPU pod's object as the watch or kube-scheduler delivers it: `core` vcuda-core,
/// `memory_share` percent of a GPU's memory (`memory_per_gpu` units), optionally one
/// named model (the type annotation).
pub fn gpu_pod(namespace: &str, name: &str, core: u32, memory: u32, model: Option<&str>) -> Value {
    let mut limits =
        json!({"tencent.com/vcuda-core": core.to_string(), "cpu": "4", "memory": "16Gi"});
    if memory > 0 {
        limits["tencent.com/vcuda-memory"] = json!(memory.to_string());
    }
    let mut pod = json!({
        "metadata": {"name": name, "namespace": namespace, "uid": uuid(name),
            "labels": {"app": "trainer", "team": namespace}},
        "spec": {"schedulerName": "gpu-scheduler", "containers": [{"name": "main",
            "image": "registry.example.com/ml/trainer:2.4.1", "resources": {"limits": limits}}]}
    });
    if let Some(model) = model {
        pod["metadata"]["annotations"] = json!({"gpu-admission.io/gpu-type": model});
    }
    pod
}

/// A uid-like text derived from `seed`.
fn uuid(seed: &str) -> String {
    let h = seed
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        })
        .to_le_bytes()
        .repeat(2);
    let hex: String = h.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// vcuda-memory units for `share` percent of a GPU of `memory_per_gpu` units.
pub fn memory_units(share: u32, memory_per_gpu: u32) -> u32 {
    (memory_per_gpu * share).div_ceil(100)
}

/// `nodes` nodes of the three models, `gpus` GPUs each.
pub fn add_nodes(
    cache: &CacheWriter,
    nodes: usize,
    gpus: usize,
    node_name: impl Fn(usize) -> String,
) {
    cache.write(|s| {
        for i in 0..nodes {
            let (model, memory, _) = MODELS[model_of(i)];
            s.apply_node(NodeGpus {
                name: node_name(i).into(),
                model: Some(model.into()),
                pool: None,
                memory_per_gpu: memory,
                used: vec![GpuUse::default(); gpus],
                mig_slices: Vec::new(),
                created: 0,
                closed: None,
            })
        }
    });
}

/// On the nodes of [`add_nodes`], pods of random shapes on random nodes, first fit,
/// until `pods` pods are placed; a quarter of them in [`QUOTA_NAMESPACE`] (some naming
/// their model), the rest in four other namespaces. Returns the pods placed.
pub fn fill(
    cache: &CacheWriter,
    nodes: usize,
    gpus: usize,
    pods: usize,
    node_name: impl Fn(usize) -> String,
) -> usize {
    let projection = cache.projection().clone();
    let mut random = Random::new(42);
    let mut free: Vec<Vec<(u32, u32)>> = (0..nodes)
        .map(|i| vec![(100, MODELS[model_of(i)].1); gpus])
        .collect();
    let mut placed = 0;
    let mut attempts = 0;
    while placed < pods && attempts < pods * 4 {
        attempts += 1;
        let i = random.below(nodes as u64) as usize;
        let (model, memory_per_gpu, _) = MODELS[model_of(i)];
        let (core, share) = SHAPES[random.below(SHAPES.len() as u64) as usize];
        let memory = memory_units(share, memory_per_gpu);
        let Some(indices) = first_fit(&mut free[i], core, memory) else {
            continue;
        };
        let namespace = match placed % 4 {
            0 => QUOTA_NAMESPACE,
            1 => "team-a",
            2 => "team-b",
            _ => ["research", "inference"][placed % 8 / 4],
        };
        let named = (namespace == QUOTA_NAMESPACE && placed % 3 == 0).then_some(model);
        let name = format!("trainer-{:08x}-{placed:06}", random.below(1 << 32));
        let mut value = gpu_pod(namespace, &name, core, memory, named);
        value["spec"]["nodeName"] = json!(node_name(i));
        let annotations = value["metadata"]
            .as_object_mut()
            .unwrap()
            .entry("annotations")
            .or_insert_with(|| json!({}));
        annotations["tencent.com/predicate-gpu-idx-0"] = json!(indices);
        let pod: Pod = serde_json::from_value(value).unwrap();
        let cached = CachedPod::from_pod(&pod, &projection).unwrap();
        cache.write(|s| s.apply_pod(pod_key(&pod), cached));
        placed += 1;
    }
    placed
}

/// Take `core` (and `memory`) from the first GPU with room (share), or the first
/// free whole GPUs; the indices as gpu-manager's annotation writes them.
fn first_fit(free: &mut [(u32, u32)], core: u32, memory: u32) -> Option<String> {
    if core < 100 {
        let gpu = free.iter().position(|&(c, m)| c >= core && m >= memory)?;
        free[gpu].0 -= core;
        free[gpu].1 -= memory;
        return Some(gpu.to_string());
    }
    let wanted = (core / 100) as usize;
    let whole: Vec<usize> = (0..free.len())
        .filter(|&g| free[g].0 == 100)
        .take(wanted)
        .collect();
    if whole.len() < wanted {
        return None;
    }
    for &g in &whole {
        free[g] = (0, 0);
    }
    Some(
        whole
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(","),
    )
}
