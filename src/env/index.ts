/**
 * The one entry point of src/env for the rest of src: request/ (what is asked for, its key, the lookup),
 * build/ (making an env), store/ (the cache, its entries and artifacts). ./index-light.ts is the same without the
 * build code, for the paths that must not load it (a warm prepare or job).
 */
export * from "./index-light.ts";
export { type BuildPlan } from "./build/build-plan.ts";
export { installerEnv, readMachinePipSettings } from "./build/build.ts";
export { machinePipConfig } from "./build/fast-path.ts";
export { ToolStopped, installFailure, runTool } from "./build/run-tool.ts";
export { exportLock, lockRegistries, projectUvEnv, sameVersion } from "./build/locked-project.ts";
export { UV_VERSION, findUv, pinnedUvPath } from "./build/uv-tool.ts";
export { machinePipSettings, originsOf, relocatingOptions, translateForUv, type PipSettings } from "./request/pip-config.ts";
export { artifactFault, fileSha256, unpackedMetaMismatch } from "./store/artifact.ts";
export { packEnv } from "./store/pack.ts";
export { unpackEnv, unpackEnvStream } from "./store/unpack.ts";
export { entryConditions, hostConditions, prefetchEnv, type HostConditions } from "./store/prefetch.ts";
