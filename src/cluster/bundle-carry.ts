import { realpathSync } from "node:fs";
import { isAbsolute, relative, sep } from "node:path";
import { UserError } from "../errors.ts";
import { installedFiles, scanRequest } from "../env/index-light.ts";
import { Carried } from "./bundle.ts";

/**
 * What a bundle must carry whatever .gitignore says: every file a fresh
 * install of the requests' local projects reads (package data in an ignored
 * `data/`, a prebuilt `_kernels.so`), found by the reading and the walk the
 * env key uses, so a worker builds the project this machine builds.
 */

export interface CarryRequest {
  requirementsFile?: string;
  specs: string[];
}

export interface CarryContext {
  /** Where the requests' relative paths start. */
  cwd: string;
  /** The variables `${VAR}`s in requirements expand from. */
  env: Record<string, string | undefined>;
  /** The stat cache of content digests: reading a request digests its local projects. */
  digestCache: string | null;
}

export function carriedFiles(root: string, requests: CarryRequest[], ctx: CarryContext): Carried {
  const files = new Set<string>();
  const rootReal = realpathSync(root);
  for (const req of requests) {
    if (!req.requirementsFile && !req.specs.length) continue;
    let locals: { kind: string; path: string }[];
    try {
      locals = scanRequest(req, { env: ctx.env, cwd: ctx.cwd, digestCache: ctx.digestCache, confine: root }).locals;
    } catch (error) {
      // What the request gets wrong (a refused line, a project outside the bundle) the worker says, as it always has.
      if (error instanceof UserError) continue;
      throw error;
    }
    for (const local of locals) {
      if (local.kind === "archive") continue; // a file: sent unless ignored, and the worker names it missing
      const project = realpathSync(local.path);
      const base = relative(rootReal, project);
      if (base.startsWith("..") || isAbsolute(base)) continue;
      const prefix = base ? `${base.split(sep).join("/")}/` : "";
      for (const f of installedFiles(project)) files.add(prefix + f);
    }
  }
  return new Carried(files);
}
