import { mkdirSync, readdirSync, readFileSync, renameSync, rmdirSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { contentHash } from "../../core/hashing.ts";
import { writeFileAtomic } from "../../core/atomic.ts";
import { normalizeName } from "../request/canonical.ts";
import { MIRROR_MARK, placeholderDir, type WorkerDist, writePlaceholders } from "./worker-mirror.ts";

/**
 * The worker's stand-ins (worker-mirror.ts) kept between builds as slots: a
 * folder of placeholders for one worker state, under `<root>/<state>/<slot>/`.
 * A build takes a slot whole by renaming it into its env (atomic: two builds
 * never share one), makes it the env's site-packages, and once uv has run
 * moves back every placeholder uv did not replace. That is one rename per
 * distribution each way, where hard links cost a folder and four links each
 * and their removal as much again. A build that finds no free slot writes a
 * set (the first build of a worker state, or one of several at once) and
 * leaves it as a slot for the next. A build killed half-way loses its slot
 * with its env; the next build writes one.
 *
 * Contracts between processes: a slot is only ever renamed, never changed in
 * place, so a build sees a whole slot or none. Slots are published complete
 * (placeholders uv removed are written back first). At most MAX_SLOTS per state.
 */

const MAX_SLOTS = 4;

export interface StandinLease {
  /** Fingerprint of the worker state the placeholders stand for. */
  state: string;
  dists: WorkerDist[];
  /** Placeholder folder name per distribution, as in site-packages. */
  names: string[];
  /** Whether a kept slot was taken (else the placeholders were written now). */
  fromSlot: boolean;
}

export interface AfterInstall {
  /** Placeholders still in place: uv kept the worker's copy. */
  kept: string[];
  /** Worker distributions uv replaced or removed in the env. */
  replaced: WorkerDist[];
  /** Normalised names of the distributions uv put into the env. */
  added: string[];
}

/** The worker state: every distribution's name, version, kind, place and METADATA (size, mtime). */
export function workerState(dists: WorkerDist[]): string {
  const facts = dists.map((d) => {
    const meta = d.kind === "dist-info" ? join(d.path, "METADATA") : d.path;
    const st = statSync(meta, { throwIfNoEntry: false });
    return `${d.name}\0${d.version}\0${d.kind}\0${d.path}\0${st?.size}:${st?.mtimeMs}`;
  });
  return contentHash(facts.join("\n")).slice(0, 32);
}

function errno(error: unknown): string | undefined {
  return (error as NodeJS.ErrnoException).code;
}

/** Take a free slot into `staging` (a path inside the env's own folder); false when none is free. */
function claimSlot(stateDir: string, staging: string): boolean {
  let slots: string[];
  try {
    slots = readdirSync(stateDir);
  } catch {
    return false;
  }
  for (const slot of slots) {
    try {
      renameSync(join(stateDir, slot), staging);
      return true;
    } catch (error) {
      if (errno(error) === "ENOENT") continue; // another build took it first
      return false; // another filesystem, or no permission: the placeholders are written instead
    }
  }
  return false;
}

/**
 * Make the env's site-packages the worker's placeholders plus what the new
 * venv put there. `fresh`: written now, never from a slot (a build as another
 * user, whose placeholders go with it: dropStandins).
 */
export async function placeStandins(site: string, envDir: string, dists: WorkerDist[], root: string, fresh = false): Promise<StandinLease> {
  const state = workerState(dists);
  const staging = join(envDir, ".gpulayer-standins");
  const fromSlot = !fresh && claimSlot(join(root, state), staging);
  if (!fromSlot) {
    mkdirSync(staging);
    await writePlaceholders(staging, dists);
  }
  for (const entry of readdirSync(site)) renameSync(join(site, entry), join(staging, entry));
  rmdirSync(site);
  renameSync(staging, site);
  return { state, dists, names: dists.map(placeholderDir), fromSlot };
}

function isPlaceholder(dir: string): boolean {
  try {
    return readFileSync(join(dir, "INSTALLER"), "utf8").trim() === MIRROR_MARK;
  } catch {
    return false;
  }
}

/** What uv did to the env: the placeholders it kept and replaced, the distributions it added. */
export function afterInstall(site: string, lease: StandinLease): AfterInstall {
  const kept: string[] = [];
  const replaced: WorkerDist[] = [];
  const ours = new Set<string>();
  lease.names.forEach((name, i) => {
    if (isPlaceholder(join(site, name))) {
      kept.push(name);
      ours.add(name);
    } else replaced.push(lease.dists[i]!);
  });
  const added: string[] = [];
  for (const n of readdirSync(site)) {
    if (ours.has(n)) continue;
    const m = /^(.+?)-[^-]+?\.(dist-info|egg-info)$/.exec(n);
    if (m) added.push(normalizeName(m[1]!));
  }
  return { kept, replaced, added };
}

/** Move the kept placeholders out of the env and leave them, made whole again, as a slot for the next build. */
export async function returnStandins(site: string, envDir: string, lease: StandinLease, after: AfterInstall, root: string): Promise<void> {
  const back = join(envDir, ".gpulayer-standins-back");
  mkdirSync(back);
  try {
    for (const name of after.kept) renameSync(join(site, name), join(back, name));
    if (after.replaced.length) await writePlaceholders(back, after.replaced);
    const stateDir = join(root, lease.state);
    mkdirSync(stateDir, { recursive: true });
    if (readdirSync(stateDir).length < MAX_SLOTS) renameSync(back, join(stateDir, crypto.randomUUID()));
  } finally {
    rmSync(back, { recursive: true, force: true });
  }
}

/** The kept placeholders out of the env, for good: a build's user could have changed them, so no later build takes them. */
export function dropStandins(site: string, after: AfterInstall): void {
  for (const name of after.kept) rmSync(join(site, name), { recursive: true, force: true });
}

/** Every folder in site-packages that is one of ours: none must be left in a finished env. */
export function leftoverPlaceholders(site: string): string[] {
  return readdirSync(site).filter((n) => n.endsWith(".dist-info") && isPlaceholder(join(site, n)));
}

/**
 * `uv pip check` of the worker's own packages, kept per worker state and uv
 * version. A build may answer with it instead of checking again when uv
 * replaced none of the worker's packages and added none that the worker's own
 * findings name: uv resolved what it added against the placeholders, so every
 * requirement of the new packages holds, and every requirement of the
 * worker's packages is as it was. Findings that name no package (a form this
 * does not know) make every build check.
 */
export interface BaseCheck {
  lines: string[];
  /** Every package the findings name (`The package \`a\` requires \`b\``), normalised. */
  names: string[];
  /** False when a finding names no package: then it cannot be told which builds it holds for. */
  readable: boolean;
}

function baseCheckFile(root: string, state: string, uvVersion: string): string {
  return join(root, `${state}.check-${uvVersion.replace(/[^\w.-]/g, "_")}.json`);
}

export function readBaseCheck(root: string, state: string, uvVersion: string): BaseCheck | null {
  try {
    const parsed = JSON.parse(readFileSync(baseCheckFile(root, state, uvVersion), "utf8")) as BaseCheck;
    return Array.isArray(parsed.lines) && Array.isArray(parsed.names) && typeof parsed.readable === "boolean" ? parsed : null;
  } catch {
    return null;
  }
}

export function saveBaseCheck(root: string, state: string, uvVersion: string, lines: string[]): BaseCheck {
  const names = new Set<string>();
  let readable = true;
  for (const line of lines) {
    const named = [...line.matchAll(/`([^`]+)`/g)].map((m) => m[1]!);
    if (!named.length) readable = false;
    for (const n of named) names.add(normalizeName(n.split(/[<>=!~ ;[]/, 1)[0]!));
  }
  const check: BaseCheck = { lines, names: [...names].sort(), readable };
  mkdirSync(root, { recursive: true });
  writeFileAtomic(baseCheckFile(root, state, uvVersion), JSON.stringify(check));
  return check;
}

/** The kept findings, when they are this build's own (see BaseCheck); else null: check. */
export function baseCheckHolds(check: BaseCheck | null, after: AfterInstall, lease: StandinLease): string[] | null {
  if (!check?.readable || after.replaced.length) return null;
  const touched = new Set(check.names);
  for (const d of lease.dists) touched.add(normalizeName(d.name));
  return after.added.some((n) => touched.has(n)) ? null : check.lines;
}
