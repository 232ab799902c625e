/**
 * Make this process non-dumpable (prctl PR_SET_DUMPABLE 0), as ssh-agent
 * does: the kernel then lets no process without CAP_SYS_PTRACE read its
 * /proc/<pid>/environ or memory, or attach to it, even one of the same user.
 * A worker does this first: a job it runs (same user) cannot read the token
 * the worker was given in its environment. (Its command line stays readable
 * by everyone: that is why `join` takes no token there.) A child starts
 * dumpable again at exec. Returns whether it took.
 */
export function forbidDumps(): boolean {
  if (process.platform !== "linux") return false;
  try {
    const { dlopen, FFIType } = require("bun:ffi") as typeof import("bun:ffi");
    const libc = dlopen("libc.so.6", { prctl: { args: [FFIType.i32, FFIType.u64, FFIType.u64, FFIType.u64, FFIType.u64], returns: FFIType.i32 } });
    const PR_SET_DUMPABLE = 4;
    const ok = libc.symbols.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) === 0;
    libc.close();
    return ok;
  } catch {
    return false;
  }
}
