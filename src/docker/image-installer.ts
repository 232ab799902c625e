import { existsSync, readFileSync } from "node:fs";
import { resolve } from "node:path";
import type { HomeLayout } from "../config/paths.ts";
import { localIndexFolders } from "./local-index.ts";
import { PythonProblem, UsageError } from "../errors.ts";
import type { BuildPlan } from "../env/index.ts";
import { installerEnv, readMachinePipSettings } from "../env/index.ts";
import { machinePipConfig } from "../env/index.ts";
import { type InterpreterInfo, runningInterpreter } from "../env/index.ts";
import { isUrl, type PipSettings, translateForUv } from "../env/index.ts";
import { redactUrl } from "../env/index.ts";
import { findUv, pinnedUvPath, UV_VERSION } from "../env/index.ts";

/**
 * What an image build gets of the host, as a host build would: the same uv
 * (uv on PATH with its pyenv shim resolved, else the pinned uv, fetched into
 * the tools folder by the host's Python from the configured index), and the
 * same installer settings (the machine's pip configuration as pip itself
 * reads it, the proxy variables, the certificate files), turned into
 * variables, arguments and read-only mounts for the build container.
 */

/** The host side of an image build: what a host build of the same request would be given. */
export interface HostSide {
  layout: HomeLayout;
  /** The host's Python (the default one): it fetches the pinned uv and reads the machine's pip configuration. */
  python: string | undefined;
  plan: Omit<BuildPlan, "interpreter" | "dir" | "toolsDir">;
}

/** Where the certificate files are inside a build container: the host's paths may be anything, or the image's own. */
const TLS_MOUNT = "/opt/gpulayer/tls";

/** Proxy variables the host's installers inherit; passed on as they are. */
const PROXY_VARIABLES = ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy"];
/** Certificate variables of the host's environment (read by uv, OpenSSL, requests): their files go in read-only. */
const CERT_VARIABLES: [string, string][] = [
  ["SSL_CERT_FILE", `${TLS_MOUNT}/ssl-cert-file.pem`],
  ["SSL_CERT_DIR", `${TLS_MOUNT}/ssl-cert-dir`],
  ["REQUESTS_CA_BUNDLE", `${TLS_MOUNT}/requests-ca-bundle.pem`],
];

/** What findUv says when it looked on PATH and would not fetch. */
const NOT_ON_PATH_REASON = "uv is not on PATH";

const isElf = (path: string): boolean => {
  try {
    return readFileSync(path).subarray(0, 4).equals(Buffer.from([0x7f, 0x45, 0x4c, 0x46]));
  } catch {
    return false;
  }
};

/** The host's Python as probed (cached per path), or why there is none. */
function hostInterpreter(host: HostSide): InterpreterInfo | string {
  try {
    return runningInterpreter(host.python, host.plan.env, host.plan.cwd, host.layout.interpreters).info;
  } catch (error) {
    if (error instanceof PythonProblem) return error.problem;
    throw error;
  }
}

/**
 * The uv to mount into the build container: the one a host build would use (findUv), when it is a binary (a
 * script cannot run in the container), else the pinned one; `standIn` is the interpreter the lookup is given
 * when the host has no Python (then nothing is fetched).
 */
export type ImageUv = { path: string; said: string; reason?: undefined } | { path: null; reason: string };

export async function uvForImage(host: HostSide, standIn: InterpreterInfo): Promise<ImageUv> {
  const info = hostInterpreter(host);
  const noPython = typeof info === "string";
  const plan: BuildPlan = {
    ...host.plan,
    dir: "",
    toolsDir: host.layout.tools,
    interpreter: noPython ? standIn : info,
    // No Python here to run pip with: no download (findUv fetches only for a build that would run uv).
    ...(noPython ? { installer: "pip", venvCreator: "venv" } : { installer: "auto", venvCreator: "auto" }),
  };
  const found = await findUv(plan, installerEnv(plan));
  const pinned = pinnedUvPath(host.layout.tools);
  const said = (path: string) => (path === pinned ? `the pinned uv ${UV_VERSION} (${path})` : `uv ${path}`);
  if (found.path === null) return { path: null, reason: noPython && found.reason === NOT_ON_PATH_REASON ? `${found.reason}, and there is no Python here to fetch the pinned uv with (${info})` : found.reason };
  if (isElf(found.path)) return { path: found.path, said: said(found.path) };
  // A script (a wrapper in front of uv) cannot run in the container: the pinned binary can, when it is there.
  if ((host.plan.uv ?? "auto") === "auto" && isElf(pinned)) return { path: pinned, said: said(pinned) };
  return { path: null, reason: `${found.path} is a script, not a uv binary that can be mounted into a container` };
}

