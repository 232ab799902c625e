import { existsSync, readFileSync } from "node:fs";
import { userHome } from "../../core/home.ts";
import { join, resolve } from "node:path";
import { folderDigest, type OnHashing } from "./content-digest.ts";
import { contentHash } from "../../core/hashing.ts";
import { UsageError } from "../../errors.ts";
import { scanRequest } from "./requirements.ts";

/**
 * What pip picks up on its own when gpulayer does not isolate it: PIP_*
 * variables, its config files, and the constraint/requirement files those
 * name. All of it goes into the key as one digest (never in clear: it may
 * hold credentials), so a change there is a new environment, never a silent
 * change to a cached one.
 */
/**
 * Variables that say where pip and uv keep their caches or how they talk,
 * never what they install: passed through even when the installer is
 * isolated, and kept out of the key (a new cache folder is no new env).
 */
export const NEUTRAL_VARIABLES = new Set(["PIP_CACHE_DIR", "PIP_NO_CACHE_DIR", "PIP_DISABLE_PIP_VERSION_CHECK", "PIP_NO_INPUT", "PIP_PROGRESS_BAR", "PIP_NO_COLOR", "PIP_ROOT_USER_ACTION", "UV_CACHE_DIR", "UV_NO_CACHE"]);

export function pipConfigFiles(env: NodeJS.ProcessEnv): string[] {
  if (env.PIP_CONFIG_FILE === "/dev/null") return [];
  const home = userHome(env);
  const xdgDirs = (env.XDG_CONFIG_DIRS || "/etc/xdg").split(":").filter(Boolean);
  const files = [...xdgDirs.map((d) => join(d, "pip", "pip.conf")), "/etc/pip.conf"];
  files.push(join(env.XDG_CONFIG_HOME || join(home, ".config"), "pip", "pip.conf"), join(home, ".pip", "pip.conf"));
  if (env.PIP_CONFIG_FILE) files.push(resolve(env.PIP_CONFIG_FILE));
  return files;
}

/**
 * A constraint or requirement file the machine's configuration names, with
 * everything it reaches (nested -r/-c, find-links folders, local projects,
 * ${VAR} values), read as pip reads it: a change anywhere in it is a new env.
 */
function referencedDigest(path: string, env: NodeJS.ProcessEnv, ctx: { cwd: string; digestCache: string | null; onHashing?: OnHashing }): string {
  let inputs: ReturnType<typeof scanRequest>;
  try {
    inputs = scanRequest({ requirementsFile: path, specs: [] }, { env, cwd: ctx.cwd, digestCache: ctx.digestCache, onHashing: ctx.onHashing });
  } catch (error) {
    if (error instanceof UsageError) throw new UsageError(`the machine's pip configuration names ${path}: ${error.message}`);
    throw error;
  }
  return contentHash(
    JSON.stringify({
      files: inputs.files.map((f) => [f.path, contentHash(readFileSync(f.path))]),
      variables: [...inputs.variables].map(([name, value]) => [name, value === undefined ? null : contentHash(value)]),
      findLinks: inputs.findLinks.map((f) => [f.path ?? f.url, f.digest ?? null]),
      locals: inputs.locals.map((l) => [l.path, l.digest]),
    }),
  );
}

/** What of pip's own configuration counts: its variables and files as text, and the constraint/requirement files and find-links folders they name. */
function machineConfigParts(env: NodeJS.ProcessEnv): { parts: string[]; referenced: string[]; folders: string[]; vars: string[]; files: string[] } {
  const parts: string[] = [];
  const referenced: string[] = [];
  const folders: string[] = [];
  const vars: string[] = [];
  const files: string[] = [];
  for (const [name, value] of Object.entries(env).sort(([a], [b]) => (a < b ? -1 : 1))) {
    if (!name.startsWith("PIP_") || value === undefined || NEUTRAL_VARIABLES.has(name)) continue;
    parts.push(`env ${name}=${value}`);
    if (!(name === "PIP_CONFIG_FILE" && value === "/dev/null")) vars.push(name);
    if (name === "PIP_CONSTRAINT" || name === "PIP_REQUIREMENT") referenced.push(...value.split(/\s+/).filter(Boolean));
    if (name === "PIP_FIND_LINKS") folders.push(...value.split(/\s+/).filter(Boolean));
  }
  for (const file of pipConfigFiles(env)) {
    if (!existsSync(file)) continue;
    const text = readFileSync(file, "utf8");
    files.push(file);
    parts.push(`file ${file}\n${text}`);
    for (const m of text.matchAll(/^\s*(constraint|requirement)\s*[=:]\s*(.+)$/gm)) referenced.push(...m[2]!.trim().split(/\s+/));
    for (const m of text.matchAll(/^\s*find[-_]links\s*[=:]\s*(.+)$/gm)) folders.push(...m[1]!.trim().split(/\s+/));
  }
  return { parts, referenced, folders, vars, files };
}

/**
 * The machine's pip configuration in the key: its digest, and for --dry-run and env show what it covers (the
 * variables by name, as values may hold secrets; the files; the constraint and requirement files they name). One
 * reading of the files for both: this runs on every warm prepare that gives no index.
 */
export function pipConfigDigest(env: NodeJS.ProcessEnv, ctx: { cwd: string; digestCache: string | null; onHashing?: OnHashing }): { digest: string; sources: string[]; findLinks: { path: string; digest: string }[] } {
  const { parts, referenced, folders, vars, files } = machineConfigParts(env);
  const refs = referenced.map((ref) => resolve(ctx.cwd, ref));
  for (const path of refs) parts.push(`ref ${path}\n${existsSync(path) ? referencedDigest(path, env, ctx) : "missing"}`);
  // A wheel dropped into a find-links folder changes what an unpinned request gets.
  // One folder is often named twice (PIP_FIND_LINKS and a config file): read once.
  const findLinks: { path: string; digest: string }[] = [];
  for (const f of folders) {
    const path = resolve(ctx.cwd, f);
    if (/^[a-z][a-z0-9+.-]*:\/\//i.test(f) || !existsSync(path)) continue;
    let seen = findLinks.find((l) => l.path === path);
    if (!seen) findLinks.push((seen = { path, digest: folderDigest(path, ctx.digestCache, ctx.onHashing) }));
    parts.push(`folder ${f}\n${seen.digest}`);
  }
  return { digest: contentHash(parts.join("\n")), sources: [...vars, ...files, ...refs], findLinks };
}

/** What pip's reading of its configuration depends on, and only that: the PIP_* variables and the config files' text (not the folders or files they name). */
export function pipConfigSourceDigest(env: NodeJS.ProcessEnv): string {
  // Not the neutral ones (PIP_CACHE_DIR...): a fresh cache folder is no new configuration to ask pip about.
  const vars = Object.entries(env).filter(([k, v]) => k.startsWith("PIP_") && v !== undefined && !NEUTRAL_VARIABLES.has(k)).sort(([a], [b]) => (a < b ? -1 : 1));
  const files = pipConfigFiles(env).map((f) => `${f}\n${existsSync(f) ? readFileSync(f, "utf8") : ""}`);
  return contentHash([...vars.map(([k, v]) => `${k}=${v}`), ...files].join("\0"));
}
