import { existsSync, mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { writeFileAtomic } from "../../core/atomic.ts";
import { contentHash } from "../../core/hashing.ts";
import { installerMessage, runTool } from "../build/run-tool.ts";

/**
 * The machine's pip configuration as pip itself reads it for `pip install`
 * (its config files in pip's order, PIP_CONFIG_FILE, PIP_* variables): pip's
 * own option parser is asked, in the worker's Python, which install options
 * differ from what pip takes with no configuration at all. Never our own
 * reading of pip.conf. The answer is kept by the digest of the configuration
 * and the pip that read it: a machine pays the ~0.3 s question once.
 */

/** pip's install options that its configuration set, by optparse dest, with the option's spelling. */
export interface PipSettings {
  pip: string;
  /** `origin`: the file or PIP_* variable that set it, where pip's configuration could say. */
  options: Record<string, { flag: string; value: unknown; origin?: string }>;
}

/** Where these options were set, each source once; `fallback` (every source there is) when pip could not say. */
export function originsOf(settings: PipSettings, flags: string[], fallback: string[]): string[] {
  const origins = Object.values(settings.options).filter((o) => flags.includes(o.flag)).map((o) => o.origin);
  return origins.length && origins.every(Boolean) ? [...new Set(origins as string[])] : fallback;
}

// Runs in the worker's Python with pip importable. Prints one JSON document.
const ASK_PIP = String.raw`
import json, os, sys
from pip import __version__
from pip._internal.commands import create_command
from pip._internal.models.format_control import FormatControl

def parsed():
    cmd = create_command("install", isolated=False)
    opts, _ = cmd.parse_args([])
    flags = {}
    for o in cmd.parser._get_all_options():
        if o.dest and o.dest not in flags:
            flags[o.dest] = o.get_opt_string()
    return vars(opts), flags, cmd.parser.config

def plain(v):
    if isinstance(v, FormatControl):
        return {"no_binary": sorted(v.no_binary), "only_binary": sorted(v.only_binary)}
    if isinstance(v, (set, frozenset, tuple)):
        return sorted(v) if isinstance(v, (set, frozenset)) else list(v)
    if v is None or isinstance(v, (bool, int, float, str, list, dict)):
        return v
    return repr(v)

def origins(conf):
    # Where each option was set, as pip's own Configuration loaded it: files in pip's order, then PIP_* variables;
    # a later source wins at the same rank, [install] over [global], a variable over both (pip's override order).
    # Best effort (pip's internals), so nothing on failure.
    rank = {"global": 0, "install": 1, ":env:": 2}
    found = {}
    def note(section, name, source):
        if section not in rank:
            return
        name = name.replace("_", "-")
        if rank[section] >= found.get(name, (-1, ""))[0]:
            found[name] = (rank[section], source)
    try:
        for variant, parsers in conf._parsers.items():
            for fname, parser in parsers:
                for section in parser.sections():
                    for name, _ in parser.items(section):
                        note(section, name, fname)
        for key, value in conf._config.get("env-var", {}).items():
            for k in (value.keys() if isinstance(value, dict) else [key]):
                section, _, name = k.rpartition(".")
                note(section, name, "PIP_" + name.upper().replace("-", "_"))
    except Exception:
        pass
    return {name: source for name, (_, source) in found.items()}

configured, flags, conf = parsed()
where = origins(conf)
for k in [k for k in os.environ if k.startswith("PIP_")]:
    del os.environ[k]
os.environ["PIP_CONFIG_FILE"] = os.devnull
bare, _, _ = parsed()
out = {}
for k, v in configured.items():
    if plain(v) == plain(bare.get(k)):
        continue
    flag = flags.get(k, "--" + k.replace("_", "-"))
    out[k] = {"flag": flag, "value": plain(v)}
    if flag.lstrip("-") in where:
        out[k]["origin"] = where[flag.lstrip("-")]
print(json.dumps({"pip": __version__, "options": out}))
`;

/** `pythonPath`: extra sys.path entries that make pip importable (a bundled pip), or none when the interpreter has its own. */
export async function machinePipSettings(python: string, opts: { env: Record<string, string>; pythonPath?: string; cacheDir: string; configDigest: string }): Promise<PipSettings> {
  const cacheFile = join(opts.cacheDir, `pip-config-${contentHash(`${python}\0${opts.pythonPath ?? ""}\0${opts.configDigest}`).slice(0, 32)}.json`);
  if (existsSync(cacheFile)) {
    try {
      return JSON.parse(readFileSync(cacheFile, "utf8")) as PipSettings;
    } catch {
      // rewritten below
    }
  }
  const env = { ...opts.env, ...(opts.pythonPath ? { PYTHONPATH: opts.pythonPath } : {}) };
  mkdirSync(opts.cacheDir, { recursive: true });
  const { code, lines } = await runTool([python, "-c", ASK_PIP], { env, cwd: opts.cacheDir, hooks: {} });
  // An old pip (before 19.3 it has no create_command) says so in a traceback: its exception's own line is the reason.
  if (code !== 0) throw new Error(installerMessage(lines).headline || lines.slice(-3).join(" "));
  const answer = JSON.parse(lines.findLast((l) => l.startsWith("{")) ?? "{}") as PipSettings;
  writeFileAtomic(cacheFile, JSON.stringify(answer));
  return answer;
}

/** pip options that send what it installs somewhere other than the env: no build under them gives the env asked for. */
const RELOCATING = ["target_dir", "prefix_path", "root_path", "use_user_site"];

export function relocatingOptions(settings: PipSettings): string[] {
  return RELOCATING.filter((d) => settings.options[d]?.value).map((d) => settings.options[d]!.flag);
}

/** What uv is given so that it does what pip would do under the machine's configuration. */
export interface UvTranslation {
  env: Record<string, string>;
  args: string[];
  /** pip settings uv cannot honour with the same result, as pip spells them: then pip builds. */
  untranslatable: string[];
}

/** Options that change how pip talks or what it prints, never what it installs. */
const NEUTRAL = new Set(["disable_pip_version_check", "no_input", "cache_dir", "progress_bar", "no_color", "root_user_action", "verbose", "quiet", "log", "exists_action", "python_version_check", "warn_script_location"]);

const list = (v: unknown): string[] => (Array.isArray(v) ? v.map(String) : typeof v === "string" ? v.split(/\s+/).filter(Boolean) : []);

/**
 * pip's configured install options as uv's: indexes, find-links, no-index,
 * constraint and requirement files, certificates, trusted hosts, timeout and
 * retries, proxy, pre-releases, only/no-binary, hashes.
 * Anything else stays pip's (named in `untranslatable`).
 */
export function translateForUv(settings: PipSettings): UvTranslation {
  const env: Record<string, string> = {};
  const args: string[] = [];
  const untranslatable: string[] = [];
  for (const [dest, { flag, value }] of Object.entries(settings.options)) {
    if (NEUTRAL.has(dest)) continue;
    switch (dest) {
      case "index_url":
        env.UV_INDEX_URL = String(value);
        break;
      case "extra_index_urls":
        if (list(value).length) env.UV_EXTRA_INDEX_URL = list(value).join(" ");
        break;
      case "find_links":
        for (const f of list(value)) args.push("--find-links", f);
        break;
      case "no_index":
        if (value) args.push("--no-index");
        break;
      case "constraints":
        for (const f of list(value)) args.push("-c", f);
        break;
      case "requirements":
        for (const f of list(value)) args.push("-r", f);
        break;
      case "cert":
        if (value) env.SSL_CERT_FILE = String(value);
        break;
      case "client_cert":
        if (value) env.SSL_CLIENT_CERT = String(value);
        break;
      case "trusted_hosts":
        for (const h of list(value)) args.push("--allow-insecure-host", h);
        break;
      case "timeout":
        env.UV_HTTP_TIMEOUT = String(Math.ceil(Number(value)));
        break;
      case "retries":
        env.UV_HTTP_RETRIES = String(value);
        break;
      case "proxy":
        if (value) Object.assign(env, { HTTPS_PROXY: String(value), HTTP_PROXY: String(value), https_proxy: String(value), http_proxy: String(value) });
        break;
      case "pre":
        if (value) args.push("--prerelease", "allow");
        break;
      case "format_control": {
        const fc = value as { no_binary?: string[]; only_binary?: string[] };
        if (fc.no_binary?.length) args.push("--no-binary", fc.no_binary.join(","));
        if (fc.only_binary?.length) args.push("--only-binary", fc.only_binary.join(","));
        break;
      }
      case "require_hashes":
        if (value) args.push("--require-hashes");
        break;
      case "build_isolation":
        // Off in pip (PIP_NO_BUILD_ISOLATION=0 or false reads as off there): the build sees the env's own packages, pip's way.
        if (!value) untranslatable.push(flag);
        break;
      default:
        untranslatable.push(flag);
    }
  }
  return { env, args, untranslatable };
}
