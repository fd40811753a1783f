"""Kill the process of one host of a detached job, as a crash would: python kill_host.py NAME OPERATOR.

Kills the host that runs instance 0 of OPERATOR (SIGKILL, by its process id, which the job's manager tells).
Connects to the cluster at RAY_ADDRESS, unless this process is connected already (``warm_python.py``).
"""

import os
import signal
import sys

import ray

if not ray.is_initialized():
    ray.init(logging_level="ERROR", log_to_driver=False)
manager = ray.get_actor(sys.argv[1], namespace="chiray")
stats = ray.get(manager.statistics.remote())
host = next(s.host for s in stats.instances if s.operator == sys.argv[2] and s.index == 0)
pid = ray.get(manager.host_pids.remote())[host]
os.kill(pid, signal.SIGKILL)
print(pid)
