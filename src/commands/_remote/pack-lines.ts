import type { PackProgress } from "../../cluster/bundle.ts";
import { formatBytes, type Output } from "../../ui/output.ts";

/** What packing a folder for a server says, the same for `job run` and `env prepare`: what is left out, and progress on a big folder. */
export function packLines(out: Output, folder: string) {
  return {
    onSkipped: (s: { path: string; reason: string }) => out.log.warn(`not sent: ${s.path}: ${s.reason}`),
    onOwnerOnly: (paths: string[]) => out.log.warn(`not sent: ${paths.length} file${paths.length === 1 ? "" : "s"} only their owner may read: ${firstFew(paths)} (name one with !PATTERN in .gpulayerignore to send it)`),
    onPacking: (p: PackProgress) => out.progress(`packing ${folder}: ${p.entries} entries, ${formatBytes(p.bytes)} so far`),
  };
}

/** The first few of `paths`, and how many more. */
function firstFew(paths: string[], n = 5): string {
  return paths.slice(0, n).join(", ") + (paths.length > n ? ` and ${paths.length - n} more` : "");
}
