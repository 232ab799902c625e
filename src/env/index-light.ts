/**
 * The env without its build code: the request and its key, the lookup, the store, and prepare (which loads the
 * build with import() only when there is one to do). A warm `env prepare` and a warm `job run` load only this;
 * a folder that needs the build code itself imports ./index.ts.
 */
export { dryRunPrepare, prepareEnv, refuseStaleLocks, warmBuilder } from "./prepare.ts";
export { prepareLimit, type PrepareLimit } from "./prepare-limit.ts";
export { normalizeName } from "./request/canonical.ts";
export { condaActivation } from "./request/conda-activation.ts";
export { listCondaEnvs } from "./request/conda.ts";
export { inputsLines, inputsReport } from "./request/inputs-report.ts";
export { pipConfigDigest, pipConfigSourceDigest } from "./request/installer-config.ts";
export { distributions, installedSet, runningInterpreter, type InterpreterInfo } from "./request/interpreter.ts";
export { lockedProjectInputs, lockLocalSources, projectFolderProblem, projectSummary, type LockedProject } from "./request/locked-project.ts";
export { envKey, keyDocument, requestSummary, type ResolvedRequest } from "./request/key.ts";
export { findPrepared, type PrepareHooks, type PrepareRequest, type PrepareResult } from "./request/lookup.ts";
export { nearestLines } from "./request/nearest.ts";
export { WireEnvironmentSchema, type EnvironmentRequest, type WireEnvironment } from "./request/request-schema.ts";
export { scanRequest } from "./request/requirements.ts";
export { installedFiles } from "./request/tree-digest.ts";
export { holdsCredentials, lostCredentials, redactDeep, redactUrl } from "./request/url-credentials.ts";
export { acquireEntry } from "./store/cache-entry.ts";
export { findEnv, keyByPrefix, listEnvs, removeEnv, type EnvEntry } from "./store/inventory.ts";
export { conditionsDiffer, type ArtifactConditions, type BuildTicket, type FetchedEnv, type Shipping, type ShippingRequest, type SharedWheel, type WheelClaim, type WheelSharing } from "./store/shipping.ts";
export { diskUsage, entryPaths, isReady, lastUsedMs, listKeys, markReady, orphanTmpKeys, readMeta, removeEntryDir, touchFile, touchLastUsed, wheelDocs, wheelLines, type EntryPaths, type EnvMeta } from "./store/store.ts";
export { environmentRequest, hostRequest, isUrl, refuseOnImage, requestDir, type EnvSettings, type RequestAt } from "./request/request.ts";
export { requirementsFileNotFound } from "./request/requirements-file.ts";
