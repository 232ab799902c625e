import { contentHash } from "../../core/hashing.ts";
import { hideCredentials } from "./url-credentials.ts";
import type { InterpreterInfo } from "./interpreter.ts";
import type { CondaEnv } from "./conda.ts";
import { type RequestInputs, variableDigests } from "./requirements.ts";
import type { LockedProject, LockedProjectKey } from "./locked-project.ts";
import type { DeferredBuild } from "./no-isolation.ts";

/** Bumped whenever the key document or the build changes meaning; old entries are then never reused. */
export const KEY_SCHEMA = 3;

/** Installer options given as flags (not in a file): they travel to the installer as variables. */
export interface FlagOptions {
  indexUrl?: string;
  extraIndexUrls: string[];
  /** Local folders already read by content (`digest`), URLs as given. */
  findLinks: { url?: string; path?: string; digest?: string }[];
}

export interface KeyInput {
  inputs: RequestInputs;
  flags: FlagOptions;
  interpreter: InterpreterInfo;
  base: string; // fingerprint of the worker's installed set
  /** null when gpulayer isolates the installer from the machine's own config. */
  installerConfig: string | null;
  /** The conda environment the interpreter is from: its prefix and what conda installed in it (conda-meta). */
  conda?: { prefix: string; meta: string };
  /** A uv project: its lock, pyproject.toml and selection (its local projects are in inputs.locals). */
  project?: LockedProjectKey;
  /** A pylock.toml: its content's digest (its local packages are in inputs.locals). */
  pylock?: string;
  /** Built last, against the env and the worker (no-isolation.ts): PEP 503 names, and the variables that change such a build. */
  noBuildIsolation?: { names: string[]; variables: Record<string, string | null> };
}

/**
 * The key document: every input the installer reads, by content, and no
 * path that does not change the result (a bundle unpacked elsewhere is the
 * same request). Credential-free: URLs' credentials and `${VAR}` values are
 * digests. Stored beside the env.
 */
export function keyDocument(input: KeyInput) {
  const { inputs, flags } = input;
  return {
    schema: KEY_SCHEMA,
    // What pip reads, not which file or -p said it: `-p a -p b` and a file of the same two lines are one request.
    reading: inputs.reading,
    variables: variableDigests(inputs.variables),
    // An editable project is linked, not copied: its place is part of what is built.
    locals: inputs.locals.map((l) => (l.kind === "editable" ? { kind: l.kind, digest: l.digest, path: l.path } : { kind: l.kind, digest: l.digest })).sort((a, b) => (JSON.stringify(a) < JSON.stringify(b) ? -1 : 1)),
    // By the variable's name (its value is in `variables` by digest): the stored document never holds it.
    find_links: inputs.findLinks.map((f) => (f.url ? { url: f.shown ?? f.url } : { digest: f.digest })),
    flags: {
      index_url: flags.indexUrl ? hideCredentials(flags.indexUrl) : null,
      extra_index_urls: flags.extraIndexUrls.map(hideCredentials),
      find_links: flags.findLinks.map((f) => (f.url ? { url: hideCredentials(f.url) } : { digest: f.digest })),
    },
    installer_config: input.installerConfig,
    interpreter: {
      executable: input.interpreter.realExecutable,
      prefix: input.interpreter.prefix,
      version: input.interpreter.version,
      implementation: input.interpreter.implementation,
      platform: input.interpreter.platform,
      soabi: input.interpreter.soabi,
    },
    base: input.base,
    // Only when there is one: the keys of every other request stay what they were.
    ...(input.conda ? { conda: input.conda } : {}),
    ...(input.project ? { project: input.project } : {}),
    ...(input.pylock ? { pylock: input.pylock } : {}),
    ...(input.noBuildIsolation ? { no_build_isolation: [...input.noBuildIsolation.names].sort(), build_variables: input.noBuildIsolation.variables } : {}),
  };
}

export type KeyDocument = ReturnType<typeof keyDocument>;

/** A request resolved to its key (prepare.ts's resolveRequest): the key, its document and what went into them. */
export interface ResolvedRequest {
  key: string;
  doc: KeyDocument;
  summary: string;
  inputs: RequestInputs;
  flags: FlagOptions;
  interpreter: InterpreterInfo;
  /** How a shim or wrapper was resolved to the interpreter that runs, when it was one. */
  interpreterVia: string | null;
  isolated: boolean;
  /** The conda environment the base interpreter is from, when the request named one. */
  conda: CondaEnv | null;
  /** The uv project the env is synced from, when the request names one. */
  project?: LockedProject;
  /** The pylock.toml (absolute) the env is installed from, when the request's requirements file is one. */
  pylock?: string;
  /** Requirements built last, without build isolation (no-isolation.ts). */
  deferred?: DeferredBuild[];
  /** What of the machine's pip configuration counts (variable names, files, the files they name); null when shut out. */
  machineConfig: string[] | null;
  /** Local find-links folders the machine's pip configuration names, by content (in the key through its digest). */
  machineFindLinks?: { path: string; digest: string }[];
}

export function envKey(doc: KeyDocument): string {
  return contentHash(JSON.stringify(doc));
}

/** The request in short, for listings: `tqdm, numpy<3, requirements.txt`. */
export function requestSummary(inputs: RequestInputs, max = 60): string {
  const parts = [...inputs.specLines.requirements, ...inputs.specLines.lines];
  if (inputs.topFile) parts.push(inputs.topFile.split("/").pop()!);
  const text = parts.join(", ") || "(no requirements)";
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}
