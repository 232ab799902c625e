/**
 * The env as a warm `env prepare` needs it (commands/env/_warm-lane.ts): the request, its key and the look for a
 * ready env, and the report of what was found. Nothing that builds, ships or locks: a warm prepare stays a few
 * stats and a hash, and loads no more code than that takes.
 */
export { findPrepared, type PrepareRequest, type PrepareResult } from "./request/lookup.ts";
export { hostRequest } from "./request/request.ts";
export type { EnvironmentRequest } from "./request/request-schema.ts";
export { wheelDocs, wheelLines } from "./store/store.ts";
