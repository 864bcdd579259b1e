#!/usr/bin/env python3
"""CPU a server burns for `/explain` calls whose callers hang up (docs/benchmarks.md,
"Explain with 2,000 models, and callers who leave"):

    python3 hack/bench/explain_hangup.py 127.0.0.1:3457 SERVER_PID lab/big 20 team-0/big [TOKEN]

Sends CALLS requests for the first pod one after the other, each on its own connection,
closed 0.1 s after its request without reading the answer. As soon as the last one has
left it times one request for the second pod on a fresh connection, then reads the
server's CPU time (`/proc/PID/stat`) every 0.5 s until a whole second passes with no CPU
spent (or 60 s). Prints the CPU spent while the callers waited, the later request's
status and latency, and the CPU spent after the last caller left and how long that
lasted.
"""

import http.client
import os
import socket
import sys
import time

address, pid, heavy, calls, normal = sys.argv[1:6]
token = sys.argv[6] if len(sys.argv) > 6 else None
calls = int(calls)
host, port = address.rsplit(":", 1)
auth = f"Authorization: Bearer {token}\r\n" if token else ""
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds():
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def hang_up():
    sock = socket.create_connection((host, int(port)))
    request = f"GET /explain?pod={heavy} HTTP/1.1\r\nHost: {host}\r\n{auth}\r\n"
    sock.sendall(request.encode())
    time.sleep(0.1)
    sock.close()


start = cpu_seconds()
for _ in range(calls):
    hang_up()
left_at, left_cpu = time.monotonic(), cpu_seconds()

connection = http.client.HTTPConnection(host, int(port), timeout=60)
headers = {"Authorization": f"Bearer {token}"} if token else {}
began = time.perf_counter()
connection.request("GET", f"/explain?pod={normal}", headers=headers)
response = connection.getresponse()
response.read()
latency = (time.perf_counter() - began) * 1000

last_cpu, idle_since = cpu_seconds(), time.monotonic()
while time.monotonic() - left_at < 60:
    time.sleep(0.5)
    now = cpu_seconds()
    if now - last_cpu > 0.02:
        idle_since = time.monotonic()
    elif time.monotonic() - idle_since >= 1.0:
        break
    last_cpu = now
busy_for = idle_since - left_at
end_cpu = cpu_seconds()

print(f"{calls} callers of {heavy} who left after 0.1 s: CPU {left_cpu - start:.2f} s "
      f"while they waited; then {normal}: status {response.status}, {latency:.1f} ms; "
      f"CPU {end_cpu - left_cpu:.2f} s after the last left (that request's included), "
      f"busy {max(busy_for, 0):.1f} s after")
