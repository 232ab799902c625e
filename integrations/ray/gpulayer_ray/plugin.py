"""A Ray runtime_env plugin that starts Ray's workers with the Python of an
environment gpulayer prepared on the node.

Register it on every node (the runtime_env agent loads it):
    RAY_RUNTIME_ENV_PLUGINS='[{"class": "gpulayer_ray.GpulayerPlugin"}]' ray start ...
Then `runtime_env={"gpulayer": {"pip": ["tqdm"]}}` on a job, task or actor.

The env links the node's Python (the one running Ray's agent), so ray, torch
and whatever else the node has are used as they are, never installed again.
gpulayer's cache and locks make one build per env per node, reused across
Ray sessions and restarts; `gpulayer gc` governs what is kept.
"""

import asyncio
import json
import logging
import os
import shlex
import shutil
import sys
from typing import Dict, List, Optional

from ray._private.runtime_env.plugin import RuntimeEnvPlugin

# The fields of `environment` in a gpulayer job file the plugin passes on
# (`pip` is Ray's own spelling of a list of requirements).
FIELDS = ("pip", "requirements", "index_url", "extra_index_urls", "find_links", "conda", "prepare_timeout")
# runtime_env fields that also choose the worker's Python: two choosers cannot both win.
CONFLICTING = ("pip", "uv", "conda", "py_executable", "image_uri", "container")
BINARY_VARIABLE = "GPULAYER_BIN"


def _strings(value, field: str) -> List[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ValueError(f"runtime_env gpulayer.{field}: must be a string or a list of strings")


def _request(runtime_env) -> Dict:
    request = runtime_env.get("gpulayer")
    if not isinstance(request, dict):
        raise ValueError('runtime_env gpulayer: must be a dict such as {"pip": ["tqdm"]}')
    if "image" in request:
        raise ValueError("runtime_env gpulayer.image: not supported by the Ray plugin (Ray starts its workers itself); use Ray's image_uri")
    unknown = sorted(set(request) - set(FIELDS))
    if unknown:
        raise ValueError(f"runtime_env gpulayer: unknown field(s) {', '.join(unknown)}; known: {', '.join(FIELDS)}")
    return request


def prepare_argv(binary: str, request: Dict, python: str) -> List[str]:
    """The `gpulayer env prepare` command line for a runtime_env's gpulayer request."""
    argv = [binary, "env", "prepare", "--json", "--local"]
    requirements = request.get("requirements")
    if isinstance(requirements, str):
        argv.append(requirements)  # a requirements file, as in a job file
    elif requirements is not None:
        for spec in _strings(requirements, "requirements"):
            argv += ["-p", spec]
    for spec in _strings(request.get("pip", []), "pip"):
        argv += ["-p", spec]
    if request.get("conda") is not None:
        argv += ["--conda", _strings(request["conda"], "conda")[0]]
    else:
        argv += ["--python", python]
    if request.get("index_url") is not None:
        argv += ["--index-url", _strings(request["index_url"], "index_url")[0]]
    for url in _strings(request.get("extra_index_urls", []), "extra_index_urls"):
        argv += ["--extra-index-url", url]
    for link in _strings(request.get("find_links", []), "find_links"):
        argv += ["--find-links", link]
    if request.get("prepare_timeout") is not None:
        argv += ["--prepare-timeout", str(request["prepare_timeout"])]
    return argv


def _binary() -> str:
    configured = os.environ.get(BINARY_VARIABLE)
    if configured:
        return configured
    found = shutil.which("gpulayer")
    if found:
        return found
    raise RuntimeError(f"gpulayer: not found on this node's PATH; install it there or set {BINARY_VARIABLE} for `ray start`")


def _failure(stdout: bytes, stderr: bytes, code: int) -> str:
    """gpulayer's own line: the message of its --json error document, else its last stderr line."""
    try:
        return "gpulayer: " + json.loads(stdout)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        lines = [line for line in stderr.decode(errors="replace").splitlines() if line.strip()]
        return "gpulayer: " + (lines[-1] if lines else f"env prepare exited with code {code}")


def leased_python(python: str, env_path: str, key: str) -> str:
    """The worker's command: the env's python, after a lease on the env in the worker's own pid.

    Ray execs the worker through `bash -c "exec <py_executable> ARGS"`. This puts a shell first that
    writes a lease file (gpulayer's src/core/lease.ts: `<home>/leases/env/<key>/<pid>-<name>`, JSON with
    the pid and a holder) naming its own pid, then execs the python in that same pid. While the worker
    lives, `gpulayer gc` keeps the env; once it ends, gc sweeps the lease (its pid is not running).
    """
    leases = os.path.join(os.path.dirname(os.path.dirname(env_path)), "leases", "env", key)
    script = 'umask 077; mkdir -p "$1" 2>/dev/null && printf \'{"pid":%d,"holder":"ray worker %d"}\' $$ $$ >"$1/$$-ray" 2>/dev/null; shift; exec "$@"'
    return " ".join(shlex.quote(a) for a in ["/bin/sh", "-c", script, "gpulayer-lease", leases, python])


class GpulayerPlugin(RuntimeEnvPlugin):
    name = "gpulayer"

    def __init__(self):
        # The env's python per request, set by create and read by modify_context.
        self._pythons: Dict[str, str] = {}

    @staticmethod
    def validate(runtime_env_dict: dict) -> None:
        _request(runtime_env_dict)
        both = [f for f in CONFLICTING if runtime_env_dict.get(f)]
        if both:
            raise ValueError(f"runtime_env: gpulayer and {', '.join(both)} both choose the worker's Python; give one")

    @staticmethod
    def _key(runtime_env) -> str:
        return json.dumps(runtime_env.get("gpulayer"), sort_keys=True)

    # No URIs: create runs for every worker start and asks gpulayer, whose own cache answers
    # a warm request in milliseconds and rebuilds an env `gpulayer gc` removed.
    def get_uris(self, runtime_env) -> List[str]:
        return []

    async def create(self, uri: Optional[str], runtime_env, context, logger: logging.Logger) -> float:
        argv = prepare_argv(_binary(), _request(runtime_env), sys.executable)
        logger.info("gpulayer: %s", shlex.join(argv))
        try:
            proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        except OSError as error:
            raise RuntimeError(f"gpulayer: cannot run {argv[0]}: {error.strerror}") from None
        stdout, stderr = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(_failure(stdout, stderr, proc.returncode))
        report = json.loads(stdout)
        logger.info("gpulayer: env %s %s in %ss", report["path"], report["status"], report["seconds"])
        self._pythons[self._key(runtime_env)] = (report["python"], report["path"], report["key"])
        return 0  # the env's disk is gpulayer's to account for (gpulayer gc), not Ray's URI cache

    def modify_context(self, uris: List[str], runtime_env, context, logger: logging.Logger) -> None:
        prepared = self._pythons.get(self._key(runtime_env))
        if prepared is None:
            raise RuntimeError("gpulayer: the env was not prepared before the worker started")
        python, path, key = prepared
        context.py_executable = leased_python(python, path, key)
        # A job's entrypoint (`ray job submit -- python x.py`) is a shell command its supervisor runs with
        # the worker's environment: `python` there must be the env's too. Ray expands ${PATH} at the worker's start.
        context.env_vars["PATH"] = os.path.dirname(python) + ":" + context.env_vars.get("PATH", "${PATH}")
