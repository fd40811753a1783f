"""Kill a job's manager actor the way a crash would (Ray restarts it): python kill_manager.py NAME."""

import sys

import ray

ray.init(logging_level="ERROR", log_to_driver=False)
ray.kill(ray.get_actor(sys.argv[1], namespace="chiray"), no_restart=False)
