import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { UserError } from "../errors.ts";
import { parseYaml } from "../config/yaml.ts";
import { type Engine, engineExec, type EngineEnv } from "./engine.ts";

/**
 * GPUs in a container. Docker: `--gpus` through the NVIDIA runtime (the
 * nvidia-container-toolkit registers it, or dockerd finds its prestart hook).
 * Podman: CDI devices `nvidia.com/gpu=...` from a spec that
 * `nvidia-ctk cdi generate` writes under /etc/cdi or /var/run/cdi.
 */
export const CDI_DIRS = ["/etc/cdi", "/var/run/cdi"];

/** The NVIDIA GPU device names in the machine's CDI specs ("0", "1", "GPU-uuid", "all"), [] when none. */
export function cdiGpuDevices(dirs: string[] = CDI_DIRS): string[] {
  const names = new Set<string>();
  for (const dir of dirs) {
    let files: string[];
    try {
      files = readdirSync(dir).filter((f) => /\.(ya?ml|json)$/.test(f));
    } catch {
      continue;
    }
    for (const file of files) {
      try {
        const spec = parseYaml(readFileSync(join(dir, file), "utf8")) as { kind?: string; devices?: { name?: unknown }[] };
        if (spec?.kind !== "nvidia.com/gpu") continue;
        for (const d of spec.devices ?? []) if (d && typeof d.name === "string") names.add(d.name);
      } catch {
        // an unreadable spec is podman's problem to report
      }
    }
  }
  return [...names];
}

const dockerNvidia = new Map<string, boolean>();

/** Does this Docker have the NVIDIA runtime (or the hook `--gpus` uses)? */
async function dockerHasNvidia(engine: Engine, env: NodeJS.ProcessEnv): Promise<boolean> {
  const cached = dockerNvidia.get(engine.bin);
  if (cached !== undefined) return cached;
  const r = await engineExec(engine, ["info", "--format", "{{json .Runtimes}}"], { env, timeoutMs: 20_000 });
  let ok = false;
  if (r.code === 0) {
    try {
      ok = Object.keys(JSON.parse(r.stdout) as Record<string, unknown>).some((n) => n.toLowerCase().includes("nvidia"));
    } catch {
      ok = /nvidia/i.test(r.stdout);
    }
  }
  // A local dockerd also serves --gpus through the toolkit's prestart hook alone.
  if (!ok && !env.DOCKER_HOST && Bun.which("nvidia-container-runtime-hook")) ok = true;
  dockerNvidia.set(engine.bin, ok);
  return ok;
}

/** The engine options that give a container `gpus` GPUs (a count, or device ids/UUIDs); a clear error when the machine cannot. */
export async function gpuArgs(engine: Engine, gpus: number | string[], env: EngineEnv, cdiDirs: string[] = CDI_DIRS): Promise<string[]> {
  const devices = Array.isArray(gpus) ? gpus : null;
  if (devices ? devices.length === 0 : !(gpus as number > 0)) return [];
  if (engine.name === "docker") {
    if (!(await dockerHasNvidia(engine, env)))
      throw new UserError(
        "the job asks for GPUs, but docker has no NVIDIA runtime (`docker info` lists none): install nvidia-container-toolkit and run `nvidia-ctk runtime configure --runtime=docker`, then restart dockerd",
      );
    // docker reads --gpus as CSV: a device list must be quoted inside the value.
    return ["--gpus", devices ? `"device=${devices.join(",")}"` : String(gpus)];
  }
  const known = cdiGpuDevices(cdiDirs);
  if (!known.length)
    throw new UserError(`the job asks for GPUs, but podman finds no CDI spec for nvidia.com/gpu in ${cdiDirs.join(" or ")}: run \`nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml\``);
  if (devices) {
    const missing = devices.filter((d) => !known.includes(d));
    if (missing.length) throw new UserError(`GPU device ${missing.join(", ")} is not in the CDI spec (it knows ${known.join(", ")})`);
    return devices.flatMap((d) => ["--device", `nvidia.com/gpu=${d}`]);
  }
  const count = gpus as number;
  const indices = Array.from({ length: count }, (_, i) => String(i));
  if (indices.every((i) => known.includes(i))) return indices.flatMap((d) => ["--device", `nvidia.com/gpu=${d}`]);
  if (known.includes("all")) return ["--device", "nvidia.com/gpu=all"];
  throw new UserError(`the job asks for ${count} GPU(s), but the CDI spec names only ${known.join(", ")}`);
}
