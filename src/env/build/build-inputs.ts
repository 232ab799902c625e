import { existsSync, mkdirSync, readdirSync, readFileSync, realpathSync } from "node:fs";
import { join, resolve } from "node:path";
import { distributions } from "../request/interpreter.ts";
import { normalizeName } from "../request/canonical.ts";
import { fileContentHash } from "../../core/hashing.ts";
import { writeFileNamed } from "../../core/atomic.ts";

/**
 * What a build without isolation read of the env and the worker: every
 * Python process of the build records, as it exits, the files of the modules
 * it imported and the top-level names it looked for and did not find
 * (a `sitecustomize` put first on PYTHONPATH). Mapped to the distributions
 * that hold those files, that is what the wheel was built against: the
 * wheelhouse (wheelhouse.ts) hands the wheel back only where each of them is
 * installed at the same version and none of the missing names has appeared.
 */

const HOOK = `import atexit, os, sys

_missing = set()

class _RecordMissing:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if path is None and "." not in name:
            _missing.add(name)
        return None

sys.meta_path.append(_RecordMissing)

def _record():
    out = os.environ.get("GPULAYER_BUILD_RECORD")
    # pip's own process is the installer, not the build.
    if not out or "pip" in sys.modules:
        return
    files = set()
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None)
        if isinstance(f, str):
            files.add(os.path.realpath(f))
    with open(os.path.join(out, "%d.txt" % os.getpid()), "w") as fh:
        fh.write("".join("file:%s\\n" % f for f in sorted(files)))
        fh.write("".join("missing:%s\\n" % n for n in sorted(_missing)))

atexit.register(_record)
`;

/** The hook's folder (for PYTHONPATH) under `dir`, and where the processes write their records. */
export function recordingHook(dir: string): { pythonPath: string; records: string } {
  const pythonPath = join(dir, "hook");
  const records = join(dir, "records");
  for (const d of [pythonPath, records]) mkdirSync(d, { recursive: true });
  writeFileNamed(join(pythonPath, "sitecustomize.py"), HOOK);
  return { pythonPath, records };
}

export interface BuildInputs {
  /** `name==version` of each distribution the build imported a module of, sorted. */
  imported: string[];
  /** Imported files no distribution holds (the standard library, a path a .pth adds), by content: `path#sha256`. */
  files: string[];
  /** Top-level names the build looked for and did not find (an optional dependency it would have used). */
  missing: string[];
}

/** The records of a build, read against the site dirs it saw (the env's first: it shadows the worker's); the build's own tree (`own`) aside. */
export function readBuildInputs(records: string, siteDirs: string[], own: string): BuildInputs {
  const files = new Set<string>();
  const missing = new Set<string>();
  for (const name of readdirSync(records)) {
    for (const line of readFileSync(join(records, name), "utf8").split("\n")) {
      if (line.startsWith("file:")) files.add(line.slice(5));
      else if (line.startsWith("missing:")) missing.add(line.slice(8));
    }
  }
  const owners = fileOwners(siteDirs);
  const imported = new Set<string>();
  const unowned: string[] = [];
  const ownRoot = `${realpathSync(own)}/`;
  for (const f of files) {
    const owner = owners.get(f);
    if (owner) imported.add(owner);
    else if (!f.startsWith(ownRoot) && existsSync(f)) unowned.push(`${f}#${fileContentHash(f)}`);
  }
  // A name that some site dir holds now was found after all (another finder, a later path): not missing.
  const present = topLevelNames(siteDirs);
  return { imported: [...imported].sort(), files: unowned.sort(), missing: [...missing].filter((n) => !present.has(n)).sort() };
}

/** Every file the distributions of the site dirs installed (their RECORD), to its distribution's `name==version`. */
function fileOwners(siteDirs: string[]): Map<string, string> {
  const owners = new Map<string, string>();
  for (const d of distributions(siteDirs)) {
    const dir = readdirSync(d.dir).find((n) => {
      const m = /^(.+?)-([^-]+?)\.dist-info$/.exec(n);
      return m && normalizeName(m[1]!) === d.name && m[2] === d.version;
    });
    if (!dir) continue;
    let record: string;
    try {
      record = readFileSync(join(d.dir, dir, "RECORD"), "utf8");
    } catch {
      continue;
    }
    const root = realpathSync(d.dir);
    for (const line of record.split("\n")) {
      const path = line.split(",", 1)[0];
      if (!path) continue;
      const abs = resolve(root, path);
      if (!owners.has(abs)) owners.set(abs, `${d.name}==${d.version}`);
    }
  }
  return owners;
}

/** The importable top-level names the site dirs hold: packages, modules and extension modules. */
export function topLevelNames(siteDirs: string[]): Set<string> {
  const names = new Set<string>();
  for (const dir of siteDirs) {
    let entries: string[];
    try {
      entries = readdirSync(dir);
    } catch {
      continue;
    }
    for (const e of entries) names.add(e.replace(/(\.[^.]+)?\.(py|pyc|so|pyd)$/, ""));
  }
  return names;
}

/** Whether what a build saw holds in these site dirs: each distribution at its version, none of the missing names there. */
export function inputsHold(inputs: BuildInputs, siteDirs: string[]): boolean {
  const now = new Set(distributions(siteDirs).map((d) => `${d.name}==${d.version}`));
  if (!inputs.imported.every((dist) => now.has(dist))) return false;
  for (const entry of inputs.files) {
    const at = entry.lastIndexOf("#");
    const file = entry.slice(0, at);
    if (!existsSync(file) || fileContentHash(file) !== entry.slice(at + 1)) return false;
  }
  const present = topLevelNames(siteDirs);
  return !inputs.missing.some((n) => present.has(n));
}
