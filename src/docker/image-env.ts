import { chmodSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import type { HomeLayout } from "../config/paths.ts";
import { contentHash } from "../core/hashing.ts";
import type { Lease } from "../core/lease.ts";
import { ExitCode, InstallError, UsageError, UserError } from "../errors.ts";
import { acquireEntry } from "../env/index.ts";
import { inputsReport } from "../env/index.ts";
import { type InterpreterInfo, installedSet } from "../env/index.ts";
import { envKey, keyDocument, requestSummary, type ResolvedRequest } from "../env/index.ts";
import { scanRequest } from "../env/index.ts";
import { lockedProjectInputs, projectSummary } from "../env/index.ts";
import { exportForImage, type ImageLock, LOCK_MOUNT, type Shadowed } from "./image-lock.ts";
import type { EnvironmentRequest } from "../env/index.ts";
import { diskUsage, entryPaths, isReady, markReady, readMeta, removeEntryDir, touchLastUsed } from "../env/index.ts";
import { installFailure, runTool, ToolStopped } from "../env/index.ts";
import { pipConfigDigest } from "../env/index.ts";
import { prepareLimit } from "../env/index.ts";
import { type ContainerInstaller, hostInstallerSettings, uvForImage } from "./image-installer.ts";
import { type Engine, type EngineEnv, engineExec } from "./engine.ts";
import { normalizeName } from "../env/index.ts";
import { type ImagePython, imagePython } from "./image-python.ts";

/**
 * Requirements on top of a container image: an env built by and for the
 * image's own Python, inside a container from the image, linked to the
 * image's packages (a venv with its system site packages), so what the
 * image has is never installed again. Keyed by the image id (its content,
 * never its tag), the image's Python and installed set, and the
 * requirements as for any env (what the installer reads). It lives in the
 * env cache like any env (same ready marker, lock, lease, gc), and is
 * mounted at one fixed path, at build and at run time alike, so its scripts
 * and links stay right; read-only into jobs.
 */

/** Where an image env is, inside every container that uses it. */
export const IMAGE_ENV_MOUNT = "/opt/gpulayer/env";

/** An image env's stage of the request (EnvironmentRequest, env/request/request-schema.ts): its requirements, and the machine's settings for the build. */
export interface ImageEnvRequest extends Pick<EnvironmentRequest, "requirementsFile" | "specs" | "indexUrl" | "extraIndexUrls" | "findLinks" | "confineTo" | "project" | "groups" | "extras"> {
  /** Where relative paths start; mounted (read-only) into the build, at the same path. */
  cwd: string;
  env: NodeJS.ProcessEnv;
  network: string;
  /** The uv setting, as for a host build: auto (uv on PATH, its pyenv shim resolved, else the pinned one, fetched once), a path, off. */
  uv?: string;
  /** The host's Python (the default one): it fetches the pinned uv and reads the machine's pip configuration, as for a host build. */
  python?: string;
}

export interface ImageEnvResult {
  key: string;
  path: string;
  /** Where it is inside the job's container (IMAGE_ENV_MOUNT). */
  mount: string;
  status: "built" | "reused";
  seconds: number;
  python: ImagePython;
  lease?: Lease;
  /** A uv project's env: the image's packages the lock brings its own version of. */
  shadowed?: Shadowed[];
}

export interface ImageEnvHooks {
  onStep?(step: string, detail: string): void;
  onLine?(line: string): void;
}

/** The image's Python, in the shape the key document takes an interpreter. */
function asInterpreter(py: ImagePython): InterpreterInfo {
  return { path: py.executable, executable: py.executable, realExecutable: py.executable, prefix: "", basePrefix: "", version: py.version, pyVersion: py.pyVersion, implementation: py.implementation, platform: py.platform, soabi: py.soabi, siteDirs: py.siteDirs, hasVenvModule: true, ensurepipWheel: null };
}

function resolveImageRequest(layout: HomeLayout, imageId: string, py: ImagePython, req: ImageEnvRequest): ResolvedRequest {
  if (req.findLinks.some((f) => !/^https?:\/\//i.test(f))) throw new UsageError("a local --find-links folder does not go with an image yet: give an index (--index-url) the container can reach");
  const ctx = { env: req.env, cwd: req.cwd, digestCache: layout.digests, confine: req.confineTo };
  // A uv project: its lock is the request (the key's part as on the host); the image's Python installs its export.
  const project = req.project === undefined ? undefined : { dir: req.project, groups: req.groups ?? [], extras: req.extras ?? [] };
  if (project && (req.requirementsFile !== undefined || req.specs.length)) throw new UsageError(`--project ${project.dir}: the lock is the whole environment; give no requirements with it`);
  const locked = project ? lockedProjectInputs(project, ctx) : null;
  const inputs = locked?.inputs ?? scanRequest({ requirementsFile: req.requirementsFile, specs: req.specs }, ctx);
  if (project && inputs.locals.length) throw new UsageError(`a uv project whose lock installs local packages (${inputs.locals.map((l) => l.path).join(", ")}) does not go with an image yet: set [tool.uv] package = false for the project itself, publish the others to an index, or build the image with them`);
  if (inputs.locals.length) throw new UsageError("local projects do not go with an image yet: publish them to an index, or build the image with them");
  const flags = { indexUrl: req.indexUrl, extraIndexUrls: req.extraIndexUrls, findLinks: req.findLinks.map((url) => ({ url })) };
  // Isolated as a host build is: an index named by a flag or a file shuts the machine's pip configuration out.
  const isolated = Boolean(project || req.indexUrl || req.extraIndexUrls.length || req.findLinks.length || ["--index-url", "--extra-index-url", "--find-links", "--no-index"].some((o) => inputs.optionsSeen.has(o)));
  // Otherwise the build gets the host's configuration (image-installer.ts), so the key covers it as a host key does;
  // none at all keeps the key it had. The image's own pip configuration is part of the image, so of its id.
  const machine = isolated ? null : pipConfigDigest(req.env, { cwd: req.cwd, digestCache: layout.digests });
  const interpreter = asInterpreter(py);
  const doc = { ...keyDocument({ inputs, flags, interpreter, base: contentHash(py.distributions.join("\n")), installerConfig: machine?.sources.length ? machine.digest : null, ...(locked ? { project: locked.key } : {}) }), image: imageId };
  const summary = project ? projectSummary(project) : requestSummary(inputs);
  return { key: envKey(doc), doc, summary, inputs, flags, interpreter, interpreterVia: "image", isolated, conda: null, ...(project ? { project } : {}), machineConfig: machine?.sources ?? null, machineFindLinks: machine?.findLinks ?? [] };
}

/** Where the host's uv and its cache are, inside a build container. */
const UV_MOUNT = "/opt/gpulayer/uv";
const UV_CACHE_MOUNT = "/opt/gpulayer/uv-cache";
const MARK = "gpulayer-image-standin";

/**
 * The image's packages shown to uv as installed: a stand-in dist-info (their
 * METADATA, a RECORD naming only the stand-in) for each distribution the
 * image's Python sees, in the env's own site-packages, where uv looks; uv
 * then keeps what the image has, as pip does through the system site. The
 * stand-ins uv did not replace are removed after (by their INSTALLER mark).
 * The packages a lock pins at another version (argv[2], normalised names) get
 * none: uv installs the locked one, as on the host.
 */
const STANDINS = `
import importlib.metadata as md, os, re, sys, sysconfig
site = sys.argv[1]
shadowed = set(sys.argv[2].split(",")) if len(sys.argv) > 2 else set()
for d in md.distributions():
    name = d.metadata["Name"]
    text = d.read_text("METADATA") or d.read_text("PKG-INFO")
    if not name or text is None or re.sub(r"[-_.]+", "-", name).lower() in shadowed:
        continue
    folder = os.path.join(site, "%s-%s.dist-info" % (re.sub(r"[-_.]+", "_", name).lower(), d.version))
    if os.path.exists(folder):
        continue
    os.makedirs(folder)
    files = {"METADATA": text, "WHEEL": "Wheel-Version: 1.0\\nGenerator: gpulayer (stand-in of an image package)\\nRoot-Is-Purelib: true\\n", "INSTALLER": "${MARK}\\n"}
    for f, body in files.items():
        open(os.path.join(folder, f), "w").write(body)
    base = os.path.basename(folder)
    open(os.path.join(folder, "RECORD"), "w").write("".join("%s/%s,,\\n" % (base, f) for f in list(files) + ["RECORD"]))
`;
const CLEANUP = `
import os, shutil, sys
site = sys.argv[1]
for n in os.listdir(site):
    p = os.path.join(site, n, "INSTALLER")
    if n.endswith(".dist-info") and os.path.isfile(p) and open(p).read().strip() == "${MARK}":
        shutil.rmtree(os.path.join(site, n))
`;

/** The shell (its -c, script and arguments) that builds the env inside the container: uv when it runs there, else the image's pip. */
function buildScript(py: ImagePython, req: ImageEnvRequest, withUv: boolean, host: ContainerInstaller, lock: ImageLock | null): string[] {
  const q = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;
  // A lock's packages come from its own indexes, exactly the pinned files (their hashes), nothing resolved again.
  const lockIndex = (lock?.registries ?? []).flatMap((r, i) => [i ? "--extra-index-url" : "--index-url", r.startsWith("/") ? `file://${r}` : r]);
  const index = lock ? lockIndex : [...(req.indexUrl ? ["--index-url", req.indexUrl] : []), ...req.extraIndexUrls.flatMap((u) => ["--extra-index-url", u]), ...req.findLinks.flatMap((u) => ["--find-links", u])];
  const what = lock ? ["--no-deps", "--require-hashes", "-r", `${LOCK_MOUNT}/requirements.txt`] : [...(req.requirementsFile ? ["-r", resolve(req.cwd, req.requirementsFile)] : []), ...req.specs];
  // pip keeps an image package the lock pins at another version when `==` holds (a local label): then it installs the lock's whole, as uv would.
  const pipWhat = lock?.shadowed.length ? ["--ignore-installed", ...what] : what;
  const shadowedNames = lock?.shadowed.length ? ` ${q(lock.shadowed.map((x) => x.name).join(","))}` : "";
  const site = `${IMAGE_ENV_MOUNT}/lib/python${py.pyVersion}/site-packages`;
  // The host's settings reach pip as its PIP_* variables (the env file), and uv as its own variables and, first, these arguments.
  const pip = [`${IMAGE_ENV_MOUNT}/bin/python`, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--no-warn-script-location", ...index, ...pipWhat].map(q).join(" ");
  const uv = [UV_MOUNT, "pip", "install", "--python", `${IMAGE_ENV_MOUNT}/bin/python`, "--compile-bytecode", ...host.uvArgs, ...index, ...what].map(q).join(" ");
  const viaPip = `echo "gpulayer-installer: pip"; ${pip}`;
  // Every index counts, as in pip (uv's default takes the first index that has a name): as on the host.
  const viaUv = `echo "gpulayer-installer: uv"; ${q(py.executable)} -c "$1" ${q(site)}${shadowedNames}; UV_CACHE_DIR=${UV_CACHE_MOUNT} UV_LINK_MODE=copy UV_INDEX_STRATEGY=unsafe-best-match ${uv}; ${q(py.executable)} -c "$2" ${q(site)}`;
  // A uv that does not run in this image (another libc or architecture): the image's pip, or, with none, uv's own words.
  const noUv = py.hasPip ? viaPip : `echo "the uv mounted in does not run in this image, whose Python has no pip: $(${UV_MOUNT} --version 2>&1 | tail -n 1)"; exit 1`;
  const install = withUv ? `if ${UV_MOUNT} --version >/dev/null 2>&1; then ${viaUv}; else ${noUv}; fi` : viaPip;
  return ["-c", `set -e; ${q(py.executable)} -m venv --system-site-packages --without-pip ${IMAGE_ENV_MOUNT}; ${install}`, "gpulayer-build", STANDINS, CLEANUP];
}

export async function ensureImageEnv(
  layout: HomeLayout,
  image: { ref: string; imageId: string; engine: Engine },
  req: ImageEnvRequest,
  opts: { engineEnv: EngineEnv; hooks?: ImageEnvHooks; leaseHolder?: string; signal?: AbortSignal; timeoutMs?: number },
): Promise<ImageEnvResult> {
  const started = performance.now();
  // prepare_timeout and a cancel, as for a host build: one signal, and the same line for each (env/prepare-limit.ts).
  const limit = prepareLimit(opts.timeoutMs, opts.signal);
  const signal = limit.signal;
  let step = "waiting for another build of it";
  const hooks = opts.hooks ?? {};
  const py = await imagePython(layout, image.engine, image.imageId, image.ref, opts.engineEnv);
  const resolved = resolveImageRequest(layout, image.imageId, py, req);
  const paths = entryPaths(layout, resolved.key);
  const done = (status: "built" | "reused", shadowed: Shadowed[] | undefined) => ({ key: resolved.key, path: paths.dir, mount: IMAGE_ENV_MOUNT, status, seconds: (performance.now() - started) / 1000, python: py, ...(resolved.project ? { shadowed: shadowed ?? [] } : {}) });
  const { entry, lease } = await acquireEntry({
    lease: opts.leaseHolder ? { layout, kind: "env", id: resolved.key, holder: opts.leaseHolder } : undefined,
    lock: paths.lock,
    reuse: () => {
      if (!isReady(paths)) return null;
      touchLastUsed(paths);
      return done("reused", resolved.project ? readMeta(paths)?.shadowed : undefined);
    },
    build: async () => {
      step = `building the env inside ${image.ref}`;
      try {
        // What a host build of this request would be given: its uv, its installer settings (image-installer.ts).
        const host = { layout, python: req.python, plan: { inputs: resolved.inputs, flags: resolved.flags, isolated: resolved.isolated, env: req.env, cwd: req.cwd, uv: req.uv, signal } };
        const found = await uvForImage(host, resolved.interpreter);
        const uv = found.path;
        if (!py.hasPip && !uv) throw new InstallError(`image ${image.ref}: its Python (${py.executable}) has no pip to install the requirements with, and there is no uv to mount in: ${found.reason}`, "");
        const settings = await hostInstallerSettings(host);
        const project = resolved.project;
        if (project && !uv) throw new UsageError(`a uv project (--project ${project.dir}) on an image has its lock read by uv here, and there is none: ${found.reason}`);
        // A project's lock, exported here by uv before anything is said of a build (a stale one is refused in uv's words, alone):
        // mounted read-only, with the folders its file:// indexes are.
        let lock: ImageLock | null = null;
        if (project && uv) {
          hooks.onStep?.("reading", `the lock of ${project.dir}: uv export --locked (exact pins, with their hashes)`);
          lock = await exportForImage(project, py, join(paths.tmp, "lock"), { uv, env: req.env, cwd: req.cwd, onLine: hooks.onLine, signal });
        }
        hooks.onStep?.("building", `the env inside ${image.ref} with its Python ${py.version}`);
        hooks.onStep?.("building", found.path ? `with ${found.said}, mounted in read-only${py.hasPip ? " (the image's pip where it does not run there)" : ""}` : `with the image's pip (no uv to mount in: ${found.reason})`);
        for (const said of settings.said) hooks.onStep?.("building", `with ${said}`);
        const buildStart = performance.now();
        // One name per key: holding the lock, a container of that name is a dead builder's, still writing here; it goes first.
        const name = `gpulayer-envbuild-${resolved.key.slice(0, 16)}`;
        await engineExec(image.engine, ["rm", "-f", name], { env: opts.engineEnv, timeoutMs: 60_000 });
        removeEntryDir(layout, paths.dir);
        mkdirSync(paths.dir, { recursive: true });
        const uvCache = uv ? (req.env.UV_CACHE_DIR ?? join(layout.tools, "uv-cache")) : null;
        if (uvCache) mkdirSync(uvCache, { recursive: true });
        // The settings' files and folders, read-only, each once; what is mounted already (the request's folder) is not again.
        const own = new Set([IMAGE_ENV_MOUNT, req.cwd, UV_MOUNT, UV_CACHE_MOUNT]);
        const extra = [...new Map(settings.mounts.map((m) => [m.split(":")[1]!, m])).entries()].filter(([at]) => !own.has(at)).flatMap(([, m]) => ["--volume", m]);
        const mounts = ["--volume", `${paths.dir}:${IMAGE_ENV_MOUNT}`, "--volume", `${req.cwd}:${req.cwd}:ro`, ...(uv ? ["--volume", `${uv}:${UV_MOUNT}:ro`, "--volume", `${uvCache}:${UV_CACHE_MOUNT}`] : []), ...extra, ...(lock?.mounts.flatMap((m) => ["--volume", m]) ?? [])];
        // The settings' values by a file of the owner's alone, not in argv: an index URL may hold credentials.
        const envFile = join(paths.tmp, "build.env");
        const variables = Object.entries(settings.env);
        if (variables.length) {
          mkdirSync(paths.tmp, { recursive: true, mode: 0o700 });
          writeFileSync(envFile, variables.map(([k, v]) => `${k}=${v.replace(/[\r\n]/g, "")}\n`).join(""), { mode: 0o600 });
          chmodSync(envFile, 0o600);
        }
        const args = ["run", "--rm", "--name", name, "--pull", "never", "--label", "gpulayer.managed=true", "--network", req.network, ...mounts, ...(variables.length ? ["--env-file", envFile] : []), "--workdir", req.cwd, "--entrypoint", "/bin/sh", image.imageId, ...buildScript(py, req, Boolean(uv), settings, lock)];
        // Stopped (a cancel, a time limit): the engine's CLI is killed, and the container with it, by its name.
        const stop = () => void engineExec(image.engine, ["rm", "-f", name], { env: opts.engineEnv, timeoutMs: 60_000 });
        signal?.addEventListener("abort", stop, { once: true });
        let ran: { code: number; lines: string[] };
        try {
          const cliEnv = Object.fromEntries(Object.entries(opts.engineEnv).filter((e): e is [string, string] => e[1] !== undefined));
          ran = await runTool([image.engine.bin, ...args], { env: cliEnv, cwd: req.cwd, hooks: { onOutput: hooks.onLine }, signal });
        } catch (error) {
          if (error instanceof ToolStopped) throw limit.stopped(step) ?? new UserError(`stopped while ${step} (nothing was kept)`, ExitCode.cancelled);
          throw error;
        } finally {
          signal?.removeEventListener("abort", stop);
          rmSync(paths.tmp, { recursive: true, force: true });
        }
        const installerUsed = ran.lines.includes("gpulayer-installer: uv") ? "uv" : "pip";
        if (ran.code !== 0) throw installFailure(`installing the requirements in image ${image.ref} with its ${installerUsed} failed`, ran.lines);
        const installed = installedSet([join(paths.dir, "lib", `python${py.pyVersion}`, "site-packages")]);
        // The image's packages the lock brought its own version of (as a host env reports the worker's).
        const shadowed = lock?.shadowed.filter((x) => installed.some((i) => normalizeName(i.split("==")[0]!) === x.name));
        markReady(paths, {
          key: resolved.key,
          path: paths.dir,
          python: `${IMAGE_ENV_MOUNT}/bin/python`,
          created: new Date().toISOString(),
          buildSeconds: (performance.now() - buildStart) / 1000,
          sizeBytes: diskUsage(paths.dir),
          venvCreator: "venv",
          installer: installerUsed,
          installerPath: `${installerUsed === "uv" ? "uv" : "pip"} (inside the image)`,
          installerFallback: null,
          summary: `${resolved.summary} on ${image.ref}`,
          request: resolved.doc,
          inputs: inputsReport(resolved),
          // What the request put in the env's own site (the stand-ins are gone by now): the image's packages are the image's.
          installed,
          ...(shadowed ? { shadowed } : {}),
          check: [],
        });
        return done("built", shadowed);
      } catch (error) {
        // A failure is never reused: nothing of it stays in the cache (an exported lock's folder neither).
        removeEntryDir(layout, paths.dir);
        rmSync(paths.tmp, { recursive: true, force: true });
        throw error;
      }
    },
    signal,
  }).catch((error) => {
    throw limit.stopped(step) ?? error;
  });
  return { ...entry, lease };
}
