#!/usr/bin/env python3
"""Time `/explain` on a running server's admin port, one request at a time over one
kept-alive connection (docs/benchmarks.md, "Explain at 5,000 nodes"):

    python3 hack/bench/explain_latency.py 127.0.0.1:3457 team-0/big 200 [TOKEN]

Prints the status seen and the latency's min, median, p99 and max in milliseconds.
"""

import http.client
import sys
import time

address, pod, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
token = sys.argv[4] if len(sys.argv) > 4 else None
host, port = address.rsplit(":", 1)
connection = http.client.HTTPConnection(host, int(port), timeout=30)
headers = {"Authorization": f"Bearer {token}"} if token else {}
times, statuses = [], {}
for _ in range(count):
    start = time.perf_counter()
    connection.request("GET", f"/explain?pod={pod}", headers=headers)
    response = connection.getresponse()
    response.read()
    times.append((time.perf_counter() - start) * 1000)
    statuses[response.status] = statuses.get(response.status, 0) + 1
times.sort()
p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
print(f"{pod}: {count} requests, status {statuses}; ms min {times[0]:.1f} "
      f"median {times[len(times) // 2]:.1f} p99 {p99:.1f} max {times[-1]:.1f}")
