/**
 * The Prometheus text exposition format (version 0.0.4), for the few
 * families gpulayer exposes: HELP and TYPE once per family, then its samples,
 * label values escaped; histograms as cumulative buckets, +Inf, _sum, _count.
 */

/** Seconds, for phases (a reused env is milliseconds, a cold build minutes). */
export const SECOND_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800];

export type Labels = Record<string, string>;
export type Groups = Map<string, { labels: Labels; values: number[] }>;

export class Family {
  readonly lines: string[] = [];
  constructor(
    readonly name: string,
    type: "gauge" | "counter" | "histogram",
    help: string,
  ) {
    this.lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
  }
  sample(value: number, labels: Labels = {}, suffix = ""): void {
    this.lines.push(`${this.name}${suffix}${labelText(labels)} ${formatValue(value)}`);
  }
  histogram(groups: Groups, buckets = SECOND_BUCKETS): void {
    for (const { labels, values } of groups.values()) {
      for (const le of buckets) this.sample(values.filter((v) => v <= le).length, { ...labels, le: String(le) }, "_bucket");
      this.sample(values.length, { ...labels, le: "+Inf" }, "_bucket");
      this.sample(values.reduce((a, b) => a + b, 0), labels, "_sum");
      this.sample(values.length, labels, "_count");
    }
  }
}

function labelText(labels: Labels): string {
  const parts = Object.entries(labels).map(([k, v]) => `${k}="${v.replace(/\\/g, "\\\\").replace(/\n/g, "\\n").replace(/"/g, '\\"')}"`);
  return parts.length ? `{${parts.join(",")}}` : "";
}

function formatValue(v: number): string {
  return Number.isFinite(v) ? String(Math.round(v * 1e6) / 1e6) : v > 0 ? "+Inf" : "-Inf";
}

/** One observation into the group of its label set. */
export function observe(into: Groups, labels: Labels, value: number): void {
  const id = JSON.stringify(labels);
  const g = into.get(id) ?? { labels, values: [] };
  g.values.push(value);
  into.set(id, g);
}

/** Families as one exposition. */
export function exposition(families: Family[]): string {
  return `${families.flatMap((f) => f.lines).join("\n")}\n`;
}