/** What the build container is given of the host's installer settings. */
export interface ContainerInstaller {
  /** Variables for the container, uv's and pip's both (each reads only its own, and the certificate ones). */
  env: Record<string, string>;
  /** Arguments for `uv pip install` (what uv takes only as an argument). */
  uvArgs: string[];
  /** `--volume` values: each file or folder read-only. */
  mounts: string[];
  /** What was passed, for the build's steps; credentials hidden. */
  said: string[];
}

const list = (v: unknown): string[] => (Array.isArray(v) ? v.map(String) : typeof v === "string" ? v.split(/\s+/).filter(Boolean) : []);

/**
 * The host's installer settings for the build container: always the proxy
 * and certificate variables (a host build inherits them, isolated or not);
 * unless the request is isolated (it names its own index), the machine's pip
 * configuration too, read by pip as a host build reads it.
 */
export async function hostInstallerSettings(host: HostSide): Promise<ContainerInstaller> {
  const out: ContainerInstaller = { env: {}, uvArgs: [], mounts: [], said: [] };
  const env = host.plan.env;
  const mount = (path: string, at: string, what: string): string => {
    if (!existsSync(path)) throw new UsageError(`${what} names ${path}, which is not there: the build inside the image cannot be given it`);
    out.mounts.push(`${path}:${at}:ro`);
    return at;
  };
  const proxies = PROXY_VARIABLES.filter((v) => env[v]);
  for (const v of proxies) out.env[v] = env[v]!;
  if (proxies.length) out.said.push(`proxy ${[...new Set(proxies.map((v) => redactUrl(env[v]!)))].join(", ")}`);
  for (const [name, at] of CERT_VARIABLES) {
    const value = env[name];
    if (!value) continue;
    out.env[name] = mount(resolve(host.plan.cwd, value), at, name);
    out.said.push(`${name} ${value} (read-only)`);
  }
  if (host.plan.isolated) return out;
  const sources = machinePipConfig(env);
  if (!sources.length) return out;
  const settings = await readMachineSettings(host, sources);
  const from = `the host's pip configuration (${sources.join(", ")})`;
  const uv = translateForUv(settings);
  Object.assign(out.env, uv.env);
  out.uvArgs.push(...uv.args);
  const value = (dest: string) => settings.options[dest]?.value;
  const passed: string[] = [];
  // An index or find-links location on this machine's disk: the same path inside the container, read-only; for an
  // index, with the files its pages link to beside it (localIndexReach).
  const local = (where: string, what: string) => {
    if (!isUrl(where) || /^file:/i.test(where)) {
      const path = resolve(host.plan.cwd, where.replace(/^file:\/\//i, ""));
      for (const folder of what === "find-links" || !existsSync(path) ? [path] : localIndexFolders(path)) mount(folder, folder, `the machine's pip configuration (${what})`);
    }
    return redactUrl(where);
  };
  const index = value("index_url");
  if (typeof index === "string" && index) {
    out.env.PIP_INDEX_URL = index;
    passed.push(`index ${local(index, "index-url")}`);
  }
  const extra = list(value("extra_index_urls"));
  if (extra.length) {
    out.env.PIP_EXTRA_INDEX_URL = extra.join(" ");
    passed.push(`extra index ${extra.map((u) => local(u, "extra-index-url")).join(" ")}`);
  }
  const links = list(value("find_links"));
  if (links.length) {
    out.env.PIP_FIND_LINKS = links.join(" ");
    passed.push(`find-links ${links.map((l) => local(l, "find-links")).join(" ")}${links.some((l) => !isUrl(l)) ? " (read-only)" : ""}`);
  }
  if (value("no_index")) {
    out.env.PIP_NO_INDEX = "1";
    passed.push("no-index");
  }
  for (const [dest, variable, word] of [["constraints", "PIP_CONSTRAINT", "constraint"], ["requirements", "PIP_REQUIREMENT", "requirement"]] as const) {
    const files = list(value(dest));
    if (!files.length) continue;
    for (const f of files) mount(resolve(host.plan.cwd, f), resolve(host.plan.cwd, f), `the machine's pip configuration (${word})`);
    out.env[variable] = files.join(" ");
    passed.push(`${word} ${files.join(" ")} (read-only)`);
  }
  for (const [dest, uvVariable, pipVariable, file] of [["cert", "SSL_CERT_FILE", "PIP_CERT", "pip-cert.pem"], ["client_cert", "SSL_CLIENT_CERT", "PIP_CLIENT_CERT", "pip-client-cert.pem"]] as const) {
    const path = value(dest);
    if (typeof path !== "string" || !path) continue;
    const at = mount(resolve(host.plan.cwd, path), `${TLS_MOUNT}/${file}`, `the machine's pip configuration (${dest.replace("_", "-")})`);
    out.env[uvVariable] = at;
    out.env[pipVariable] = at;
    passed.push(`${dest.replace("_", "-")} ${path} (read-only)`);
  }
  const hosts = list(value("trusted_hosts"));
  if (hosts.length) {
    out.env.PIP_TRUSTED_HOST = hosts.join(" ");
    passed.push(`trusted-host ${hosts.join(" ")}`);
  }
  const proxy = value("proxy");
  if (typeof proxy === "string" && proxy) {
    out.env.PIP_PROXY = proxy;
    passed.push(`proxy ${redactUrl(proxy)}`);
  }
  if (value("timeout") !== undefined) out.env.PIP_TIMEOUT = String(value("timeout"));
  if (value("retries") !== undefined) out.env.PIP_RETRIES = String(value("retries"));
  if (value("pre")) out.env.PIP_PRE = "1";
  if (value("require_hashes")) out.env.PIP_REQUIRE_HASHES = "1";
  const fc = value("format_control") as { no_binary?: string[]; only_binary?: string[] } | undefined;
  if (fc?.no_binary?.length) out.env.PIP_NO_BINARY = fc.no_binary.join(",");
  if (fc?.only_binary?.length) out.env.PIP_ONLY_BINARY = fc.only_binary.join(",");
  const rest = ["timeout", "retries", "pre", "require_hashes", "format_control"].filter((d) => value(d) !== undefined && value(d) !== false).map((d) => settings.options[d]!.flag);
  if (rest.length) passed.push(rest.join(" "));
  if (uv.untranslatable.length) passed.push(`not passed (uv cannot take ${uv.untranslatable.length > 1 ? "them" : "it"} the same way): ${uv.untranslatable.join(", ")}`);
  out.said.push(`${from}: ${passed.join(", ") || "nothing that changes an install"}`);
  return out;
}

/** The machine's pip configuration as pip reads it, asked of the host's Python (build.ts readMachinePipSettings): refused when it installs outside the env. */
async function readMachineSettings(host: HostSide, sources: string[]): Promise<PipSettings> {
  const info = hostInterpreter(host);
  const cannot = (why: string) => new UsageError(`the machine's pip configuration applies (${sources.join(", ")}) and ${why} to read it for the build inside the image; give --index-url (which shuts it out), or PIP_CONFIG_FILE=/dev/null`);
  if (typeof info === "string") throw cannot(`there is no Python here (${info})`);
  const plan: BuildPlan = { ...host.plan, dir: "", toolsDir: host.layout.tools, interpreter: info };
  const read = await readMachinePipSettings(plan, installerEnv(plan), sources);
  if ("noPip" in read) throw cannot(`${info.path} has no pip`);
  if ("failed" in read) throw cannot(`pip could not be asked (${read.failed})`);
  if (read.outside) throw new UsageError(read.outside);
  return read.settings;
}
