import { readFileSync, statSync } from "node:fs";
import { basename, dirname, resolve } from "node:path";
import { contentHash } from "../../core/hashing.ts";
import { UsageError } from "../../errors.ts";
import { countLocalSources } from "./locked-project.ts";
import { type RequestInputs, type ScanContext, confineTo, scanRequest } from "./requirements.ts";

/**
 * A PEP 751 lock (`pylock.toml`, `pylock.NAME.toml`) as a request's
 * environment: the file's packages, exactly, installed by `uv pip install -r`
 * (uv reads the format; pip does not). What the key holds of it is read here,
 * by pattern, on the warm path; its build is in build/build.ts beside a uv
 * project's, with the same rule for the worker's packages (locked-project.ts).
 */

/** The names uv (and PEP 751) take as a lock: `pylock.toml` and `pylock.<name>.toml`. */
export const isPylockFile = (path: string): boolean => /^pylock\.([^/]+\.)?toml$/.test(basename(path));

// A package from a local folder or file: `directory = { path = "..", editable = true }`, `archive = { path = ".." }`.
const LOCAL_SOURCE = /^(directory|archive) = \{ path = "((?:[^"\\]|\\.)*)"(?:, editable = (true|false))?/gm;

/** The key's part of a pylock (its content) and the inputs its local packages make; no process is started. */
export function pylockInputs(file: string, ctx: ScanContext): { key: string; inputs: RequestInputs } {
  if (ctx.confine) confineTo(ctx.confine, file, "the requirements file", "the lock");
  if (!statSync(file, { throwIfNoEntry: false })?.isFile()) throw new UsageError(`${file}: no such file`);
  const text = readFileSync(file, "utf8");
  if (!/^lock-version\s*=/m.test(text)) throw new UsageError(`${file}: not a pylock.toml (no lock-version; PEP 751's format, as uv export --format pylock.toml writes it)`);
  const inputs = scanRequest({ specs: [] }, ctx);
  inputs.topFile = file;
  const dir = dirname(file);
  const sources = [...text.matchAll(LOCAL_SOURCE)].map((m) => ({
    kind: m[3] === "true" ? ("editable" as const) : ("project" as const),
    path: resolve(dir, JSON.parse(`"${m[2]}"`) as string),
    origin: `${file}: ${m[1]} = ${m[2]}`,
  }));
  countLocalSources(inputs, sources, basename(file), ctx);
  return { key: contentHash(text), inputs };
}
