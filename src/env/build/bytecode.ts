import { type Dirent, readdirSync, statSync } from "node:fs";
import { availableParallelism } from "node:os";
import { join } from "node:path";
import { bootId } from "../../core/process-identity.ts";
import { nearlyFull, NoSpaceLeft, saysNoSpace } from "./disk-full.ts";
import { type BuildHooks, type KeepGroup, installFailure, runTool } from "./run-tool.ts";
import type { BuildUser } from "./build-user.ts";

/**
 * The env's own modules compiled to bytecode at build, while the env is still
 * ours alone: no job pays the compile (PYTHONDONTWRITEBYTECODE or not), and no
 * job ever writes into a shared env.
 *
 * The env's interpreter writes each .pyc with CPython's own import machinery
 * (the functions py_compile calls, already loaded in every interpreter), so
 * the files are byte for byte what `python -m compileall` writes; it skips
 * importing compileall and site (-I -S), which costs more than compiling a
 * small package. One worker per CPU, each given an even share by size.
 *
 * A module is compiled once per home: each env's pyc is linked (not copied:
 * a new file costs twenty links here) into the home's bytecode store, by its
 * source's SHA-256 and the optimization level, one bucket per interpreter (a
 * digest of its cache tag, magic number and whole `sys.version`, which
 * `interpreter` names for people). The next env holding the same file
 * (another lock of the same stack, another request sharing its packages)
 * takes that code: where its header is the one this env's source calls for
 * (the same file of uv's cache: the same mtime and size; or a checked hash),
 * the pyc itself is linked in; otherwise the code is written under this
 * env's own header, which is what a compile would write (the same header, an
 * equal code object). Its co_filename names the env that compiled it;
 * CPython's import sets it to the module's own path on load
 * (`_imp._fix_co_filename`), as for any pyc moved with its source. Each
 * entry carries its SHA-256 on its inode (an extended attribute), checked in
 * full on its first read in a boot: a torn or changed entry is compiled
 * again, never loaded. What a read learned stays on the file's own inode for
 * the rest of the boot, as a memo naming the boot and the file's mtime (ns)
 * and size: a source's digest (uv links one file of its cache into every
 * env, so it is hashed once a boot, not once per env) and an entry's full
 * check. A write moves the mtime and a reboot the boot (a crash may tear
 * what had not reached the disk); either sends the next read back to the
 * bytes. A source's memo only ever links in an entry whose header matches
 * the source: CPython's own timestamp check, to the nanosecond, within one
 * boot. Wherever bytes are read (a compile, kept code under another header,
 * checked hashes), their own digest is the key, so a memo that outlived its
 * bytes (mmap, a time put back) never files code under a wrong digest. A
 * lock of the transformers stack changed on a worker that built it so reads
 * no file but the new package's (docs/benchmarks.md). The
 * store is best effort (a failed read, link or attribute compiles, as
 * without it), the worker's own: a build as another user (worker.run_as)
 * neither reads nor writes it, since that user's process could write any code
 * under any key.
 */

