"""Master benchmark: 1,000 simulated servers beating once a second, then a leader kill.

Three real ``gcache-master`` processes on loopback. One process simulates ``--servers`` data
servers: each registers, then heartbeats once a second (spread evenly over the second) for
``--seconds``, from a pool of threads, as a real server's membership thread would. Reported: the
leader's CPU use over the heartbeat window (from /proc, user + system), heartbeat latency
p50/p99 as the simulated servers see it, and the beats per second achieved. Then the leader is
SIGKILLed and two times are measured from the kill: the first successful cluster-map read by a
client trying every master, and the first answer from a new leader. Prints a table and writes
``bench/results/master-latest.json``. Reported, never asserted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import write_results

from gcache.cli.local_masters import LocalMasters
from gcache.errors import MasterError
from gcache.master_client import MasterClient
from gcache.proto import master_pb2 as pb


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def leader(masters: LocalMasters) -> int | None:
    for member in masters.members:
        if not member.is_running():
            continue
        link = MasterClient([member.listen], timeout_s=0.5)
        try:
            if link.status().is_leader:
                return member.index
        except MasterError:
            pass
        finally:
            link.close()
    return None


def heartbeats(masters: LocalMasters, n_servers: int, seconds: float, threads: int) -> dict:
    links = [MasterClient(masters.addresses, timeout_s=2.0) for _ in range(threads)]
    ids = [f"sim-{i:04d}" for i in range(n_servers)]

    def register(i: int) -> None:
        server = pb.Server(id=ids[i], address=f"127.0.0.2:{10000 + i}", host_id="sim",
                           capacity_bytes=1 << 30)
        links[i % threads].register(server)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(register, range(n_servers)))
    lead = leader(masters)
    pid = masters.members[lead].proc.pid
    latencies: list[float] = []
    lock = threading.Lock()
    start = time.monotonic() + 0.5

    def beat_loop(t: int) -> None:
        mine = list(range(t, n_servers, threads))
        local = []
        for second in range(int(seconds)):
            for j, i in enumerate(mine):
                due = start + second + j * threads / n_servers
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                began = time.perf_counter()
                links[t].heartbeat(ids[i])
                local.append(time.perf_counter() - began)
        with lock:
            latencies.extend(local)

    cpu_before = cpu_seconds(pid)
    wall_before = time.monotonic()
    workers = [threading.Thread(target=beat_loop, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.monotonic() - wall_before
    cpu = cpu_seconds(pid) - cpu_before
    for link in links:
        link.close()
    return {"servers": n_servers, "seconds": round(wall, 2), "beats": len(latencies),
            "beats_per_s": len(latencies) / wall, "leader_cpu_fraction": cpu / wall,
            "heartbeat_p50_ms": float(np.percentile(latencies, 50)) * 1e3,
            "heartbeat_p99_ms": float(np.percentile(latencies, 99)) * 1e3}


def failover(masters: LocalMasters) -> dict:
    old = leader(masters)
    masters.kill(old)
    killed = time.monotonic()
    link = MasterClient(masters.addresses, timeout_s=0.5)
    first_map = new_leader = None
    while time.monotonic() - killed < 30 and (first_map is None or new_leader is None):
        if first_map is None:
            try:
                link.cluster_map()
                first_map = time.monotonic() - killed
            except MasterError:
                pass
        if new_leader is None and leader(masters) not in (None, old):
            new_leader = time.monotonic() - killed
        time.sleep(0.01)
    link.close()
    return {"first_map_read_s": first_map, "new_leader_s": new_leader}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--servers", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=16)
    args = parser.parse_args()
    with LocalMasters(3) as masters:
        while leader(masters) is None:
            time.sleep(0.1)
        beats = heartbeats(masters, args.servers, args.seconds, args.threads)
        fail = failover(masters)
    report = {"date": dt.date.today().isoformat(), "cpus": os.cpu_count(),
              "python": platform.python_version(), "heartbeats": beats, "failover": fail}
    print(f"{beats['servers']} simulated servers, {beats['beats_per_s']:.0f} beats/s for "
          f"{beats['seconds']:.0f} s: leader CPU {beats['leader_cpu_fraction']:.0%} of a core, "
          f"heartbeat p50 {beats['heartbeat_p50_ms']:.2f} ms, p99 "
          f"{beats['heartbeat_p99_ms']:.2f} ms")
    print(f"leader SIGKILLed: first map read after {fail['first_map_read_s']:.3f} s, new leader "
          f"after {fail['new_leader_s']:.2f} s")
    write_results("master", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
