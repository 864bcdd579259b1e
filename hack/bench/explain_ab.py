#!/usr/bin/env python3
"""`/explain` on two running servers side by side (docs/benchmarks.md, "Explain with
2,000 models, and callers who leave"): requests for the same pod alternate between them,
one at a time, each over its own kept-alive connection, and each server's CPU time
(`/proc/PID/stat`) is read around every request:

    python3 hack/bench/explain_ab.py lab/big 20 OLD_ADDR OLD_PID NEW_ADDR NEW_PID

Prints, for each server, the statuses, the latency's median and max in milliseconds, the
server CPU per request (its total over the requests divided by their number: the clock
ticks are 10 ms), and the ratios new / old.
"""

import http.client
import os
import sys
import time

pod, count = sys.argv[1], int(sys.argv[2])
servers = {"old": (sys.argv[3], sys.argv[4]), "new": (sys.argv[5], sys.argv[6])}
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


connections = {}
for name, (address, _) in servers.items():
    host, port = address.rsplit(":", 1)
    connections[name] = http.client.HTTPConnection(host, int(port), timeout=120)
times = {name: [] for name in servers}
cpu = {name: 0.0 for name in servers}
statuses = {name: {} for name in servers}
for _ in range(count):
    for name, (_, pid) in servers.items():
        before = cpu_seconds(pid)
        start = time.perf_counter()
        connections[name].request("GET", f"/explain?pod={pod}")
        response = connections[name].getresponse()
        response.read()
        times[name].append((time.perf_counter() - start) * 1000)
        cpu[name] += cpu_seconds(pid) - before
        statuses[name][response.status] = statuses[name].get(response.status, 0) + 1

medians = {}
for name in servers:
    values = sorted(times[name])
    medians[name] = values[len(values) // 2]
    print(f"{name} {pod}: {count} requests, status {statuses[name]}; ms median "
          f"{medians[name]:.2f} max {values[-1]:.2f}; server CPU {cpu[name] / count * 1000:.1f} ms "
          f"a request")
old_cpu = max(cpu["old"], 1e-9)
print(f"new / old: median latency {medians['new'] / medians['old']:.4f}, "
      f"CPU {cpu['new'] / old_cpu:.4f}")
