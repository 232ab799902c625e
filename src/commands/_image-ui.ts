import type { EnsureHooks, EnsureResult, PullProgress } from "../docker/index.ts";
import { formatBytes, formatSeconds, type Output } from "../ui/output.ts";
import type { EnvImageDoc } from "./_json.ts";

/** How a pull is reported: which engine, layers and bytes (throttled), the engine's own lines with --verbose. */
export function imageHooks(out: Output): EnsureHooks {
  const started = performance.now();
  const elapsed = () => formatSeconds((performance.now() - started) / 1000);
  let lastPrint = 0;
  let lastDone = -1;
  let image = "";
  const show = (p: PullProgress, force = false) => {
    const now = performance.now();
    if (!force && p.layersDone === lastDone && now - lastPrint < 2000) return;
    lastPrint = now;
    lastDone = p.layersDone;
    const bytes = p.bytesTotal ? `, ${formatBytes(p.bytesDone)} of ${formatBytes(p.bytesTotal)}` : p.bytesDone ? `, ${formatBytes(p.bytesDone)}` : "";
    out.progress(`[${elapsed()}] ${image}: ${p.layersDone}/${p.layers} layers${bytes}`);
  };
  return {
    onWait: (m) => out.progress(`… ${m}`),
    onPull: (ref, engine) => {
      image = ref;
      out.progress(`[${elapsed()}] pulling ${ref} with ${engine.name}`);
    },
    onProgress: (p) => show(p),
    // Progress bars redraw many times a second; only the engine's other lines are worth a line each.
    onLine: (line) => {
      if (!/\[[=> -]*\]/.test(line)) out.tool(line);
    },
  };
}

/** The stderr summary line of an image prepare. */
export function imageSummary(r: EnsureResult): string {
  const what = `image ${r.image} (${r.engine.name}, ${formatBytes(r.sizeBytes)}, ${r.digest.slice(0, 19)}…)`;
  if (r.status === "reused") return `${what} reused (${formatSeconds(r.seconds)})`;
  const layers = r.progress?.layers ? `, ${r.progress.layers} layer${r.progress.layers === 1 ? "" : "s"}` : "";
  return `${what} pulled in ${formatSeconds(r.seconds)}${layers}`;
}

/** `env prepare --json` for an image. */
export function imageJson(r: EnsureResult): EnvImageDoc {
  return {
    image: r.image,
    digest: r.digest,
    status: r.status,
    seconds: Number(r.seconds.toFixed(4)),
    engine: r.engine.name,
    image_id: r.imageId,
    size_bytes: r.sizeBytes,
    pulled_by_gpulayer: r.pulledByGpulayer,
  };
}