/** Run under `python -I -S -c`; paths come NUL-separated on stdin. Python 3.6 lacks the 3.7 functions: py_compile then. */
const COMPILER = `
import os, sys
try:
    from _frozen_importlib_external import _calc_mode, _code_to_hash_pyc, _code_to_timestamp_pyc, _RAW_MAGIC_NUMBER, _write_atomic, cache_from_source, MAGIC_NUMBER
    from _imp import source_hash
    fast = True
except ImportError:
    import py_compile
    fast = False
checked = bool(os.environ.get("SOURCE_DATE_EPOCH"))  # py_compile's default: checked hashes for reproducible builds
# The store needs links and extended attributes (the digest on each entry's inode): Linux; elsewhere, none.
store = sys.argv[1] if fast and len(sys.argv) > 1 and sys.argv[1] and hasattr(os, "setxattr") else None
if store:
    import hashlib, stat, time
    named = "%s %s (magic %s)" % (sys.implementation.cache_tag, sys.version.split()[0], MAGIC_NUMBER.hex())
    store = os.path.join(store, hashlib.sha256((named + "\\n" + sys.version).encode()).hexdigest()[:16])
    try:
        os.makedirs(store, mode=0o700, exist_ok=True)
        if not os.path.exists(os.path.join(store, "interpreter")):
            with open(os.path.join(store, "interpreter"), "w") as f:
                f.write(named + "\\n")
        used = os.path.join(store, "last-used")
        # gc's last use of the bucket, touched at most hourly (a write per build would cost more than it tells).
        try:
            if time.time() - os.stat(used).st_mtime > 3600:
                os.utime(used)
        except FileNotFoundError:
            open(used, "ab").close()
    except OSError:
        store = None

XATTR = "user.gpulayer.sha256"
# Memos of what was read this boot (see the comment above): a source's digest (SOURCE_MEMO) and, after an entry's
# digest, its check. Each begins with the boot's tag and the file's mtime (ns) and size when it was read; sized to
# stay inside an ext4 inode (256 bytes), so they cost no block of their own.
SOURCE_MEMO = "user.gpulayer.m"
try:
    BOOT = bytes.fromhex(sys.argv[2].replace("-", ""))[:8] if store and len(sys.argv) > 2 else b""
except ValueError:
    BOOT = b""

def stamp(st):
    return BOOT + st.st_mtime_ns.to_bytes(8, "little", signed=True) + st.st_size.to_bytes(8, "little")

def read(path):
    with open(path, "rb") as f:
        return f.read()

def keep_memo(path, st, digest):
    # Kept only on a file linked from elsewhere (uv's cache): only such a file meets another env, and a link out of
    # the env (a module symlinked to a project's file) is not ours to mark.
    if BOOT and st.st_nlink > 1 and not os.path.islink(path):
        try:
            os.setxattr(path, SOURCE_MEMO, stamp(st) + digest)
        except OSError:
            pass

def source_digest(path, st):
    # (digest, source or None, from a memo): this boot's memo while the file's stat is unchanged, else read and hashed.
    # Checked-hash bytecode reads the source anyway (its header is the source's hash): no memo there.
    if BOOT and not checked:
        try:
            memo = os.getxattr(path, SOURCE_MEMO)
            if len(memo) == 56 and memo[:24] == stamp(st):
                return memo[24:], None, True
        except OSError:
            pass
    source = read(path)
    digest = hashlib.sha256(source).digest()
    keep_memo(path, st, digest)
    return digest, source, False

def sound(data, digest):
    # A whole pyc of this Python whose bytes are the digest on its inode: a torn or changed one is never taken.
    return len(data) > 16 and data[:4] == MAGIC_NUMBER and hashlib.sha256(data).digest() == digest

def kept_pyc(entry):
    try:
        want = os.getxattr(entry, XATTR)[:32]
        data = read(entry)
    except OSError:
        return None
    return data if sound(data, want) else None

def kept_header(entry):
    # (header, whole pyc or None) of a sound entry, else None: checked in full once a boot (the memo after its digest
    # then says so), all through one descriptor, so the file checked is the file stamped.
    try:
        # Non-blocking: whatever sits at the path (a FIFO) is looked at, never waited on; only a file is an entry.
        fd = os.open(entry, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        tag = os.getxattr(fd, XATTR)
        if BOOT and len(tag) == 56 and tag[32:] == stamp(st):
            return os.read(fd, 16), None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read()
        if not sound(data, tag[:32]):
            return None
        if BOOT:
            try:
                os.setxattr(fd, XATTR, tag[:32] + stamp(st))
            except OSError:
                pass
        return data[:16], data
    except OSError:
        return None
    finally:
        os.close(fd)

def keep_pyc(cfile, entry, pyc):
    # The env's own pyc linked into the store, not copied (a link costs a twentieth of a new file here), its digest
    # on the inode; a newer one replaces an older (its header is likelier to match the next env's sources).
    tmp = "%s.%d.tmp" % (entry, os.getpid())
    try:
        os.makedirs(os.path.dirname(entry), mode=0o700, exist_ok=True)
        os.link(cfile, tmp)
        os.setxattr(tmp, XATTR, hashlib.sha256(pyc).digest())
        os.replace(tmp, entry)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass

def link_pyc(entry, cfile, fresh):
    if fresh:
        # Nothing there yet (a folder this compile made): one link.
        try:
            os.link(entry, cfile)
            return
        except FileExistsError:
            pass
    tmp = "%s.%d.tmp" % (cfile, os.getpid())
    os.link(entry, tmp)
    try:
        os.replace(tmp, cfile)
    except OSError:
        os.unlink(tmp)
        raise

def header(source, st):
    # What _code_to_hash_pyc and _code_to_timestamp_pyc put before the code (both 16 bytes).
    if checked:
        return MAGIC_NUMBER + (3).to_bytes(4, "little") + source_hash(_RAW_MAGIC_NUMBER, source)
    return MAGIC_NUMBER + bytes(4) + (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
# -I hides PYTHONOPTIMIZE from this interpreter; jobs read it, as Python does (an integer, else 1). The env is keyed
# without it, so plain bytecode always, and that level's too.
try:
    level = int(os.environ.get("PYTHONOPTIMIZE") or 0)
    level = 1 if level < 0 else min(level, 2)
except ValueError:
    level = 1
levels = [0, level] if level else [0]
unreadable = False
compiled = taken = 0
made = set()  # __pycache__ folders made or found: one mkdir each, not one per module
fresh = set()  # those this compile made: no pyc in them to compare or replace
for raw in sys.stdin.buffer.read().split(b"\\0"):
    if not raw:
        continue
    path = os.fsdecode(raw)
    try:
        if not fast:
            for opt in levels:
                py_compile.compile(path, doraise=True, optimize=opt)
            continue
        st = os.stat(path)
        source = digest = None
        memo = False
        for opt in levels:
            cfile = cache_from_source(path, optimization=opt or "")
            folder = os.path.dirname(cfile)
            if folder not in made:
                try:
                    os.mkdir(folder)
                    fresh.add(folder)
                except FileExistsError:
                    pass
                except FileNotFoundError:
                    os.makedirs(folder, exist_ok=True)
                made.add(folder)
            new = folder in fresh
            if not checked and not new:
                # Up to date already (pip compiles as it installs): the header compileall compares.
                try:
                    with open(cfile, "rb") as f:
                        if f.read(12) == MAGIC_NUMBER + bytes(4) + (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little"):
                            continue
                except OSError:
                    pass
            linked = False
            while True:
                if store and digest is None:
                    digest, source, memo = source_digest(path, st)
                entry = os.path.join(store, digest[:1].hex(), "%s.%d" % (digest[1:].hex(), opt)) if store else None
                kept = kept_header(entry) if entry else None
                if kept is not None and kept[0] == header(source, st):
                    # The same header (the source is the same file of uv's cache, or a checked hash): the store's own
                    # pyc is this env's, linked. A memo's digest is trusted this far only: the timestamp check
                    # CPython itself makes of a pyc, to the nanosecond.
                    try:
                        link_pyc(entry, cfile, new)
                        linked = True
                        break
                    except OSError:
                        pass
                if not memo:
                    break
                # Bytes are needed now (a compile, or kept code under this env's own header): the key is their digest.
                # A memo that outlived its file's bytes (a write that left mtime and size as they were) is replaced,
                # and the lookup made again: code is never filed or taken under a digest its source does not have.
                memo = False
                if source is None:
                    source = read(path)
                real = hashlib.sha256(source).digest()
                if real == digest:
                    break
                digest = real
                keep_memo(path, st, real)
            if linked:
                taken += 1
                continue
            pyc = None
            if kept is not None:
                # Its code under this env's own header (what a compile would write).
                whole = kept[1] if kept[1] is not None else kept_pyc(entry)
                if whole is not None:
                    taken += 1
                    pyc = header(source, st) + whole[16:]
            if pyc is None:
                if source is None:
                    source = read(path)
                compiled += 1
                code = compile(source, path, "exec", dont_inherit=True, optimize=opt)
                pyc = _code_to_hash_pyc(code, source_hash(_RAW_MAGIC_NUMBER, source), True) if checked else _code_to_timestamp_pyc(code, st.st_mtime, st.st_size)
            _write_atomic(cfile, pyc, _calc_mode(path))
            if entry:
                keep_pyc(cfile, entry, bytes(pyc))
    except OSError as e:
        print("writing the bytecode of %s: %s" % (path, e), flush=True)
        sys.exit(2)
    except Exception as e:
        # A module that does not compile (a Python 2 file in a package's tests): pip and compileall go on too.
        unreadable = True
        print("not compiled: %s: %s: %s" % (path, type(e).__name__, e), flush=True)
if store and (compiled or taken):
    # For --verbose: how much of the compile the store spared.
    print("bytecode: %d module(s) compiled, %d taken from the bytecode store" % (compiled, taken), flush=True)
sys.exit(3 if unreadable else 0)
`;

