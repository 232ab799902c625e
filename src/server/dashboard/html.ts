import { formatAgo, formatBytes, formatSeconds } from "../../ui/output.ts";

/**
 * HTML for the dashboard: every value from a job, a worker or a log goes
 * through `esc` (names, commands, labels and log lines are user data), and
 * pages hold no inline script or style (the Content-Security-Policy forbids
 * both): bars are SVG shapes with sizes as attributes.
 */

export function esc(value: unknown): string {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]!);
}

/** Trusted markup, built by the functions here from escaped parts. */
export class Html {
  constructor(readonly text: string) {}
}

/** A template tag: interpolated values are escaped unless they are Html already (or arrays of it). */
export function html(strings: TemplateStringsArray, ...values: unknown[]): Html {
  let out = strings[0]!;
  values.forEach((v, i) => {
    out += (Array.isArray(v) ? v : [v]).map((x) => (x instanceof Html ? x.text : esc(x))).join("") + strings[i + 1]!;
  });
  return new Html(out);
}

export const PAGES = [
  ["workers", "/workers", "Workers"],
  ["jobs", "/jobs", "Jobs"],
  ["envs", "/envs", "Environments"],
] as const;

export function layout(title: string, active: string, body: Html, opts: { data?: Record<string, string> } = {}): string {
  const data = Object.entries(opts.data ?? {}).map(([k, v]) => html` data-${k}="${v}"`);
  return html`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>${title} · gpulayer</title><link rel="stylesheet" href="/assets/style.css"><script src="/assets/app.js" defer></script></head>
<body${data}><header><a class="brand" href="/jobs">gpulayer</a><nav>${PAGES.map(([id, href, label]) => html`<a href="${href}"${id === active ? new Html(' class="active"') : ""}>${label}</a>`)}</nav>
<form method="post" action="/logout"><button type="submit">Sign out</button></form></header>
<main>${body}</main></body></html>
`.text;
}

/** The CLI's own formats (ui/output.ts), with a dash for what is not known yet. */
export function seconds(s: number | null | undefined): string {
  return s === null || s === undefined ? "–" : formatSeconds(s);
}

export function ago(iso: string | null): string {
  return iso ? formatAgo(Date.parse(iso)) : "–";
}

export { formatBytes };

/** A horizontal bar, `value` of `max`, as SVG (no inline style needed). */
export function bar(value: number | null | undefined, max: number, kind: "prepare" | "run"): Html {
  const width = value && max > 0 ? Math.max(1, Math.round((value / max) * 160)) : 0;
  return html`<svg class="bar" width="160" height="12" role="img" aria-label="${kind} ${seconds(value)}"><rect class="${kind}" x="0" y="1" width="${width}" height="10"></rect></svg>`;
}
