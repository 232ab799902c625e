"""One Ray session for bench/ray.ts: times runtime_env {"pip": [...]} against tasks without one.

Run by bench/ray.ts with the Python of a venv that has ray (and virtualenv, which Ray's pip plugin imports):

    python bench/ray_job.py '{"temp_dir": "...", "pip": ["tqdm"], "module": "tqdm", "repeat": 5}'

Ray's pip plugin runs pip with the runtime env agent's environment (os.environ of the raylet's children), so the
index comes from PIP_INDEX_URL / PIP_FIND_LINKS / PIP_CONFIG_FILE set by the caller before ray.init.

Prints one JSON document on the last line of stdout. Times are seconds (time.perf_counter around ray.get).
"""

import glob
import json
import os
import sys
import time

cfg = json.loads(sys.argv[1])
temp_dir = cfg["temp_dir"]
packages = cfg["pip"]
module = cfg["module"]
repeat = int(cfg.get("repeat", 5))
baseline = bool(cfg.get("baseline", True))

t = time.perf_counter()
import ray  # noqa: E402

ray.init(num_cpus=1, include_dashboard=False, _temp_dir=temp_dir, log_to_driver=False, logging_level="WARNING")
out = {"ray": ray.__version__, "init_s": time.perf_counter() - t}
session_dir = ray._private.worker.global_worker.node.get_session_dir_path()
out["session_dir"] = session_dir


@ray.remote
def plain():
    return sys.executable


@ray.remote(max_calls=1)
def plain_fresh_worker():
    import os

    return os.getpid()


@ray.remote
def with_env(name):
    import importlib
    import sys

    m = importlib.import_module(name)
    return sys.executable, getattr(m, "__version__", None), getattr(m, "__file__", None)


@ray.remote(max_calls=1)
def with_env_fresh_worker(name):
    import importlib
    import os

    importlib.import_module(name)
    return os.getpid()


def timed(fn):
    t = time.perf_counter()
    r = fn()
    return time.perf_counter() - t, r


if baseline:
    # No runtime_env: the first call also exports the function; then a worker that is there; then max_calls=1, so
    # each call needs a new worker process (the first of those may find the idle one, so it is not counted).
    out["baseline_first_s"], _ = timed(lambda: ray.get(plain.remote()))
    out["baseline_task_s"] = [timed(lambda: ray.get(plain.remote()))[0] for _ in range(repeat)]
    fresh = [timed(lambda: ray.get(plain_fresh_worker.remote())) for _ in range(repeat + 1)][1:]
    out["baseline_new_worker_s"] = [s for s, _ in fresh]
    out["baseline_new_worker_distinct_pids"] = len({p for _, p in fresh})

renv = {"pip": packages}
pip_root = os.path.join(session_dir, "runtime_resources", "pip")
out["pip_dirs_before"] = sorted(glob.glob(os.path.join(pip_root, "*")))

# Cold: Ray creates the env (clone of this venv, or virtualenv --system-site-packages; then pip install).
out["cold_s"], (exe, version, where) = timed(lambda: ray.get(with_env.options(runtime_env=renv).remote(module)))
out["env_python"], out["module_version"], out["module_file"] = exe, version, where
# Ray's warm case: the same runtime_env again in this session (the worker with that env is idle and reused).
out["warm_same_worker_s"] = [timed(lambda: ray.get(with_env.options(runtime_env=renv).remote(module)))[0] for _ in range(repeat)]
# The env is there, but each call needs a new worker process (max_calls=1); the first may find the idle worker.
fresh = [timed(lambda: ray.get(with_env_fresh_worker.options(runtime_env=renv).remote(module))) for _ in range(repeat + 1)][1:]
out["warm_new_worker_s"] = [s for s, _ in fresh]
out["warm_new_worker_distinct_pids"] = len({p for _, p in fresh})
out["pip_dirs_after"] = sorted(glob.glob(os.path.join(pip_root, "*")))

t = time.perf_counter()
ray.shutdown()
out["shutdown_s"] = time.perf_counter() - t

# What the runtime env agent did, from its log (Cloning / virtualenv / pip install lines).
steps = []
for log in sorted(glob.glob(os.path.join(session_dir, "logs", "runtime_env_setup-*.log"))):
    with open(log, encoding="utf-8", errors="replace") as f:
        for line in f:
            if any(k in line for k in ("Cloning virtualenv", "Creating virtualenv", "Installing python requirements", "Looking in indexes", "Successfully installed", "Run cmd")):
                steps.append(line.rstrip()[:2000])
out["setup_log"] = steps
print(json.dumps(out))