/** The compiler's exit status when some module did not compile. */
const NOT_ALL_COMPILED = 3;

/** A worker for about this many files; a small package gets fewer workers than CPUs (each costs an interpreter start). */
const FILES_PER_WORKER = 8;

export interface CompileOptions {
  env: Record<string, string>;
  cwd: string;
  hooks: BuildHooks;
  signal?: AbortSignal;
  keep?: KeepGroup;
  /** worker.run_as: the compile runs as the build's user (build-user.ts), without the bytecode store. */
  as?: BuildUser;
  /** The home's bytecode store (config/paths.ts): code compiled once per source content and interpreter. */
  store?: string;
  /** The boot the store's memos are good for (core/process-identity.ts's; "" keeps none); a test gives another to be a reboot. */
  boot?: string;
}

/** Compile every module under `site`; returns how many files were given to the compiler. A full disk is NoSpaceLeft or an InstallError that says so. */
export function compileBytecode(python: string, site: string, opts: CompileOptions): Promise<number> {
  return startCompiler(python, opts, 0).compile(site);
}

/** Workers started ahead by default, at most this many: a small package wants few, and more start when the files call for them. */
const AHEAD = 4;

export interface Compiler {
  /** List the modules under `site` now and compile them; once. */
  compile(site: string): Promise<number>;
  /** No compile after all (the install failed): the waiting workers exit, and are waited for. */
  cancel(): Promise<void>;
}

