import { contentHash, hideCredentials } from "./hashing.ts";
import type { InterpreterInfo } from "./interpreter.ts";
import type { InstallerOptions, RequirementSet } from "./requirements.ts";

/** Bumped whenever the key document or the build changes meaning; old entries are then never reused. */
export const KEY_SCHEMA = 1;

export interface KeyInput {
  requirements: RequirementSet;
  interpreter: InterpreterInfo;
  base: string; // fingerprint of the worker's installed set
  /** null when gpulayer isolates the installer from the machine's own config. */
  installerConfig: string | null;
}

/** The key document: canonical, credential-free, stable across reorderings. Stored beside the env. */
export function keyDocument(input: KeyInput) {
  const o: InstallerOptions = input.requirements.options;
  return {
    schema: KEY_SCHEMA,
    requirements: input.requirements.requirements.map((r) => r.canonical).sort(),
    constraints: input.requirements.constraints.map((r) => r.canonical).sort(),
    options: {
      index_url: o.indexUrl ? hideCredentials(o.indexUrl) : null,
      extra_index_urls: o.extraIndexUrls.map(hideCredentials),
      find_links: o.findLinks.map(hideCredentials),
      no_index: o.noIndex,
      pre: o.pre,
      prefer_binary: o.preferBinary,
      no_binary: [...o.noBinary].sort(),
      only_binary: [...o.onlyBinary].sort(),
      trusted_hosts: [...o.trustedHosts].sort(),
      require_hashes: o.requireHashes,
    },
    installer_config: input.installerConfig,
    interpreter: {
      path: input.interpreter.path,
      executable: input.interpreter.realExecutable,
      prefix: input.interpreter.prefix,
      version: input.interpreter.version,
      implementation: input.interpreter.implementation,
      platform: input.interpreter.platform,
      soabi: input.interpreter.soabi,
    },
    base: input.base,
  };
}

export type KeyDocument = ReturnType<typeof keyDocument>;

export function envKey(doc: KeyDocument): string {
  return contentHash(JSON.stringify(doc));
}

/** The request in short, for listings: `tqdm, numpy<3`. */
export function requestSummary(doc: KeyDocument, max = 60): string {
  const text = doc.requirements.map((r) => r.replace(/ --hash=\S+/g, "")).join(", ") || "(no requirements)";
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}
