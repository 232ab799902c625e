import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync } from "node:fs";
import { basename, join } from "node:path";
import { contentHash, fileContentHash } from "../../core/hashing.ts";
import { writeFileNamed } from "../../core/atomic.ts";
import { touchFile } from "../store/store.ts";
import { InstallError } from "../../errors.ts";
import { buildVariables, type DeferredBuild } from "../request/no-isolation.ts";
import { normalizeName } from "../request/canonical.ts";
import type { BuildPlan } from "./build-plan.ts";
import type { SharedWheel, WheelClaim, WheelSharing } from "../store/shipping.ts";
import { sleep } from "../../core/sleep.ts";
import { type BuildInputs, inputsHold, readBuildInputs, recordingHook } from "./build-inputs.ts";
import { pipCommand } from "./pip-path.ts";
import { type BuildHooks, installFailure, runTool } from "./run-tool.ts";

/**
 * The requirements built without build isolation, once the rest of the env
 * is installed: each sdist is fetched (pip download), its wheel taken from
 * the wheelhouse when one there was built against what this env and worker
 * hold (build-inputs.ts), else compiled here by pip with the env's and the
 * worker's packages importable and kept in the wheelhouse; then installed by
 * path. pip's wheel cache is never asked: it keys a built wheel by its sdist
 * alone, so it would hand one compiled against another torch back.
 */

export interface WheelReport {
  name: string;
  /** The wheel's file name. */
  wheel: string;
  from: "compiled" | "wheelhouse" | "fleet";
  /** From the fleet: the worker that compiled it. */
  builtBy?: string;
  /** The compile's seconds (from the wheelhouse: the seconds it took where it was compiled). */
  seconds: number;
  /** The distributions the build imported, `name==version`: what the wheel was built against. */
  builtAgainst: string[];
}

interface WheelEntry {
  name: string;
  wheel: string;
  seconds: number;
  built: string;
  inputs: BuildInputs;
}

/** The hash of one interpreter and one set of build variables: the wheelhouse's folder name under an sdist's, and what the fleet's wheels are listed by. */
function conditionsHash(plan: BuildPlan): string {
  const info = plan.interpreter;
  const variables = buildVariables(plan.env);
  return contentHash(JSON.stringify({ python: [info.implementation, info.version, info.platform, info.soabi], variables }));
}

/** A kept wheel whose build's inputs hold here, if any. */
function lookUp(dir: string, siteDirs: string[]): { path: string; entry: WheelEntry } | null {
  let names: string[];
  try {
    names = readdirSync(dir).filter((n) => !n.endsWith(".tmp"));
  } catch {
    return null;
  }
  for (const n of names.sort().reverse()) {
    let entry: WheelEntry;
    try {
      entry = JSON.parse(readFileSync(join(dir, n, "entry.json"), "utf8")) as WheelEntry;
    } catch {
      continue; // half-written by a build that died: never used
    }
    const path = join(dir, n, entry.wheel);
    if (existsSync(path) && inputsHold(entry.inputs, siteDirs)) return { path, entry };
  }
  return null;
}

/**
 * The kept wheel copied into the build's own folder, its use recorded: gc may take the entry away at any time
 * (gc/wheel-source.ts), so a copy that fails is a miss, and the build compiles.
 */
function takeOut(found: { path: string; entry: WheelEntry } | null, into: string): { path: string; entry: WheelEntry } | null {
  if (!found) return null;
  const copy = join(into, "kept", found.entry.wheel);
  try {
    mkdirSync(join(into, "kept"), { recursive: true });
    copyFileSync(found.path, copy);
    touchFile(join(found.path, "..", "last-used"));
  } catch {
    return null;
  }
  return { path: copy, entry: found.entry };
}

/** The new entry, written whole beside its final name and renamed in. */
function keep(dir: string, wheel: string, entry: WheelEntry): string {
  const name = `${Date.now()}-${contentHash(JSON.stringify(entry.inputs)).slice(0, 16)}`;
  const tmp = join(dir, `${name}.${process.pid}.tmp`);
  mkdirSync(tmp, { recursive: true });
  copyFileSync(wheel, join(tmp, entry.wheel));
  writeFileNamed(join(tmp, "entry.json"), JSON.stringify(entry, null, 2));
  touchFile(join(tmp, "last-used"));
  rmSync(join(dir, name), { recursive: true, force: true });
  renameSync(tmp, join(dir, name));
  return join(dir, name, entry.wheel);
}