/**
 * The compiler's workers started now, each waiting on its stdin for its
 * share: started while the installer runs, their interpreters' start-up is
 * off the build's path (about 8 ms each here, more on a loaded machine).
 */
export function startCompiler(python: string, opts: CompileOptions, ahead = AHEAD): Compiler {
  // A cache prefix would send the bytecode elsewhere; "don't write bytecode" is for jobs, not for the build.
  const { PYTHONDONTWRITEBYTECODE: _, PYTHONPYCACHEPREFIX: __, ...env } = opts.env;
  const cpus = availableParallelism();
  // One "still running" line for the compile, not one per worker.
  const { onQuiet: _q, ...silent } = opts.hooks;
  const worker = (i: number, input: Promise<string>) =>
    runTool([python, "-I", "-S", "-c", COMPILER, ...(opts.store && !opts.as ? [opts.store, opts.boot === undefined ? (bootId() ?? "") : opts.boot] : [])], { env, cwd: opts.cwd, hooks: i === 0 ? opts.hooks : silent, signal: opts.signal, keep: opts.keep, input, as: opts.as });
  const waiting = Array.from({ length: Math.min(cpus, ahead) }, () => Promise.withResolvers<string>());
  const started = waiting.map((w, i) => worker(i, w.promise));
  // Stopped while they wait (a time limit during the install): told by the install, not as an unhandled rejection.
  for (const run of started) run.catch(() => undefined);
  const settled = () => Promise.allSettled(started);
  return {
    async compile(site) {
      let shares: string[][];
      try {
        const files = pythonSources(site);
        shares = files.length ? evenShares(files, Math.min(cpus, Math.ceil(files.length / FILES_PER_WORKER))) : [];
      } catch (error) {
        for (const w of waiting) w.resolve("");
        await settled();
        throw error;
      }
      const input = (share: string[] | undefined) => (share ? share.join("\0") : "");
      waiting.forEach((w, i) => w.resolve(input(shares[i])));
      const more = shares.slice(waiting.length).map((share, i) => worker(waiting.length + i, Promise.resolve(input(share))));
      const results = await Promise.all([...started, ...more]);
      const lines = results.flatMap((r) => r.lines);
      // 3: some module did not compile (tolerated, as pip does); anything else is the compiler's own failure.
      if (results.some((r) => r.code !== 0 && r.code !== NOT_ALL_COMPILED) || saysNoSpace(lines)) throw installFailure("compiling the env's bytecode failed", lines);
      if (nearlyFull(site)) throw new NoSpaceLeft("ENOSPC", "compiling the env's bytecode");
      return shares.reduce((n, share) => n + share.length, 0);
    },
    async cancel() {
      for (const w of waiting) w.resolve("");
      await settled();
    },
  };
}

interface Source {
  path: string;
  size: number;
}

/** The .py files compileall would compile under `dir`: files (symlinked ones too), not into symlinked folders. */
function pythonSources(dir: string): Source[] {
  const found: Source[] = [];
  const walk = (at: string) => {
    let entries: Dirent[];
    try {
      entries = readdirSync(at, { withFileTypes: true });
    } catch {
      return; // gone or unreadable: compileall lists nothing there either
    }
    for (const e of entries) {
      const path = join(at, e.name);
      if (e.isDirectory()) walk(path);
      else if (e.name.endsWith(".py") && (e.isFile() || e.isSymbolicLink())) {
        try {
          const s = statSync(path);
          if (s.isFile()) found.push({ path, size: s.size });
        } catch {
          // a dangling link
        }
      }
    }
  };
  walk(dir);
  return found;
}

/** `count` lists of paths with about equal bytes each (largest first, each to the lightest list). */
export function evenShares(files: Source[], count: number): string[][] {
  const shares = Array.from({ length: Math.max(1, count) }, () => ({ bytes: 0, paths: [] as string[] }));
  for (const f of [...files].sort((a, b) => b.size - a.size)) {
    const lightest = shares.reduce((a, b) => (b.bytes < a.bytes ? b : a));
    lightest.bytes += f.size;
    lightest.paths.push(f.path);
  }
  return shares.filter((s) => s.paths.length).map((s) => s.paths);
}
