import type { WheelSharing } from "../store/shipping.ts";
import type { InterpreterInfo } from "../request/interpreter.ts";
import type { KeepGroup } from "./run-tool.ts";
import type { FlagOptions } from "../request/key.ts";
import type { RequestInputs } from "../request/requirements.ts";
import type { BuildAs } from "./build-user.ts";
import type { LockedProject } from "../request/locked-project.ts";
import type { DeferredBuild } from "../request/no-isolation.ts";

/**
 * What a build is given. A module of its own: build.ts and the two installer
 * paths it picks between (fast-path.ts, pip-path.ts) all read it.
 */

/** auto: the fast path where it can promise pip's result, else pip; uv / pip: that one or an error. */
export type InstallerSetting = "auto" | "uv" | "pip";

export interface BuildPlan {
  dir: string;
  interpreter: InterpreterInfo;
  /** What the request makes the installer read; the installer reads the user's own files. */
  inputs: RequestInputs;
  flags: FlagOptions;
  /** Shut the installer off from the machine's config and its PIP_ and UV_ variables (an index was given). */
  isolated: boolean;
  env: NodeJS.ProcessEnv;
  toolsDir: string;
  cwd: string;
  venvCreator?: "uv" | "venv" | "auto";
  installer?: InstallerSetting;
  /** The `uv` setting: auto (PATH, else the pinned uv in the tools folder), a path to a uv, or off. */
  uv?: string;
  /** Aborted at the time limit or on a cancel: the running installer's process group is killed. */
  signal?: AbortSignal;
  /** Records each tool's process group with the build's lock, for whoever breaks it after our death (run-tool.ts). */
  keep?: KeepGroup;
  /** The installers' TMPDIR, removed with the build (store.ts EntryPaths.tmp): a killed pip leaves nothing in /tmp. */
  tmpDir?: string;
  /** worker.run_as: the installers, the compile and the checks run as this user (build-user.ts); the tree is handed over and taken back. */
  user?: BuildAs;
  /** A uv project: `uv sync` of its lock installs the env (locked-project.ts), not the requirements. */
  project?: LockedProject;
  /** A pylock.toml (absolute): `uv pip install -r` of it installs the env, exactly its packages. */
  pylock?: string;
  /** The home's bytecode store (bytecode.ts): each module compiled once per home. */
  bytecodeStore?: string;
  /** Requirements built last, without build isolation (wheelhouse.ts). */
  deferred?: DeferredBuild[];
  /** The home's wheelhouse (config/paths.ts): wheels those builds made, by what they were built against. */
  wheelhouse?: string;
  /** The fleet's wheels (a joined worker that shares): looked up on a miss here, and given what is compiled here. */
  wheelSharing?: WheelSharing;
  /** worker.offline: no index is asked (pip --no-index, uv --offline); the builds without isolation take the fleet's wheels only. */
  offline?: boolean;
}

/** --find-links flags as the installer takes them: local folders by path, URLs as given. */
export function flagFindLinks(plan: BuildPlan): string[] {
  return plan.flags.findLinks.map((f) => f.path ?? f.url!);
}
