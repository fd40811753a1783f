"""Kill a job's manager actor the way a crash would (Ray restarts it): python kill_manager.py NAME.

Connects to the cluster at RAY_ADDRESS, unless this process is connected already (``warm_python.py``).
"""

import sys

import ray

if not ray.is_initialized():
    ray.init(logging_level="ERROR", log_to_driver=False)
ray.kill(ray.get_actor(sys.argv[1], namespace="chiray"), no_restart=False)
