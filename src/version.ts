import pkg from "../package.json" with { type: "json" };

// Replaced at build time by `bun build --define`; the fallbacks serve `bun run`.
declare const GPULAYER_VERSION: string | undefined;
declare const GPULAYER_COMMIT: string | undefined;
declare const GPULAYER_TARGET: string | undefined;

export const versionInfo = {
  version: typeof GPULAYER_VERSION === "string" ? GPULAYER_VERSION : pkg.version,
  commit: typeof GPULAYER_COMMIT === "string" ? GPULAYER_COMMIT : "dev",
  target: typeof GPULAYER_TARGET === "string" ? GPULAYER_TARGET : `${process.platform}-${process.arch}`,
};
