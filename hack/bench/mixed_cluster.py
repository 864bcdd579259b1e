#!/usr/bin/env python3
"""Write a heterogeneous cluster file for the memory benchmark (docs/benchmarks.md,
"Memory per cached pod, from a cluster file and from the watch") to stdout: NODES nodes
of 8 GPUs (Tesla-T4, V100 and A100 gpu-manager nodes, device-plugin nodes of whole
`nvidia.com/gpu`, A100 nodes cut into mixed-strategy MIG slices), then PODS running GPU
pods spread over them, first fit, seeded: 10%, 30% and 50% shares, one and two whole
GPUs, MIG slices, some with an init container or a native sidecar, owned by ReplicaSets,
Jobs and StatefulSets, with the labels, annotations, spec and status `kubectl get pod -o
json` shows of a real pod (managedFields left out, as kubectl leaves them out). Three
GPUQuotas. One JSON document per line, `---` between them.

    python3 hack/bench/mixed_cluster.py 5000 40000 > /tmp/bench/mixed.yaml
    python3 hack/bench/mixed_cluster.py 0 0 > /tmp/bench/empty.yaml   # the empty server
"""

import json
import random
import sys

NODES = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
PODS = int(sys.argv[2]) if len(sys.argv) > 2 else 8 * NODES
GPUS = 8
SEED = 42

# Model label, vcuda-memory units per GPU, share of the nodes (%).
MODELS = [("Tesla-T4", 64, 50), ("Tesla-V100-SXM2-32GB", 128, 30), ("A100-SXM4-40GB", 160, 20)]
TEAMS = ["team-q", "team-a", "team-b", "research", "inference", "vision", "speech", "ranking"]
QUOTA_TEAMS = ["team-q", "team-a", "research"]


def emit(doc):
    print(json.dumps(doc, separators=(",", ":")))
    print("---")


def uid(rng):
    h = "%032x" % rng.getrandbits(128)
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-8{h[17:20]}-{h[20:32]}"


def node_kind(i, rng):
    """(model index, kind): kind is 'share' (gpu-manager), 'whole' (device plugin) or 'mig'."""
    roll = rng.randrange(100)
    below = 0
    model = 0
    for index, (_, _, share) in enumerate(MODELS):
        below += share
        if roll < below:
            model = index
            break
    kind_roll = rng.randrange(100)
    if kind_roll < 10:
        return model, "whole"
    if model == 2 and kind_roll < 25:
        return model, "mig"
    return model, "share"


def node_doc(i, name, model, kind):
    label, memory, _ = MODELS[model]
    allocatable = {"cpu": "95", "memory": "1031718340Ki", "pods": "110",
                   "ephemeral-storage": "1797572905767", "hugepages-1Gi": "0", "hugepages-2Mi": "0"}
    if kind == "share":
        allocatable["tencent.com/vcuda-core"] = str(100 * GPUS)
        allocatable["tencent.com/vcuda-memory"] = str(memory * GPUS)
    elif kind == "whole":
        allocatable["nvidia.com/gpu"] = str(GPUS)
    else:
        allocatable["nvidia.com/mig-1g.5gb"] = str(7 * GPUS)
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
              "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "gpu-8x",
              "topology.kubernetes.io/zone": f"zone-{i % 3}", "nvidia.com/gpu.product": label,
              "nvidia.com/gpu.count": str(GPUS)}
    if kind == "mig":
        labels["nvidia.com/mig.strategy"] = "mixed"
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": f"00000000-0000-4000-9000-{i:012d}",
                     "creationTimestamp": "2026-10-01T08:00:00Z", "labels": labels},
        "spec": {"podCIDR": f"10.{i // 250}.{i % 250}.0/24"},
        "status": {"capacity": allocatable, "allocatable": allocatable,
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                   "message": "kubelet is posting ready status",
                                   "lastHeartbeatTime": "2026-11-29T10:00:00Z",
                                   "lastTransitionTime": "2026-10-01T08:01:00Z"}],
                   "nodeInfo": {"kubeletVersion": "v1.33.2", "containerRuntimeVersion": "containerd://1.7.27",
                                "kernelVersion": "6.8.0-60-generic", "osImage": "Ubuntu 24.04.2 LTS",
                                "architecture": "amd64", "operatingSystem": "linux"}},
    }


def shape(kind, rng):
    """(resource limits beyond cpu and memory, GPUs or share of one GPU to take)."""
    if kind == "mig":
        return {"nvidia.com/mig-1g.5gb": "1"}, ("mig", 1)
    if kind == "whole":
        n = 1 if rng.randrange(3) else 2
        return {"nvidia.com/gpu": str(n)}, ("whole", n)
    roll = rng.randrange(10)
    if roll < 6:
        core = [10, 30, 50][roll % 3]
        return {"tencent.com/vcuda-core": str(core)}, ("share", core)
    n = 1 if roll < 9 else 2
    return {"tencent.com/vcuda-core": str(100 * n)}, ("whole", n)


