#!/usr/bin/env python3
"""Time `/explain` on a running server's admin port against the floor, `/livez` on the
same port, interleaved: one request at a time over one kept-alive connection
(docs/benchmarks.md, "Explain at 5,000 nodes"):

    python3 hack/bench/explain_latency.py 127.0.0.1:3457 team-0/big 200 [TOKEN]

Prints, for each, the statuses seen and the latency's min, median, p99 and max in
milliseconds, and the ratio of the medians and of the p99s.
"""

import http.client
import sys
import time

address, pod, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
token = sys.argv[4] if len(sys.argv) > 4 else None
host, port = address.rsplit(":", 1)
connection = http.client.HTTPConnection(host, int(port), timeout=30)
headers = {"Authorization": f"Bearer {token}"} if token else {}
paths = {"explain": f"/explain?pod={pod}", "livez": "/livez"}
times = {name: [] for name in paths}
statuses = {name: {} for name in paths}
for _ in range(count):
    for name, path in paths.items():
        start = time.perf_counter()
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        response.read()
        times[name].append((time.perf_counter() - start) * 1000)
        statuses[name][response.status] = statuses[name].get(response.status, 0) + 1


def summary(values):
    values = sorted(values)
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
    return values[0], values[len(values) // 2], p99, values[-1]


for name in paths:
    low, median, p99, high = summary(times[name])
    print(f"{name} {pod if name == 'explain' else ''}: {count} requests, status "
          f"{statuses[name]}; ms min {low:.2f} median {median:.2f} p99 {p99:.2f} max {high:.2f}")
explain, floor = summary(times["explain"]), summary(times["livez"])
print(f"explain / livez: median {explain[1] / floor[1]:.1f}x, p99 {explain[2] / floor[2]:.1f}x")
