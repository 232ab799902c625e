"""One new Ray job for bench/ray-plugin.ts: connects to the bench's long-running cluster and times its first work.

    python bench/ray_plugin_job.py '{"address": "127.0.0.1:PORT", "runtime_env": {...} | null, "module": "tqdm", "actors": 0}'

actors 0: the job's first task (a new worker process: Ray starts workers per job). actors N: N actors asked for
at once, all with the same runtime_env, until each has answered. Times are seconds (time.perf_counter around
ray.get, inside the driver: ray.init is not counted). Prints one JSON document on the last line of stdout.
"""

import json
import sys
import time

cfg = json.loads(sys.argv[1])
import ray  # noqa: E402

ray.init(address=cfg["address"], logging_level="ERROR", log_to_driver=False)
renv = cfg.get("runtime_env") or None
module = cfg.get("module")  # None without a runtime_env: there is nothing to import


@ray.remote
def probe(name):
    import importlib
    import sys

    if name:
        importlib.import_module(name)
    return sys.prefix


@ray.remote(num_cpus=0)
class Probe:
    def __init__(self, name):
        import importlib

        importlib.import_module(name)

    def prefix(self):
        import sys

        return sys.prefix


out = {}
t = time.perf_counter()
if int(cfg.get("actors", 0)) == 0:
    options = {"runtime_env": renv} if renv else {}
    out["prefixes"] = [ray.get(probe.options(**options).remote(module))]
else:
    actors = [Probe.options(runtime_env=renv).remote(module) for _ in range(int(cfg["actors"]))]
    out["prefixes"] = ray.get([a.prefix.remote() for a in actors])
out["seconds"] = time.perf_counter() - t
ray.shutdown()
print(json.dumps(out))