def first_fit(free, mig_free, want, memory_per_gpu):
    """GPU indices taken (share: one; whole: n free GPUs), or None; updates `free`."""
    what, amount = want
    if what == "mig":
        if mig_free[0] < amount:
            return None
        mig_free[0] -= amount
        return []
    if what == "share":
        memory = (memory_per_gpu * amount + 99) // 100
        for gpu, (core, mem) in enumerate(free):
            if core >= amount and mem >= memory:
                free[gpu] = (core - amount, mem - memory)
                return [gpu]
        return None
    whole = [g for g, (core, _) in enumerate(free) if core == 100][:amount]
    if len(whole) < amount:
        return None
    for g in whole:
        free[g] = (0, 0)
    return whole


def owner_of(index, rng):
    roll = index % 10
    if roll < 7:
        return "ReplicaSet", "apps/v1"
    if roll < 9:
        return "Job", "batch/v1"
    return "StatefulSet", "apps/v1"


def pod_doc(index, rng, node, model, kind, limits, gpus, share):
    label, memory_per_gpu, _ = MODELS[model]
    team = TEAMS[index % len(TEAMS)]
    app = ["trainer", "infer", "embed", "rerank", "asr", "detector"][index % 6]
    template_hash = "%010x" % rng.getrandbits(40)
    owner_kind, owner_api = owner_of(index, rng)
    owner = f"{app}-{template_hash[:8]}" if owner_kind != "StatefulSet" else app
    name = f"{owner}-{rng.getrandbits(25):07x}"[:63] if owner_kind != "StatefulSet" else f"{app}-{index}"
    limits = dict(limits)
    if share:
        limits["tencent.com/vcuda-memory"] = str((memory_per_gpu * share + 99) // 100)
    resources = {"requests": {"cpu": "4", "memory": "16Gi"},
                 "limits": {"cpu": "8", "memory": "32Gi", **limits}}
    annotations = {"kubectl.kubernetes.io/default-container": "main",
                   "prometheus.io/scrape": "true", "prometheus.io/port": "9400"}
    if kind != "mig":
        annotations.update({
            "tencent.com/predicate-node": node,
            "tencent.com/predicate-gpu-idx-0": ",".join(map(str, gpus)),
            "tencent.com/predicate-time": str(1795600000000000000 + index),
            "tencent.com/gpu-assigned": "true",
        })
    if index % 3 == 0:
        annotations["gpu-admission.io/gpu-type"] = label
    if index % 5 == 0:
        annotations["kubectl.kubernetes.io/restartedAt"] = "2026-11-20T09:12:44Z"
    env = [{"name": "MODEL_NAME", "value": f"{app}-v{index % 7}"},
           {"name": "BATCH_SIZE", "value": str(8 << (index % 4))},
           {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
           {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}},
           {"name": "NCCL_DEBUG", "value": "WARN"}]
    mounts = [{"name": "model-cache", "mountPath": "/models"},
              {"name": "config", "mountPath": "/etc/app", "readOnly": True},
              {"name": "kube-api-access-" + template_hash[:5], "readOnly": True,
               "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]
    main = {"name": "main", "image": f"registry.example.com/ml/{app}:2.4.{index % 9}",
            "imagePullPolicy": "IfNotPresent", "command": ["python", "-m", f"{app}.serve"],
            "args": ["--port=8080", "--metrics-port=9400"], "env": env,
            "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
                      {"name": "metrics", "containerPort": 9400, "protocol": "TCP"}],
            "resources": resources, "volumeMounts": mounts,
            "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080, "scheme": "HTTP"},
                               "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1,
                               "failureThreshold": 3},
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File"}
    spec = {
        "volumes": [{"name": "model-cache", "emptyDir": {"sizeLimit": "50Gi"}},
                    {"name": "config", "configMap": {"name": f"{app}-config", "defaultMode": 420}},
                    {"name": "kube-api-access-" + template_hash[:5], "projected": {"defaultMode": 420, "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                            "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}],
        "containers": [main],
        "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default", "serviceAccount": "default", "nodeName": node,
        "securityContext": {}, "schedulerName": "gpu-scheduler",
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/gpu.product",
                                                        "operator": "In", "values": [label]}]}]}}},
        "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                         "effect": "NoExecute", "tolerationSeconds": 300},
                        {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                         "effect": "NoExecute", "tolerationSeconds": 300}],
        "priority": 0, "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority",
    }
    statuses_init = []
    if index % 4 == 1:
        spec["initContainers"] = [{"name": "fetch-model", "image": "registry.example.com/tools/fetch:1.3",
                                   "command": ["fetch", "--to=/models"],
                                   "resources": {"limits": {"cpu": "1", "memory": "2Gi"}},
                                   "volumeMounts": mounts[:1]}]
    elif index % 10 == 2:
        spec["initContainers"] = [{"name": "log-shipper", "image": "registry.example.com/tools/vector:0.41",
                                   "restartPolicy": "Always",
                                   "resources": {"limits": {"cpu": "200m", "memory": "256Mi"}}}]
    for init in spec.get("initContainers", []):
        statuses_init.append(container_status(init["name"], init["image"], rng,
                                              running=init.get("restartPolicy") == "Always"))
    status = {
        "phase": "Running",
        "conditions": [
            {"type": t, "status": "True", "lastProbeTime": None,
             "lastTransitionTime": "2026-11-28T07:%02d:%02dZ" % (index % 60, (index * 7) % 60)}
            for t in ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"]],
        "hostIP": f"10.0.{index % 250}.{index % 200 + 1}",
        "hostIPs": [{"ip": f"10.0.{index % 250}.{index % 200 + 1}"}],
        "podIP": f"10.{index // 65000 + 100}.{(index // 250) % 250}.{index % 250 + 1}",
        "podIPs": [{"ip": f"10.{index // 65000 + 100}.{(index // 250) % 250}.{index % 250 + 1}"}],
        "startTime": "2026-11-28T07:00:00Z",
        "containerStatuses": [container_status("main", main["image"], rng, running=True)],
        "qosClass": "Burstable",
    }
    if statuses_init:
        status["initContainerStatuses"] = statuses_init
    labels = {"app": app, "app.kubernetes.io/name": app, "app.kubernetes.io/part-of": "ml-platform",
              "team": team, "version": f"v{index % 7}"}
    if owner_kind == "ReplicaSet":
        labels["pod-template-hash"] = template_hash[:10]
    elif owner_kind == "Job":
        labels["batch.kubernetes.io/job-name"] = owner
        labels["batch.kubernetes.io/controller-uid"] = uid(rng)
    else:
        labels["statefulset.kubernetes.io/pod-name"] = name
        labels["apps.kubernetes.io/pod-index"] = str(index)
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "generateName": f"{owner}-", "namespace": team, "uid": uid(rng),
            "resourceVersion": str(1000000 + index), "creationTimestamp": "2026-11-28T07:00:00Z",
            "labels": labels, "annotations": annotations,
            "ownerReferences": [{"apiVersion": owner_api, "kind": owner_kind, "name": owner,
                                 "uid": uid(rng), "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": spec,
        "status": status,
    }


def container_status(name, image, rng, running):
    state = ({"running": {"startedAt": "2026-11-28T07:01:00Z"}} if running else
             {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": "2026-11-28T07:00:10Z",
                             "finishedAt": "2026-11-28T07:00:55Z",
                             "containerID": "containerd://%064x" % rng.getrandbits(256)}})
    return {"name": name, "state": state, "lastState": {}, "ready": running, "restartCount": 0,
            "image": image, "imageID": image.split(":")[0] + "@sha256:%064x" % rng.getrandbits(256),
            "containerID": "containerd://%064x" % rng.getrandbits(256), "started": running}


def main():
    rng = random.Random(SEED)
    for team in QUOTA_TEAMS:
        emit({"apiVersion": "gpu-admission.io/v1alpha1", "kind": "GPUQuota",
              "metadata": {"name": "default", "namespace": team},
              "spec": {"hard": {label: "100000" for label, _, _ in MODELS}}})
    nodes = []
    for i in range(NODES):
        name = f"gpu-node-{i:05d}"
        model, kind = node_kind(i, rng)
        nodes.append((name, model, kind, [(100, MODELS[model][1])] * GPUS, [7 * GPUS]))
        emit(node_doc(i, name, model, kind))
    placed = 0
    attempts = 0
    while placed < PODS and nodes and attempts < PODS * 20:
        attempts += 1
        name, model, kind, free, mig_free = nodes[rng.randrange(len(nodes))]
        limits, want = shape(kind, rng)
        gpus = first_fit(free, mig_free, want, MODELS[model][1])
        if gpus is None:
            continue
        share = want[1] if want[0] == "share" else 0
        emit(pod_doc(placed, rng, name, model, kind, limits, gpus, share))
        placed += 1
    print(f"{NODES} nodes, {placed} pods", file=sys.stderr)


main()
