#!/usr/bin/env python3
"""Write the 5,000-node benchmark cluster file (docs/benchmarks.md, "Explain at 5,000
nodes") to stdout: NODES nodes of 8 GPUs, half Tesla-T4 and half A100, four running GPU
pods on each (30, 50 or 100 vcuda-core, opted in to moves, owned by a ReplicaSet that is
in the file), 20 GPUQuotas, and one pending pod, team-0/big, asking for 6 whole Tesla-T4
GPUs on one node. One JSON document per line, `---` between them.

    python3 hack/bench/cluster.py 5000 > /tmp/bench/cluster-5000.yaml

With MODELS (more than 2), the odd nodes are spread over MODELS - 1 models (A100,
Model-1, Model-2, ...) and one more pending pod, lab/big, asks for the same 6 Tesla-T4
GPUs in a namespace without a GPUQuota, where every model may be used (docs/benchmarks.md,
"Explain with 2,000 models"):

    python3 hack/bench/cluster.py 5000 2000 > /tmp/bench/cluster-5000-2000.yaml
"""

import json
import sys

NODES = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
MODELS = int(sys.argv[2]) if len(sys.argv) > 2 else 2
TEAMS = 20
SHARES = [30, 50, 100]


def emit(doc):
    print(json.dumps(doc, separators=(",", ":")))
    print("---")


for team in range(TEAMS):
    emit({
        "apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUQuota",
        "metadata": {"name": "default", "namespace": f"team-{team}"},
        "spec": {"hard": {"Tesla-T4": "100000", "A100": "100000"}},
    })

pod = 0
for n in range(NODES):
    other = (n // 2) % (MODELS - 1)
    model = "Tesla-T4" if n % 2 == 0 else ("A100" if other == 0 else f"Model-{other}")
    node = f"node-{n}"
    emit({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node, "labels": {"nvidia.com/gpu.product": model}},
        "status": {"allocatable": {
            "cpu": "64", "memory": "256Gi",
            "tencent.com/vcuda-core": "800", "tencent.com/vcuda-memory": "256",
        }},
    })
    for gpu in range(4):
        core = SHARES[(n + gpu) % len(SHARES)]
        team = f"team-{pod % TEAMS}"
        owner = f"rs-{pod}"
        uid = f"00000000-0000-4000-8000-{pod:012d}"
        emit({
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": owner, "namespace": team, "uid": uid},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": owner}}},
        })
        emit({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": f"p{pod}", "namespace": team, "labels": {"app": owner},
                "annotations": {
                    "gpu-admission.io/movable": "true",
                    "gpu-admission.io/gpu-type": model,
                    "tencent.com/predicate-node": node,
                    "tencent.com/predicate-gpu-idx-0": str(gpu * 2),
                },
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                     "name": owner, "uid": uid, "controller": True}],
            },
            "spec": {"nodeName": node, "containers": [{
                "name": "c", "image": "registry.example/infer:1",
                "resources": {"requests": {"cpu": "2", "memory": "8Gi"},
                              "limits": {"tencent.com/vcuda-core": str(core),
                                         "tencent.com/vcuda-memory": "16"}},
            }]},
            "status": {"phase": "Running"},
        })
        pod += 1


def pending_big(namespace):
    """A pod asking for 6 whole Tesla-T4 GPUs on one node: no node has them free."""
    emit({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "big", "namespace": namespace,
                     "annotations": {"gpu-admission.io/gpu-type": "Tesla-T4"}},
        "spec": {"schedulerName": "gpu-scheduler", "containers": [{
            "name": "c", "image": "registry.example/train:1",
            "resources": {"limits": {"tencent.com/vcuda-core": "600",
                                     "tencent.com/vcuda-memory": "96"}},
        }]},
        "status": {"phase": "Pending"},
    })


pending_big("team-0")
if MODELS > 2:
    pending_big("lab")
