import { mkdirSync, readdirSync, readFileSync, statSync } from "node:fs";
import { mkdir, readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { valid as validVersion } from "@renovatebot/pep440";
import { eachAtMost } from "../../core/each.ts";
import { contentHash } from "../../core/hashing.ts";
import { writeFileAtomic } from "../../core/atomic.ts";
import { normalizeName } from "../request/canonical.ts";

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

/** A scan and what it read: the search path's folders and the files whose content it depends on. */
interface Scanned {
  scan: WorkerScan;
  watched: string[];
}

async function scan(python: string, siteDirs: string[], env: Record<string, string>): Promise<Scanned | { failed: string }> {
  const proc = Bun.spawn([python, "-E", "-S", "-c", SEARCH_PATH, ...siteDirs], { env, stdin: "ignore", stdout: "pipe", stderr: "pipe" });
  const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
  if (code !== 0) return { failed: `${python} did not tell its search path (${err.trim().split("\n").pop() || `exit ${code}`})` };
  const [state, ...entries] = out.split("\0");
  // The .pth files of the site dirs decide the search path; a folder's mtime changes with what it holds.
  const watched = [python, ...siteDirs];
  for (const d of siteDirs) for (const n of safeReaddir(d)) if (n.endsWith(".pth")) watched.push(join(d, n));
  const done = (result: WorkerScan): Scanned => ({ scan: result, watched });
  if (state === "moved") return done({ unsupported: "a .pth file of the worker puts paths ahead of the env's own site-packages; only pip sees that order" });
  const seen = new Set<string>();
  const dists: WorkerDist[] = [];
  for (const entry of entries) {
    if (!entry) continue; // '' (the working directory of `python -c`): not on the env's path
    if (entry.endsWith(".egg")) return done({ unsupported: `the worker has an egg on its path (${entry}); only pip reads eggs` });
    watched.push(entry);
    const names = safeReaddir(entry).sort(); // missing, or a zip: nothing installed there that pip would count
    for (const n of names) {
      if (n.endsWith(".egg-link") || n.endsWith(".egg")) return done({ unsupported: `the worker has ${join(entry, n)}; only pip reads eggs and .egg-link files` });
      const kind = n.endsWith(".dist-info") ? "dist-info" : n.endsWith(".egg-info") ? "egg-info" : null;
      if (!kind) continue;
      const found = identify(join(entry, n), kind, watched);
      if (found === null) continue; // no metadata: pip skips it too
      if ("unsupported" in found) return done(found);
      const key = normalizeName(found.name);
      if (seen.has(key) || PIP_SKIPS.has(key)) continue; // the first on the path is the one pip and Python see
      seen.add(key);
      dists.push(found);
    }
  }
  return done({ dists });
}

function safeReaddir(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return [];
  }
}

/** The identity of every path, and the newest mtime among them. */
function signature(paths: string[]): { text: string; newestMs: number } {
  let newestMs = 0;
  const text = paths
    .map((p) => {
      const st = statSync(p, { throwIfNoEntry: false });
      if (!st) return `${p}:-`;
      newestMs = Math.max(newestMs, st.mtimeMs);
      return `${p}:${st.ino}:${st.size}:${st.mtimeMs}`;
    })
    .join("\n");
  return { text, newestMs };
}

/** Changes closer to now than this may share an mtime with the next one (coarse file clocks): such a scan is not kept. */
const SETTLED_MS = 2000;

/**
 * What pip in the env would find of the worker. Kept under `cacheDir` with
 * the identity (inode, size, mtime) of every folder on the search path and of
 * every file the answer rests on (.pth files, metadata read for a name): an
 * install or removal in the worker changes its folder's mtime, so the kept
 * scan is used only while none of them changed, at the cost of a stat each.
 */
export async function scanWorker(python: string, siteDirs: string[], env: Record<string, string>, cacheDir: string, nowMs: number): Promise<WorkerScan> {
  const file = join(cacheDir, `${contentHash([python, ...siteDirs].join("\0")).slice(0, 32)}.json`);
  try {
    const kept = JSON.parse(readFileSync(file, "utf8")) as { watched: string[]; signature: string; scan: WorkerScan };
    if (kept.signature === signature(kept.watched).text) return kept.scan;
  } catch {
    // none kept, or unreadable: scanned afresh
  }
  const result = await scan(python, siteDirs, env);
  if ("failed" in result) return { unsupported: result.failed };
  const sig = signature(result.watched);
  if (sig.newestMs < nowMs - SETTLED_MS) {
    try {
      mkdirSync(cacheDir, { recursive: true });
      writeFileAtomic(file, JSON.stringify({ watched: result.watched, signature: sig.text, scan: result.scan }));
    } catch {
      // a read-only home: scanned again next time
    }
  }
  return result.scan;
}

/** Name and version as pip reads them: from the folder's name, else from the metadata. */
function identify(path: string, kind: WorkerDist["kind"], watched: string[]): WorkerDist | { unsupported: string } | null {
  const base = path.slice(path.lastIndexOf("/") + 1);
  const m = kind === "dist-info" ? /^(.+)-([^-]+)\.dist-info$/.exec(base) : null;
  if (m && validVersion(m[2]!)) {
    if (!isFile(join(path, "METADATA"))) return null;
    return { name: m[1]!, version: m[2]!, path, kind };
  }
  watched.push(metadataFile(path, kind));
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

function metadataFile(path: string, kind: WorkerDist["kind"]): string {
  return kind === "dist-info" ? join(path, "METADATA") : isFile(path) ? path : join(path, "PKG-INFO");
}

function metadataText(path: string, kind: WorkerDist["kind"]): string | null {
  try {
    return readFileSync(metadataFile(path, kind), "utf8");
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

/** The placeholder's folder name in site-packages. */
export function placeholderDir(dist: WorkerDist): string {
  return `${normalizeName(dist.name).replace(/-/g, "_")}-${dist.version}.dist-info`;
}

/** Written a few at a time: a worker's first build writes hundreds, and one sync write after another held its event loop (and its beats) for seconds under load. */
const PLACEHOLDER_WRITES_AT_ONCE = 16;

/** Write the placeholders into a folder (the env's site-packages, or a slot: standins.ts); returns their folder names. */
export async function writePlaceholders(site: string, dists: WorkerDist[]): Promise<string[]> {
  await eachAtMost(dists, PLACEHOLDER_WRITES_AT_ONCE, async (dist) => {
    const dir = placeholderDir(dist);
    const target = join(site, dir);
    await mkdir(target);
    // Read and written, not copied: a copy keeps the worker's 0644, and what gpulayer writes under its home is 0600.
    const metadata = dist.kind === "dist-info" ? await readFile(join(dist.path, "METADATA")) : eggInfoMetadata(dist);
    await Promise.all([
      writeFile(join(target, "METADATA"), metadata),
      writeFile(join(target, "WHEEL"), "Wheel-Version: 1.0\nGenerator: gpulayer (placeholder of a worker package)\nRoot-Is-Purelib: true\n"),
      writeFile(join(target, "INSTALLER"), `${MIRROR_MARK}\n`),
      writeFile(join(target, "RECORD"), `${["METADATA", "WHEEL", "INSTALLER", "RECORD"].map((f) => `${dir}/${f},,`).join("\n")}\n`),
    ]);
  });
  return dists.map(placeholderDir);
}
