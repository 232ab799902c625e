/**
 * Containers for jobs: find a working engine (Docker or Podman), make sure an
 * image is on the machine (pulled once, then reused; recorded in gpulayer's
 * inventory), and run a command in it.
 */
import { UsageError } from "../errors.ts";

export { detectEngine, type Engine, type EngineEnv, type EngineHost, type EngineName } from "./engine.ts";
export { type EnsureHooks, type EnsureOptions, type EnsureResult, ensureImage, parsePullPolicy, type PullPolicy } from "./ensure.ts";
export { cdiGpuDevices, gpuArgs } from "./gpu.ts";
export { type ImageEntry, type ImageRecord, listImageRecords, recordPaths } from "./inventory.ts";
export type { PullProgress } from "./pull.ts";
export { type ContainerSettings, containerExists, containerSettings, removeContainer, type RunContainerOptions, type RunningContainer, runContainer } from "./run.ts";