export async function buildDeferred(plan: BuildPlan, deferred: DeferredBuild[], env: Record<string, string>, hooks: BuildHooks, site: string): Promise<WheelReport[]> {
  const envPython = join(plan.dir, "bin", "python");
  const work = join(plan.tmpDir ?? join(plan.dir, ".gpulayer"), "no-isolation");
  mkdirSync(work, { recursive: true });
  // pip unpacks and builds in its TMPDIR: inside `work`, whose files are the sdist's own, not inputs.
  const pipEnv = { ...env, TMPDIR: work, TEMP: work, TMP: work };
  const pip = await pipCommand(plan, envPython, pipEnv, hooks);
  const siteDirs = [site, ...plan.interpreter.siteDirs];
  const tool = async (argv: string[], failed: string, extra: Record<string, string> = {}) => {
    const { code, lines } = await runTool([...pip.argv, ...argv], { env: { ...pipEnv, ...extra }, cwd: plan.cwd, hooks, signal: plan.signal, keep: plan.keep });
    if (code !== 0) throw installFailure(failed, lines);
  };
  const reports: WheelReport[] = [];
  try {
    for (const d of deferred) {
      const into = join(work, d.name);
      if (plan.offline) {
        const took = await offlineWheel(plan, d, siteDirs, into, tool, hooks);
        reports.push({ name: d.name, wheel: took.entry.wheel, from: "fleet", builtBy: took.builtBy, seconds: took.entry.seconds, builtAgainst: took.entry.inputs.imported });
        await tool(["install", "--no-cache-dir", "--no-warn-script-location", "--progress-bar", "off", took.path], `installing ${d.name} failed`);
        continue;
      }
      const downloaded = join(into, "sdist");
      hooks.onStep?.("installing", `${d.name}: fetching its source (no build isolation)`);
      await tool(["download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation", "--progress-bar", "off", "-d", downloaded, d.install], `fetching the source of ${d.name} failed`);
      const sdist = readdirSync(downloaded).map((f) => join(downloaded, f))[0];
      if (!sdist) throw new InstallError(`fetching the source of ${d.name} gave no file`, "");
      const sdistDigest = fileContentHash(sdist);
      const conditions = conditionsHash(plan);
      const dir = join(plan.wheelhouse!, sdistDigest, conditions);
      let found = takeOut(lookUp(dir, siteDirs), into);
      const { fetched, claim } = found ? { fetched: null, claim: null } : await fleetOrClaim(plan, d.name, sdistDigest, conditions, dir, siteDirs, into, hooks);
      if (fetched) {
        found = fetched.found;
        reports.push({ name: d.name, wheel: found.entry.wheel, from: "fleet", builtBy: fetched.builtBy, seconds: found.entry.seconds, builtAgainst: found.entry.inputs.imported });
      } else if (found) {
        hooks.onStep?.("installing", `${d.name}: ${found.entry.wheel} from the wheelhouse (built against ${shown(found.entry.inputs)})`);
        reports.push({ name: d.name, wheel: found.entry.wheel, from: "wheelhouse", seconds: found.entry.seconds, builtAgainst: found.entry.inputs.imported });
      } else {
        hooks.onStep?.("installing", `${d.name}: compiling ${basename(sdist)} with the env's and the worker's packages importable`);
        const hook = recordingHook(join(into, "record"));
        const out = join(into, "wheel");
        const started = performance.now();
        let wheel: string | undefined;
        try {
          await tool(["wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir", "--progress-bar", "off", "-w", out, sdist], `building ${d.name} without build isolation failed`, { PYTHONPATH: hook.pythonPath, GPULAYER_BUILD_RECORD: hook.records });
          wheel = readdirSync(out).find((f) => f.endsWith(".whl"));
          if (!wheel) throw new InstallError(`building ${d.name} gave no wheel`, "");
        } catch (error) {
          claim?.release();
          throw error;
        }
        const seconds = (performance.now() - started) / 1000;
        const inputs = readBuildInputs(hook.records, siteDirs, work);
        mkdirSync(dir, { recursive: true });
        found = { path: keep(dir, join(out, wheel), { name: d.name, wheel, seconds, built: new Date().toISOString(), inputs }), entry: { name: d.name, wheel, seconds, built: "", inputs } };
        claim?.share(found.path, { name: d.name, wheel, seconds, inputs });
        reports.push({ name: d.name, wheel, from: "compiled", seconds, builtAgainst: inputs.imported });
      }
      // By path: no installer's cache has a say in which wheel this env gets.
      await tool(["install", "--no-cache-dir", "--no-warn-script-location", "--progress-bar", "off", found.path], `installing ${d.name} failed`);
    }
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
  return reports;
}

/** How often a wait for another worker's compile looks for its wheel again. */
const WAIT_POLL_MS = 1000;

/**
 * On a miss here: the fleet's wheel, else the compile claimed for this task (null: compiled unclaimed, as where
 * nothing is shared or the server could not be asked). While another worker holds the claim, its wheel is waited
 * for, looked for again each second, until it is there or its claim goes (its compile failed, or its worker was
 * lost: the server drops a lost worker's claims, and a claim not renewed lapses): then this worker claims and compiles.
 */
async function fleetOrClaim(plan: BuildPlan, name: string, sdist: string, conditions: string, dir: string, siteDirs: string[], into: string, hooks: BuildHooks): Promise<{ fetched: Awaited<ReturnType<typeof fromFleet>>; claim: WheelClaim | null }> {
  const sharing = plan.wheelSharing;
  if (!sharing) return { fetched: null, claim: null };
  /** Wheels fetched and refused here: not tried again. */
  const tried = new Set<string>();
  let waitedFor: string | null = null;
  for (;;) {
    const fetched = await fromFleet(plan, sdist, conditions, dir, siteDirs, into, hooks, tried);
    if (fetched) return { fetched, claim: null };
    let got: Awaited<ReturnType<WheelSharing["claim"]>>;
    try {
      got = await sharing.claim(sdist, conditions, plan.signal);
    } catch (error) {
      plan.signal?.throwIfAborted();
      hooks.onStep?.("building", `here: the compile of ${name} could not be claimed (${(error as Error).message})`);
      return { fetched: null, claim: null };
    }
    if ("claim" in got) {
      // The compiler before us may have uploaded and let go between our listing and our claim: look once more.
      const again = await fromFleet(plan, sdist, conditions, dir, siteDirs, into, hooks, tried);
      if (again) {
        got.claim.release();
        return { fetched: again, claim: null };
      }
      if (waitedFor) hooks.onStep?.("building", `here: ${waitedFor} left no wheel of ${name} that fits here`);
      return { fetched: null, claim: got.claim };
    }
    if (!waitedFor) hooks.onStep?.("waiting", `for ${got.holder}, which is compiling ${name} from the same sdist for this Python and these build variables`);
    waitedFor = got.holder;
    await sleep(WAIT_POLL_MS);
    plan.signal?.throwIfAborted();
  }
}

/**
 * On a miss here: a wheel of the same sdist, interpreter and build variables another worker compiled, whose
 * build's inputs hold here too (checked before the fetch, from what the server lists), its digest checked as it
 * comes, then kept in this wheelhouse. Any failure is a miss, its reason in the build's steps: the build compiles.
 */
async function fromFleet(plan: BuildPlan, sdist: string, conditions: string, dir: string, siteDirs: string[], into: string, hooks: BuildHooks, tried: Set<string>): Promise<{ found: { path: string; entry: WheelEntry }; builtBy: string } | null> {
  const sharing = plan.wheelSharing;
  if (!sharing) return null;
  let listed: SharedWheel[];
  try {
    listed = await sharing.list(sdist, conditions, plan.signal);
  } catch (error) {
    plan.signal?.throwIfAborted();
    hooks.onStep?.("installing", `the fleet's wheels could not be listed (${(error as Error).message}): compiling here`);
    return null;
  }
  for (const w of listed) {
    if (tried.has(w.sha256) || !/^[A-Za-z0-9_.+!-]+\.whl$/.test(w.wheel) || !holdsHere(w.inputs, siteDirs)) continue;
    tried.add(w.sha256);
    const file = join(into, "fleet", w.wheel);
    try {
      mkdirSync(join(into, "fleet"), { recursive: true });
      await sharing.fetch(w, file, plan.signal);
    } catch (error) {
      plan.signal?.throwIfAborted();
      hooks.onStep?.("refused", `wheel ${w.wheel} from ${w.built_by} (${w.sha256.slice(0, 12)}): ${(error as Error).message}`);
      continue;
    }
    hooks.onStep?.("fetching", `${w.name}: ${w.wheel} from ${w.built_by} (built against ${shown(w.inputs)})`);
    const entry: WheelEntry = { name: w.name, wheel: w.wheel, seconds: w.seconds, built: new Date().toISOString(), inputs: w.inputs };
    mkdirSync(dir, { recursive: true });
    keep(dir, file, entry);
    return { found: { path: file, entry }, builtBy: w.built_by };
  }
  return null;
}

/** What the server listed, checked here: a malformed listing fits nothing. */
function holdsHere(inputs: BuildInputs, siteDirs: string[]): boolean {
  try {
    return inputsHold(inputs, siteDirs);
  } catch {
    return false;
  }
}

/**
 * worker.offline: no sdist to fetch, so nothing to compile nor to key by. The fleet's wheels of the project under
 * this interpreter and these build variables whose build's inputs hold here are fetched (digest checked), and pip,
 * with no index, picks among them the one the requirement takes (its version specifier, as an index would be asked);
 * kept in this wheelhouse under the sdist it was compiled from. None: one line, and the build fails.
 */
async function offlineWheel(plan: BuildPlan, d: DeferredBuild, siteDirs: string[], into: string, tool: (argv: string[], failed: string) => Promise<void>, hooks: BuildHooks): Promise<{ path: string; entry: WheelEntry; builtBy: string }> {
  const refuse = (why: string) => new InstallError(`this worker is offline (worker.offline) and compiles nothing; ${d.name} is built without build isolation, and ${why}`, "");
  const sharing = plan.wheelSharing;
  if (!sharing) throw refuse("this worker takes no wheel from the fleet (worker.share_envs is false)");
  const conditions = conditionsHash(plan);
  let listed: SharedWheel[];
  try {
    listed = await sharing.listByName(d.name, conditions, plan.signal);
  } catch (error) {
    plan.signal?.throwIfAborted();
    throw refuse(`the fleet's wheels could not be listed (${(error as Error).message})`);
  }
  const named = listed.filter((w) => /^[A-Za-z0-9_.+!-]+\.whl$/.test(w.wheel) && normalizeName(w.name) === d.name);
  const fits = named.filter((w) => holdsHere(w.inputs, siteDirs));
  const offered = join(into, "fleet");
  mkdirSync(offered, { recursive: true });
  const fetched: SharedWheel[] = [];
  for (const w of fits) {
    if (fetched.some((f) => f.wheel === w.wheel)) continue; // one file per name for pip to choose among
    try {
      await sharing.fetch(w, join(offered, w.wheel), plan.signal);
      fetched.push(w);
    } catch (error) {
      plan.signal?.throwIfAborted();
      hooks.onStep?.("refused", `wheel ${w.wheel} from ${w.built_by} (${w.sha256.slice(0, 12)}): ${(error as Error).message}`);
    }
  }
  if (!fetched.length) {
    const why = !named.length ? "the fleet shares no wheel of it for this Python and these build variables (a worker with a package index compiles it)" : `no wheel of it the fleet shares fits here (${named.length} built against what is not installed here${fits.length ? ", or refused" : ""}: ${named.map((w) => `${w.wheel} from ${w.built_by}, against ${shown(w.inputs)}`).join("; ")})`;
    throw refuse(why);
  }
  const chosen = join(into, "chosen");
  try {
    await tool(["download", "--no-index", "--no-deps", "--only-binary", ":all:", "--find-links", offered, "--progress-bar", "off", "-d", chosen, d.install], "");
  } catch {
    throw refuse(`none of the fleet's wheels of it is the one its requirement (${d.origin}) takes: ${fetched.map((w) => w.wheel).join(", ")}`);
  }
  const file = readdirSync(chosen).find((f) => f.endsWith(".whl"));
  const w = fetched.find((f) => f.wheel === file)!;
  hooks.onStep?.("fetching", `${d.name}: ${w.wheel} from ${w.built_by} (built against ${shown(w.inputs)}), with no index (worker.offline)`);
  const entry: WheelEntry = { name: d.name, wheel: w.wheel, seconds: w.seconds, built: new Date().toISOString(), inputs: w.inputs };
  if (/^[0-9a-f]{64}$/.test(w.sdist ?? "")) {
    const dir = join(plan.wheelhouse!, w.sdist, conditions);
    mkdirSync(dir, { recursive: true });
    keep(dir, join(chosen, w.wheel), entry);
  }
  return { path: join(chosen, w.wheel), entry, builtBy: w.built_by };
}

const shown = (inputs: BuildInputs) => inputs.imported.filter((d) => !d.startsWith("pip==")).join(", ") || "the standard library alone";
