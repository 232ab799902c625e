import { readdirSync, readFileSync, renameSync, rmSync } from "node:fs";
import { join } from "node:path";
import type { HomeLayout } from "../../config/paths.ts";
import type { InterpreterInfo } from "../request/interpreter.ts";
import type { ShippingStep } from "../build/run-tool.ts";
import type { BuildInputs } from "../build/build-inputs.ts";
import { type EntryPaths, type EnvMeta, markReady, removeEntryDir } from "./store.ts";

/**
 * Envs shared across a fleet (issue: build once, ship to identical workers).
 * The env cache asks a `Shipping` (given by a worker joined to a server;
 * none on a lone machine) before it builds, holding the entry's lock as a
 * build does: the shipping either hands back an artifact unpacked into a
 * fresh folder beside the entry (then it is moved in and marked ready here),
 * or a ticket to build, on which it is told how the build ended.
 */

export interface FetchedEnv {
  /** The artifact's sha256 and size, where it came from, and how long the fetch took. */
  sha256: string;
  bytes: number;
  seconds: number;
  builtBy: string;
}

export interface BuildTicket {
  /** The env is built and ready at its path: share it (in the background; the caller does not wait). */
  built(): void;
  /** The build failed or was stopped. */
  failed(): void;
  /** An offline worker (worker.offline) builds with no index: its builds without isolation take the fleet's wheels, never compile. */
  offline?: boolean;
}

export interface ShippingRequest {
  key: string;
  conditions: ArtifactConditions;
  /** A fresh folder beside the entry to unpack into (made by the shipping). */
  into: string;
  signal?: AbortSignal;
  /** The requirements built without isolation (PEP 503 names): an offline worker builds such an env itself, from the fleet's wheels. */
  deferred?: string[];
  /** What the fetch is doing, for the build's progress, as `<step> <detail>` reads (a refused artifact says why here). */
  onStep?(step: ShippingStep, detail: string): void;
}

export interface Shipping {
  /** An artifact unpacked into `into`, or a ticket to build it here; throws (a UserError) where it may not be built here either (offline). */
  acquire(req: ShippingRequest): Promise<{ fetched: FetchedEnv } | { build: BuildTicket }>;
  /** Wheels compiled without build isolation, shared with the fleet (env/build/wheelhouse.ts); none where sharing is off. */
  wheels?: WheelSharing;
}

/** A wheel another worker compiled, as the server lists it: what it was built against, to be checked here before it is fetched. */
export interface SharedWheel {
  sha256: string;
  name: string;
  wheel: string;
  bytes: number;
  seconds: number;
  inputs: BuildInputs;
  built_by: string;
  /** The sdist's sha256 it was compiled from (the wheelhouse's folder name). */
  sdist: string;
}

/**
 * The wheelhouse's side of a fleet: `sdist` is the sdist's sha256, `conditions` the hash of the interpreter
 * and the build variables (the wheelhouse's folder names). A failure to list or fetch is a miss: the build compiles.
 */
export interface WheelSharing {
  list(sdist: string, conditions: string, signal?: AbortSignal): Promise<SharedWheel[]>;
  /** The wheels of a project by name under these conditions, whatever sdist: what an offline worker, which fetches no sdist, chooses among. */
  listByName(name: string, conditions: string, signal?: AbortSignal): Promise<SharedWheel[]>;
  /** The wheel's bytes into `file`, its sha256 checked as they come; throws (and leaves no file) when it does not match. */
  fetch(wheel: SharedWheel, file: string, signal?: AbortSignal): Promise<void>;
  /**
   * Claim the compile of `sdist` under `conditions` for this task, so workers needing it at the same moment
   * compile it once: the claim (renewed while it compiles and its wheel uploads), or who holds it now (wait for its
   * wheel). Throws when the server cannot be asked.
   */
  claim(sdist: string, conditions: string, signal?: AbortSignal): Promise<{ claim: WheelClaim } | { holder: string }>;
}

/** A compile claimed for this worker's task. */
export interface WheelClaim {
  /** The wheel compiled here: uploaded in the background (the build goes on), the claim let go once it is in. */
  share(file: string, entry: Omit<SharedWheel, "sha256" | "bytes" | "built_by" | "sdist">): void;
  /** The compile failed: let the claim go (a waiting worker compiles). */
  release(): void;
}

export interface ArtifactConditions {
  /** Where the env was built (and the only place it may be unpacked). */
  env_path: string;
  platform: string;
  /** The interpreter's real binary. */
  interpreter: string;
  python: string;
  /** The worker's installed base (interpreter.ts baseFingerprint). */
  base: string;
}

export function artifactConditions(envPath: string, interpreter: InterpreterInfo, base: string): ArtifactConditions {
  return { env_path: envPath, platform: interpreter.platform, interpreter: interpreter.realExecutable, python: interpreter.version, base };
}

/** Why `have` may not be unpacked here, or null when it may. */
export function conditionsDiffer(have: ArtifactConditions, want: ArtifactConditions): string | null {
  for (const k of ["env_path", "platform", "interpreter", "python", "base"] as const) {
    if (have[k] !== want[k]) return `its ${k.replace("_", " ")} is ${have[k]}, here ${want[k]}`;
  }
  return null;
}

const FETCHING = ".fetch-";

/** Where a fetch of `key` unpacks: beside the entry, never a name the cache lists. Leftovers of a killed fetch of the same key go first (the caller holds the key's lock). */
export function fetchFolder(layout: HomeLayout, key: string): string {
  const prefix = `${FETCHING}${key}-`;
  for (const n of safeList(layout.envs)) if (n.startsWith(prefix)) rmSync(join(layout.envs, n), { recursive: true, force: true });
  return join(layout.envs, `${prefix}${crypto.randomUUID()}`);
}

function safeList(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return [];
  }
}

/** Move a fetched env into its entry and mark it ready, as a build would; its meta says where it came from. */
export function installFetched(layout: HomeLayout, key: string, paths: EntryPaths, from: string, fetched: FetchedEnv): EnvMeta {
  const meta = JSON.parse(readFileSync(join(from, ".gpulayer", "meta.json"), "utf8")) as EnvMeta;
  if (meta.key !== key || meta.path !== paths.dir) throw new Error(`the artifact holds env ${String(meta.key).slice(0, 12)} at ${meta.path}, not ${key.slice(0, 12)} at ${paths.dir}`);
  removeEntryDir(layout, paths.dir);
  renameSync(from, paths.dir);
  const kept: EnvMeta = { ...meta, created: new Date().toISOString(), fetched: { sha256: fetched.sha256, bytes: fetched.bytes, seconds: fetched.seconds, built_by: fetched.builtBy } };
  markReady(paths, kept, { openedAlready: true });
  return kept;
}
