/**
 * The release binary starts with JavaScriptCore's JIT thresholds raised
 * (`--compile-jit-policy` in scripts/build-binaries.ts): a short command's
 * start-up code runs once, and compiling it would only cost CPU. A command
 * that stays up (the server, a worker) calls this first, so its hot paths are
 * compiled as usual. Without the compiled binary (bun run, bun test) it sets
 * what is already set.
 */
export function useNormalJitPolicy(): void {
  Bun.unsafe.setJITPolicy(1);
}
