import type { HomeLayout } from "../../config/paths.ts";
import type { KeyDocument, ResolvedRequest } from "./key.ts";
import { entryPaths, isReady, listKeys, readMeta } from "../store/store.ts";

/**
 * "Why did it rebuild?": the env already built here for the same interpreter
 * whose key document is nearest the request's, and the inputs that differ,
 * in words. Both documents are the key's own (meta.json's `request`), so what
 * differs is exactly what made the keys differ; never a secret (the document
 * holds variables and credentials by digest only).
 */

export interface NearestEnv {
  key: string;
  path: string;
  summary: string;
  created: string | null;
  /** Each input that differs, one line each: `requirements file reqs.txt: + dep-b, - dep-a`. */
  differs: string[];
}

/** The ready env nearest the request (fewest differing inputs, then the newest); null when none was built for its interpreter. */
export function nearestEnv(layout: HomeLayout, resolved: ResolvedRequest): NearestEnv | null {
  let best: NearestEnv | null = null;
  for (const key of listKeys(layout)) {
    if (key === resolved.key) continue;
    const paths = entryPaths(layout, key);
    if (!isReady(paths)) continue;
    const meta = readMeta(paths);
    const theirs = meta?.request as Partial<KeyDocument> | undefined;
    // The same interpreter: the same executable and prefix (two venvs of one Python are two interpreters).
    const interpreter = resolved.doc.interpreter;
    if (!meta || theirs?.interpreter?.executable !== interpreter.executable || theirs.interpreter.prefix !== interpreter.prefix) continue;
    const differs = keyDifferences(theirs, resolved);
    const better = !best || differs.length < best.differs.length || (differs.length === best.differs.length && (meta.created ?? "") > (best.created ?? ""));
    if (better) best = { key, path: paths.dir, summary: meta.summary, created: meta.created ?? null, differs };
  }
  return best;
}

const same = (a: unknown, b: unknown): boolean => JSON.stringify(a ?? null) === JSON.stringify(b ?? null);

/** Items in one list and not the other: `+ added, - removed`. */
function setChange(before: string[] = [], after: string[] = []): string {
  const added = after.filter((x) => !before.includes(x)).map((x) => `+ ${x}`);
  const removed = before.filter((x) => !after.includes(x)).map((x) => `- ${x}`);
  return [...added, ...removed].join(", ") || "the same lines in another order or number";
}

