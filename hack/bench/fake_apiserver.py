#!/usr/bin/env python3
"""Serve a cluster file as an API server's lists and watches, enough for
`gpu-admission serve --release-queue=false` in API mode to list, watch and write its
GPUQuotas' status: the memory benchmark's watch path (docs/benchmarks.md, "Memory per
cached pod, from a cluster file and from the watch").

    python3 hack/bench/fake_apiserver.py CLUSTER_FILE PORT

Lists are paged as the API server pages them (`limit`, `continue`); a watch is answered
with an open stream that never brings an event; a GPUQuota's GET returns it and a PUT of
its status is stored and echoed. Anything else is a 404. Prints "ready" once the file
is read. No authentication: for a benchmark on loopback only.
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

KINDS = {
    "Node": "/api/v1/nodes",
    "Pod": "/api/v1/pods",
    "GPUQuota": "/apis/gpu-admission.io/v1alpha1/gpuquotas",
    "ResourceClaim": "/apis/resource.k8s.io/v1/resourceclaims",
    "ResourceSlice": "/apis/resource.k8s.io/v1/resourceslices",
    "DeviceClass": "/apis/resource.k8s.io/v1/deviceclasses",
}
LIST_KINDS = {"Node": ("v1", "NodeList"), "Pod": ("v1", "PodList"),
              "GPUQuota": ("gpu-admission.io/v1alpha1", "GPUQuotaList"),
              "ResourceClaim": ("resource.k8s.io/v1", "ResourceClaimList"),
              "ResourceSlice": ("resource.k8s.io/v1", "ResourceSliceList"),
              "DeviceClass": ("resource.k8s.io/v1", "DeviceClassList")}
RESOURCE_VERSION = "1000"


def read_cluster(path):
    objects = {kind: [] for kind in KINDS}
    quotas = {}
    with open(path) as file:
        for line in file:
            line = line.strip()
            if not line or line == "---":
                continue
            doc = json.loads(line)
            kind = doc.get("kind")
            if kind not in objects:
                continue
            doc.setdefault("metadata", {}).setdefault("resourceVersion", RESOURCE_VERSION)
            objects[kind].append(json.dumps(doc, separators=(",", ":")).encode())
            if kind == "GPUQuota":
                meta = doc["metadata"]
                quotas[(meta["namespace"], meta["name"])] = doc
    return objects, quotas


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, code, body):
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def not_found(self):
        print(f"404 {self.command} {self.path}", file=sys.stderr, flush=True)
        self.reply(404, json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                    "reason": "NotFound", "code": 404}).encode())

    def do_GET(self):
        url = urlparse(self.path)
        query = parse_qs(url.query)
        for kind, path in KINDS.items():
            if url.path == path:
                return self.watch() if query.get("watch") == ["true"] else self.list(kind, query)
        quota = self.quota_key(url.path)
        if quota in self.server.quotas:
            return self.reply(200, json.dumps(self.server.quotas[quota]).encode())
        self.not_found()

    def do_PUT(self):
        url = urlparse(self.path)
        quota = self.quota_key(url.path.removesuffix("/status"))
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if quota not in self.server.quotas:
            return self.not_found()
        doc = json.loads(body)
        self.server.quotas[quota] = doc
        self.reply(200, json.dumps(doc).encode())

    def quota_key(self, path):
        parts = path.strip("/").split("/")
        # apis/gpu-admission.io/v1alpha1/namespaces/NS/gpuquotas/NAME
        if len(parts) == 7 and parts[3] == "namespaces" and parts[5] == "gpuquotas":
            return (parts[4], parts[6])
        return None

    def list(self, kind, query):
        items = self.server.objects[kind]
        start = int(query.get("continue", ["0"])[0] or 0)
        limit = int(query.get("limit", ["0"])[0] or 0) or len(items)
        page = items[start:start + limit]
        more = start + limit < len(items)
        api_version, list_kind = LIST_KINDS[kind]
        meta = {"resourceVersion": RESOURCE_VERSION}
        if more:
            meta["continue"] = str(start + limit)
            meta["remainingItemCount"] = len(items) - start - limit
        head = json.dumps({"apiVersion": api_version, "kind": list_kind, "metadata": meta})
        body = head[:-1].encode() + b',"items":[' + b",".join(page) + b"]}"
        self.reply(200, body)

    def watch(self):
        # An open stream with no event, until the client goes (or the server stops).
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        try:
            self.rfile.read(1)  # returns once the client closes the connection
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True


def main():
    path, port = sys.argv[1], int(sys.argv[2])
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.objects, server.quotas = read_cluster(path)
    print("ready", flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
