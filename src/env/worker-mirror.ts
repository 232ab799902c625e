import { copyFileSync, existsSync, linkSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { valid as validVersion } from "@renovatebot/pep440";
import { contentHash } from "../core/hashing.ts";
import { normalizeName } from "./canonical.ts";

/**
 * What the env sees of the worker, told to uv. uv looks at nothing but the
 * env's own site-packages (uv issues 4466, 7358, 15162), so before it runs,
 * the env gets a placeholder `*.dist-info` for each distribution that pip in
 * the env would find through the .pth link: the worker's METADATA (a copy,
 * never a link), a RECORD that names only the placeholder's own files (so an
 * "uninstall" by uv removes the placeholder and nothing of the worker), a
 * WHEEL without tags (pip checks no tags of what is installed; neither does
 * uv then), and an INSTALLER mark by which they are removed afterwards.
 */

export interface WorkerDist {
  name: string;
  version: string;
  /** The dist-info or egg-info (folder or file) it was found as. */
  path: string;
  kind: "dist-info" | "egg-info";
}

export type WorkerScan = { dists: WorkerDist[] } | { unsupported: string };

export const MIRROR_MARK = "gpulayer-worker-mirror";

/**
 * The env's search path past its own site-packages, asked of the worker's
 * interpreter without its site (-S): the same `site.addsitedir` calls, in the
 * same order, that the env's .pth makes, so the worker's own .pth files act
 * as they do in the env. "moved" when one of them put a path in front.
 */
const SEARCH_PATH = `import site, sys
before = list(sys.path)
for d in sys.argv[1:]:
    site.addsitedir(d)
state = "moved" if sys.path[:len(before)] != before else "kept"
print(state, *before, *[p for p in sys.path if p not in before], sep="\\0", end="")`;

/** pip leaves these out of what is installed (pip._internal.utils.compat.stdlib_pkgs). */
const PIP_SKIPS = new Set(["python", "wsgiref", "argparse"]);

export async function scanWorker(python: string, siteDirs: string[], env: Record<string, string>): Promise<WorkerScan> {
  const proc = Bun.spawn([python, "-E", "-S", "-c", SEARCH_PATH, ...siteDirs], { env, stdin: "ignore", stdout: "pipe", stderr: "pipe" });
  const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
  if (code !== 0) return { unsupported: `${python} did not tell its search path (${err.trim().split("\n").pop() || `exit ${code}`})` };
  const [state, ...entries] = out.split("\0");
  if (state === "moved") return { unsupported: "a .pth file of the worker puts paths ahead of the env's own site-packages; only pip sees that order" };
  const seen = new Set<string>();
  const dists: WorkerDist[] = [];
  for (const entry of entries) {
    if (!entry) continue; // '' (the working directory of `python -c`): not on the env's path
    if (entry.endsWith(".egg")) return { unsupported: `the worker has an egg on its path (${entry}); only pip reads eggs` };
    let names: string[];
    try {
      names = readdirSync(entry).sort();
    } catch {
      continue; // missing, or a zip: nothing installed there that pip would count
    }
    for (const n of names) {
      if (n.endsWith(".egg-link") || n.endsWith(".egg")) return { unsupported: `the worker has ${join(entry, n)}; only pip reads eggs and .egg-link files` };
      const kind = n.endsWith(".dist-info") ? "dist-info" : n.endsWith(".egg-info") ? "egg-info" : null;
      if (!kind) continue;
      const found = identify(join(entry, n), kind);
      if (found === null) continue; // no metadata: pip skips it too
      if ("unsupported" in found) return found;
      const key = normalizeName(found.name);
      if (seen.has(key) || PIP_SKIPS.has(key)) continue; // the first on the path is the one pip and Python see
      seen.add(key);
      dists.push(found);
    }
  }
  return { dists };
}

/** Name and version as pip reads them: from the folder's name, else from the metadata. */
function identify(path: string, kind: WorkerDist["kind"]): WorkerDist | { unsupported: string } | null {
  const base = path.slice(path.lastIndexOf("/") + 1);
  const m = kind === "dist-info" ? /^(.+)-([^-]+)\.dist-info$/.exec(base) : null;
  if (m && validVersion(m[2]!)) {
    if (!isFile(join(path, "METADATA"))) return null;
    return { name: m[1]!, version: m[2]!, path, kind };
  }
  const text = metadataText(path, kind);
  if (text === null) return null;
  const name = header(text, "Name");
  const version = header(text, "Version");
  if (!name) return null;
  if (!version || !validVersion(version)) return { unsupported: `the worker's ${path} has a version uv cannot read (${version ?? "none"})` };
  return { name, version, path, kind };
}

function isFile(p: string): boolean {
  try {
    return statSync(p).isFile();
  } catch {
    return false;
  }
}

function metadataText(path: string, kind: WorkerDist["kind"]): string | null {
  const file = kind === "dist-info" ? join(path, "METADATA") : isFile(path) ? path : join(path, "PKG-INFO");
  try {
    return readFileSync(file, "utf8");
  } catch {
    return null;
  }
}

function header(text: string, name: string): string | undefined {
  const head = text.split(/\r?\n\r?\n/, 1)[0]!;
  return new RegExp(`^${name}:[ \\t]*(.*?)\\s*$`, "mi").exec(head)?.[1];
}

/**
 * An egg-info's requirements as METADATA lines, the way pip reads requires.txt
 * (pip/_internal/metadata/base.py, _iter_egg_info_dependencies): `[extra]`,
 * `[:marker]` and `[extra:marker]` sections become markers, extras normalised.
 */
export function eggInfoRequires(text: string): { requires: string[]; extras: string[] } {
  const requires: string[] = [];
  const extras: string[] = [];
  let extra = "";
  let marker = "";
  for (const raw of text.split(/\r?\n/)) {
    const line = raw.trim();
    if (!line || line.startsWith("#")) continue;
    if (line.startsWith("[") && line.endsWith("]")) {
      const section = line.replace(/^\[+|\]+$/g, "");
      const colon = section.indexOf(":");
      extra = colon === -1 ? section : section.slice(0, colon);
      marker = colon === -1 ? "" : section.slice(colon + 1);
      if (extra && !extras.includes(extra)) extras.push(extra);
      continue;
    }
    const safe = extra.replace(/[^A-Za-z0-9.-]+/g, "_").toLowerCase();
    const condition = extra && marker ? `(${marker}) and extra == "${safe}"` : extra ? `extra == "${safe}"` : marker;
    requires.push(condition ? `${line} ; ${condition}` : line);
  }
  return { requires, extras };
}

/** PKG-INFO plus what requires.txt says, as one METADATA (pip: _add_egg_info_requires). */
function eggInfoMetadata(dist: WorkerDist): string {
  const text = metadataText(dist.path, "egg-info") ?? "";
  const split = text.search(/\r?\n\r?\n/);
  const head = (split === -1 ? text : text.slice(0, split)).replace(/\s+$/, "");
  const body = split === -1 ? "" : text.slice(split);
  let requiresTxt = "";
  try {
    requiresTxt = readFileSync(join(dist.path, "requires.txt"), "utf8");
  } catch {
    // an egg-info file, or no requirements
  }
  const { requires, extras } = eggInfoRequires(requiresTxt);
  const lines = [head];
  if (!/^Requires-Dist:/im.test(head)) lines.push(...requires.map((r) => `Requires-Dist: ${r}`));
  if (!/^Provides-Extra:/im.test(head)) lines.push(...extras.map((e) => `Provides-Extra: ${e}`));
  return `${lines.join("\n")}\n${body}`;
}

/** Write the placeholders into the env's site-packages; returns their folder names. */
export function writePlaceholders(site: string, dists: WorkerDist[]): string[] {
  const created: string[] = [];
  for (const dist of dists) {
    const dir = `${normalizeName(dist.name).replace(/-/g, "_")}-${dist.version}.dist-info`;
    const target = join(site, dir);
    mkdirSync(target);
    if (dist.kind === "dist-info") copyFileSync(join(dist.path, "METADATA"), join(target, "METADATA"));
    else writeFileSync(join(target, "METADATA"), eggInfoMetadata(dist));
    writeFileSync(join(target, "WHEEL"), "Wheel-Version: 1.0\nGenerator: gpulayer (placeholder of a worker package)\nRoot-Is-Purelib: true\n");
    writeFileSync(join(target, "INSTALLER"), `${MIRROR_MARK}\n`);
    writeFileSync(join(target, "RECORD"), `${["METADATA", "WHEEL", "INSTALLER", "RECORD"].map((f) => `${dir}/${f},,`).join("\n")}\n`);
    created.push(dir);
  }
  return created;
}

const PLACEHOLDER_FILES = ["METADATA", "WHEEL", "INSTALLER", "RECORD"];

/**
 * The placeholders of one worker state, made once and kept under `templates`
 * by a fingerprint of every distribution's name, version, place and METADATA
 * (size, mtime): a build links them in (a folder and four hard links each,
 * never a copy), so a cold build does not pay for the worker's size in
 * writes. Hard links, not symbolic: uv replacing a placeholder unlinks the
 * env's names, never the template's files.
 */
export function linkPlaceholders(site: string, dists: WorkerDist[], templates: string): string[] {
  const facts = dists.map((d) => {
    const meta = d.kind === "dist-info" ? join(d.path, "METADATA") : d.path;
    const st = statSync(meta, { throwIfNoEntry: false });
    return `${d.name}\0${d.version}\0${d.kind}\0${d.path}\0${st?.size}:${st?.mtimeMs}`;
  });
  const template = join(templates, contentHash(facts.join("\n")).slice(0, 32));
  if (!existsSync(template)) {
    const tmp = `${template}.${process.pid}.${crypto.randomUUID()}.tmp`;
    mkdirSync(tmp, { recursive: true });
    writePlaceholders(tmp, dists);
    try {
      renameSync(tmp, template);
    } catch {
      rmSync(tmp, { recursive: true, force: true }); // another build made it first
    }
  }
  const created = readdirSync(template);
  try {
    for (const dir of created) {
      mkdirSync(join(site, dir));
      for (const f of PLACEHOLDER_FILES) linkSync(join(template, dir, f), join(site, dir, f));
    }
  } catch {
    // Another filesystem, or a template half gone: placeholders written afresh.
    for (const dir of created) rmSync(join(site, dir), { recursive: true, force: true });
    return writePlaceholders(site, dists);
  }
  return created;
}

/** Remove the placeholders uv left (those it replaced carry its own INSTALLER, and stay). */
export function removePlaceholders(site: string, created: string[]): void {
  for (const dir of created) {
    const target = join(site, dir);
    let mark = "";
    try {
      mark = readFileSync(join(target, "INSTALLER"), "utf8").trim();
    } catch {
      continue; // uv uninstalled it: the worker's copy was not good enough
    }
    if (mark === MIRROR_MARK) rmSync(target, { recursive: true, force: true });
  }
}

/** Every folder in site-packages that is one of ours: none must be left in a finished env. */
export function leftoverPlaceholders(site: string): string[] {
  return readdirSync(site).filter((n) => {
    if (!n.endsWith(".dist-info")) return false;
    try {
      return readFileSync(join(site, n, "INSTALLER"), "utf8").trim() === MIRROR_MARK;
    } catch {
      return false;
    }
  });
}