/** The inputs in which a built env's key document (`theirs`) differs from the request's, in words. */
export function keyDifferences(theirs: Partial<KeyDocument>, resolved: ResolvedRequest): string[] {
  const ours = resolved.doc;
  const { inputs } = resolved;
  const out: string[] = [];
  if (theirs.schema !== ours.schema) out.push(`the key's format: ${theirs.schema ?? "older"} → ${ours.schema} (gpulayer was upgraded)`);
  // What pip reads, wherever it was written (-p specs, a file, a file it includes): requirements, constraints, then options.
  const [was, now] = [theirs.reading, ours.reading];
  if (!same(was?.requirements, now.requirements)) out.push(`the requirements: ${setChange(was?.requirements, now.requirements)}`);
  if (!same(was?.constraints, now.constraints)) out.push(`the constraints: ${setChange(was?.constraints, now.constraints)}`);
  if (!same(was?.lines, now.lines)) out.push(`the options and other lines: ${setChange(was?.lines, now.lines)}`);
  const variables = new Set([...Object.keys(theirs.variables ?? {}), ...Object.keys(ours.variables)]);
  for (const name of [...variables].sort()) {
    const [was, now] = [theirs.variables?.[name], ours.variables[name]];
    if (was === now) continue;
    const state = (v: string | null | undefined) => (v === undefined ? "not read" : v === null ? "unset" : "set");
    out.push(`the variable \${${name}}: ${state(was) === state(now) ? "its value" : `${state(was)} → ${state(now)}`}`);
  }
  const locals = Math.max(theirs.locals?.length ?? 0, ours.locals.length);
  for (let i = 0; i < locals; i++) {
    const [was, now] = [theirs.locals?.[i], ours.locals[i]];
    const name = inputs.locals[i] ? `${inputs.locals[i]!.kind === "archive" ? "local archive" : `local ${inputs.locals[i]!.kind === "editable" ? "editable " : ""}project`} ${inputs.locals[i]!.path}` : "a local project";
    if (!was) out.push(`${name}: not in the built env's request`);
    else if (!now) out.push(`${name}: in the built env's request only`);
    else if (was.kind !== now.kind) out.push(`${name}: ${was.kind} → ${now.kind}`);
    else if (was.digest !== now.digest) out.push(`${name}: a file's content, a file added or removed`);
    else if (!same(was, now)) out.push(`${name}: its place`);
  }
  if (!same(theirs.find_links, ours.find_links)) out.push("find-links named in the requirements files: a folder's content or a URL");
  const [wasFlags, nowFlags] = [theirs.flags, ours.flags];
  if (wasFlags?.index_url !== nowFlags.index_url) out.push(`the option --index-url: ${wasFlags?.index_url ?? "none"} → ${nowFlags.index_url ?? "none"}`);
  if (!same(wasFlags?.extra_index_urls, nowFlags.extra_index_urls)) out.push(`the option --extra-index-url: ${setChange(wasFlags?.extra_index_urls, nowFlags.extra_index_urls)}`);
  if (!same(wasFlags?.find_links, nowFlags.find_links)) out.push("the option --find-links: a folder's content or a URL");
  if (theirs.installer_config !== ours.installer_config) {
    out.push(`the machine's pip configuration: ${theirs.installer_config === null ? "shut out → counted" : ours.installer_config === null ? "counted → shut out (an index option was given)" : "its content"}`);
  }
  for (const field of ["version", "implementation", "platform", "soabi"] as const) {
    if (theirs.interpreter?.[field] !== ours.interpreter[field]) out.push(`the interpreter's ${field}: ${theirs.interpreter?.[field]} → ${ours.interpreter[field]}`);
  }
  if (theirs.base !== ours.base) out.push("the base: the interpreter's own installed packages");
  if (!same(theirs.conda, ours.conda)) out.push("the conda environment: its prefix or what conda installed in it");
  if (!same(theirs.project, ours.project)) out.push("the uv project: its uv.lock, its pyproject.toml, or the groups and extras chosen");
  if (!same(theirs.pylock, ours.pylock)) out.push("the pylock.toml: its content");
  if (!same(theirs.no_build_isolation, ours.no_build_isolation)) out.push(`the packages built without isolation: ${setChange(theirs.no_build_isolation, ours.no_build_isolation)}`);
  if (!same(theirs.build_variables, ours.build_variables)) out.push("the variables a build without isolation reads (TORCH_CUDA_ARCH_LIST, CUDA_HOME)");
  // Whatever else the key holds that differs (a field this list does not know yet): named, never left out.
  const named = new Set(["schema", "reading", "variables", "locals", "find_links", "flags", "installer_config", "interpreter", "base", "conda", "project", "pylock", "no_build_isolation", "build_variables"]);
  for (const key of new Set([...Object.keys(theirs), ...Object.keys(ours)])) {
    if (!named.has(key) && !same((theirs as Record<string, unknown>)[key], (ours as Record<string, unknown>)[key])) out.push(`the key's ${key}`);
  }
  return out;
}

/** The answer as lines for a terminal, after the inputs. */
export function nearestLines(nearest: NearestEnv | null, would: "reuse" | "build"): string[] {
  if (would === "reuse") return [];
  if (!nearest) return ["nearest      none: no env is built here for this interpreter"];
  return [`nearest      ${nearest.key.slice(0, 12)} (${nearest.summary}), built ${nearest.created ?? "at an unknown time"}; differs in:`, ...nearest.differs.map((d) => `  ${d}`)];
}
