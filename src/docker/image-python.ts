import { existsSync, mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import type { HomeLayout } from "../config/paths.ts";
import { writeFileAtomic } from "../core/atomic.ts";
import { UserError } from "../errors.ts";
import { type Engine, type EngineEnv, engineExec, engineMessage } from "./engine.ts";

/**
 * An image's own Python, as it runs inside a container from the image: its
 * path, version and ABI, its site dirs and installed distributions, and the
 * PATH the image sets. Asked once per image id (the content of the image:
 * a tag that moves is another id) and kept in the tools folder.
 */

export interface ImagePython {
  executable: string;
  version: string;
  pyVersion: string;
  implementation: string;
  platform: string;
  soabi: string;
  siteDirs: string[];
  /** name==version of each distribution the image's Python sees, sorted. */
  distributions: string[];
  hasPip: boolean;
  /** The PATH inside a container of the image. */
  path: string;
}

// importlib.metadata: 3.8+, which is also the oldest Python an image env is built for.
const PROBE = `
import json, os, site, sys, sysconfig
if sys.version_info < (3, 8):
    print(json.dumps({"old": sys.version.split()[0]})); sys.exit(0)
import importlib.metadata as md, importlib.util
dirs = [d for d in site.getsitepackages() if os.path.isdir(d)]
dists = sorted({"%s==%s" % (d.metadata["Name"], d.version) for d in md.distributions() if d.metadata["Name"]})
print(json.dumps({"executable": os.path.realpath(sys.executable), "version": "%d.%d.%d" % sys.version_info[:3], "pyVersion": "%d.%d" % sys.version_info[:2],
  "implementation": sys.implementation.name, "platform": sysconfig.get_platform(), "soabi": sysconfig.get_config_var("SOABI") or "",
  "siteDirs": dirs, "distributions": dists, "hasPip": importlib.util.find_spec("pip") is not None, "path": os.environ.get("PATH", "")}))
`;

/** Finds the image's python3 (else python) on its own PATH; exit 3 when there is none. */
const FIND = 'for p in python3 python; do if command -v "$p" >/dev/null 2>&1; then exec "$p" -c "$1"; fi; done; exit 3';

export async function imagePython(layout: HomeLayout, engine: Engine, imageId: string, image: string, env: EngineEnv): Promise<ImagePython> {
  const file = join(layout.tools, "image-python-v1", `${engine.name}-${imageId.replace(/^sha256:/, "")}.json`);
  if (existsSync(file)) {
    try {
      return JSON.parse(readFileSync(file, "utf8")) as ImagePython;
    } catch {
      // a damaged answer is asked again
    }
  }
  const r = await engineExec(engine, ["run", "--rm", "--pull", "never", "--network", "none", "--label", "gpulayer.managed=true", "--entrypoint", "/bin/sh", imageId, "-c", FIND, "gpulayer-probe", PROBE], { env, timeoutMs: 120_000 });
  if (r.code === 3) throw new UserError(`image ${image} has no Python (no python3 or python on its PATH): an env can be built only for an image with Python 3.8 or later`);
  if (r.code !== 0) throw new UserError(`cannot ask image ${image} for its Python: ${engineMessage(`${r.stderr}\n${r.stdout}`) || `exit ${r.code}`}`);
  let answer: ImagePython & { old?: string };
  try {
    answer = JSON.parse(r.stdout.trim().split("\n").pop()!);
  } catch {
    throw new UserError(`image ${image}: its Python printed something that is not the probe's answer`);
  }
  if (answer.old) throw new UserError(`image ${image} has Python ${answer.old}: an env can be built only for Python 3.8 or later`);
  mkdirSync(join(file, ".."), { recursive: true });
  writeFileAtomic(file, JSON.stringify(answer));
  return answer;
}
