import type { RemoteJobStatus, WorkerCache, WorkerView } from "../../cluster/protocol.ts";
import type { Phase } from "../../jobs/model.ts";
import { ago, bar, esc, formatBytes, Html, html, layout, seconds } from "./html.ts";
import { STYLE } from "./assets.ts";
import { pythonLabel, requestLabels } from "../../ui/env-labels.ts";

/** The pages, rendered from what the API reads (the same documents `job status` and `workers` print). */

export interface WorkerLine extends WorkerView {
  cache: WorkerCache | null;
  hits: { hit: number; miss: number } | null;
}

const state = (s: string) => html`<span class="state-${s}">${s}</span>`;

/** The sign-in page carries its stylesheet inline (the stylesheet file, like every asset, needs a session); the CSP names its hash. */
export function signInPage(error: string | null): string {
  return html`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>Sign in · gpulayer</title><style>${new Html(STYLE)}</style></head>
<body><form class="signin" method="post" action="/login"><h1>gpulayer</h1><label for="token">The server's token, or a user token</label>
<input id="token" name="token" type="password" autocomplete="current-password" autofocus required>
${error ? html`<p class="error">${error}</p>` : ""}<button type="submit">Sign in</button></form></body></html>
`.text;
}

export function workersPage(workers: WorkerLine[]): string {
  const rows = workers.map((w) => {
    const torch = w.probe.frameworks.torch;
    const total = w.hits ? w.hits.hit + w.hits.miss : 0;
    return html`<tr><td>${w.name}</td><td class="wrap">${Object.entries(w.labels).map(([k, v]) => `${k}=${v}`).join(", ") || "–"}</td>
<td>${w.probe.gpus.length ? `${w.probe.gpus.length} × ${w.probe.gpus[0]?.name ?? "GPU"}` : "none"}</td><td>${torch ? `torch ${torch}${w.probe.cuda ? `, CUDA ${w.probe.cuda}` : ""}` : "–"}</td>
<td>${state(w.state)}</td><td>${w.running}/${w.slots}</td><td>${ago(w.last_seen)}</td>
<td>${w.cache ? `${formatBytes(w.cache.bytes)} in ${w.cache.entries} env(s)` : "–"}</td><td>${total ? `${Math.round((w.hits!.hit / total) * 100)}% of ${total}` : "–"}</td></tr>`;
  });
  return layout(
    "Workers",
    "workers",
    html`<h1>Workers</h1><table><thead><tr><th>Name</th><th>Labels</th><th>GPUs</th><th>torch / CUDA</th><th>State</th><th>Load</th><th>Last seen</th><th>Cache</th><th>Hit rate</th></tr></thead>
<tbody>${rows.length ? rows : html`<tr><td colspan="9" class="muted">No worker has joined yet (gpulayer join URL --token-file FILE)</td></tr>`}</tbody></table>`,
    { data: { refresh: "5" } },
  );
}

const phase = (s: Pick<RemoteJobStatus, "phases" | "tasks">, name: Phase["name"]): number | null => {
  if (s.tasks?.length) return s.tasks.reduce((n, t) => n + (t.phases.find((p) => p.name === name)?.seconds ?? 0), 0) || null;
  return s.phases.find((p) => p.name === name)?.seconds ?? null;
};

const cacheOf = (s: Pick<RemoteJobStatus, "phases" | "tasks">): string => {
  const caches = (s.tasks?.length ? s.tasks.flatMap((t) => t.phases) : s.phases).filter((p) => p.name === "task.prepare" && p.cache).map((p) => p.cache);
  if (!caches.length) return "–";
  return caches.every((c) => c === "hit") ? "hit" : caches.every((c) => c === "miss") ? "miss" : `${caches.filter((c) => c === "hit").length}/${caches.length} hit`;
};

export function jobsPage(jobs: Omit<RemoteJobStatus, "events">[], filter: { state: string; worker: string }, workers: string[]): string {
  const max = Math.max(0.001, ...jobs.map((j) => Math.max(phase(j, "task.prepare") ?? 0, phase(j, "task.run") ?? 0)));
  const rows = jobs.map((j) => {
    const p = phase(j, "task.prepare");
    const r = phase(j, "task.run");
    return html`<tr><td><a href="/jobs/${j.id}">${j.id.slice(0, 8)}</a></td><td class="wrap">${j.name}${j.tasks?.length ? html` <span class="muted">(${j.tasks.length} task${j.tasks.length === 1 ? "" : "s"})</span>` : ""}</td><td>${state(j.state)}</td>
<td>${j.worker ?? (j.tasks?.length ? [...new Set(j.tasks.map((t) => t.worker).filter(Boolean))].join(", ") : "–")}</td>
<td>${bar(p, max, "prepare")} ${seconds(p)}</td><td>${bar(r, max, "run")} ${seconds(r)}</td><td>${cacheOf(j)}</td><td>${j.exit_code ?? "–"}</td><td>${ago(j.created)}</td></tr>`;
  });
  const option = (value: string, current: string, label = value) => html`<option value="${value}"${value === current ? new Html(" selected") : ""}>${label}</option>`;
  const states = ["", "queued", "preparing", "running", "succeeded", "failed", "cancelled"];
  return layout(
    "Jobs",
    "jobs",
    html`<h1>Jobs</h1>
<form class="filters" method="get" action="/jobs"><label>State <select name="state">${states.map((s) => option(s, filter.state, s || "any"))}</select></label>
<label>Worker <select name="worker">${["", ...workers].map((w) => option(w, filter.worker, w || "any"))}</select></label><button type="submit">Show</button></form>
<p class="legend"><span class="prepare">task.prepare (env found or built, image pulled)</span><span class="run">task.run</span></p>
<table><thead><tr><th>Job</th><th>Name</th><th>State</th><th>Worker</th><th>Prepare</th><th>Run</th><th>Cache</th><th>Exit</th><th>Created</th></tr></thead>
<tbody>${rows.length ? rows : html`<tr><td colspan="9" class="muted">No jobs${filter.state || filter.worker ? " match" : " yet"}</td></tr>`}</tbody></table>`,
    { data: { refresh: "5" } },
  );
}

/** The job's phases on a time axis from its submission: the image pulled, the env built or reused (or fetched), the run. */
function timeline(s: RemoteJobStatus): Html {
  const events = s.events;
  const t0 = events[0]?.ts ?? Date.now();
  const at = (type: string) => events.findLast((e) => e.type === type);
  const prepStart = at("task.prepare.started")?.ts;
  const prep = at("task.prepare.finished") ?? at("task.prepare.failed");
  const runStart = at("task.run.started")?.ts;
  const runEnd = at("task.run.finished");
  const now = Date.now();
  const bars: { label: string; kind: string; from: number; to: number }[] = [];
  if (prepStart !== undefined) {
    const end = prep?.ts ?? now;
    const d = prep?.data ?? {};
    if (d.image_seconds !== undefined && d.env_seconds !== undefined) {
      const pulled = prepStart + Number(d.image_seconds) * 1000;
      bars.push({ label: `image ${d.image_status}`, kind: "pull", from: prepStart, to: pulled }, { label: `env ${d.env_status}`, kind: "prepare", from: pulled, to: end });
    } else bars.push({ label: d.image ? `image ${d.status}` : prep ? `env ${d.status ?? "failed"}${d.cache ? ` (cache ${d.cache})` : ""}` : "preparing", kind: d.image ? "pull" : "prepare", from: prepStart, to: end });
  }
  if (runStart !== undefined) bars.push({ label: runEnd ? `run (exit ${runEnd.data.exit_code})` : "running", kind: "run", from: runStart, to: runEnd?.ts ?? now });
  if (!bars.length) return html`<p class="muted">Not started yet${s.waiting ? `: waiting for ${s.waiting}` : ""}.</p>`;
  const span = Math.max(1, Math.max(...bars.map((b) => b.to)) - t0);
  const x = (ms: number) => 120 + Math.round(((ms - t0) / span) * 560);
  return html`<svg class="timeline" width="760" height="${bars.length * 26 + 10}" role="img" aria-label="timeline">${bars.map(
    (b, i) => html`<text x="0" y="${i * 26 + 20}">${b.label}</text><rect class="${b.kind}" x="${x(b.from)}" y="${i * 26 + 8}" width="${Math.max(2, x(b.to) - x(b.from))}" height="16"></rect><text x="${Math.min(700, x(b.to) + 6)}" y="${i * 26 + 20}">${seconds((b.to - b.from) / 1000)}</text>`,
  )}</svg>`;
}

/** `logFrom`: where the shown log starts (its earlier part is left out of the page). */
export function jobPage(s: RemoteJobStatus, log: string, logSize: number, live: boolean, logFrom = 0): string {
  const events = s.events.map((e) => html`<tr><td>${e.time}</td><td>${e.type}</td><td class="wrap">${JSON.stringify(e.data)}</td></tr>`);
  const tasks = (s.tasks ?? []).map(
    (t) => html`<tr><td><a href="/jobs/${t.id}">${t.name}</a></td><td>${state(t.state)}</td><td>${t.needs.join(", ") || "–"}</td><td>${t.worker ?? "–"}</td><td>${seconds(t.phases.find((p) => p.name === "task.prepare")?.seconds)}</td><td>${seconds(t.phases.find((p) => p.name === "task.run")?.seconds)}</td><td>${t.exit_code ?? "–"}</td></tr>`,
  );
  return layout(
    `Job ${s.name}`,
    "jobs",
    html`<h1>Job ${s.name} <span id="job-state" class="state-${s.state}">${s.state}</span></h1>
<dl class="facts"><dt>id</dt><dd>${s.id}</dd><dt>command</dt><dd>${s.command}</dd><dt>worker</dt><dd>${s.worker ?? "–"}</dd><dt>exit code</dt><dd>${s.exit_code ?? "–"}</dd>
<dt>env</dt><dd>${s.env_key ? esc(s.env_key.slice(0, 16)) : "–"}</dd>${s.error ? html`<dt>error</dt><dd class="error">${s.error}</dd>` : ""}</dl>
${s.tasks?.length ? html`<h2>Tasks</h2><table><thead><tr><th>Task</th><th>State</th><th>Needs</th><th>Worker</th><th>Prepare</th><th>Run</th><th>Exit</th></tr></thead><tbody>${tasks}</tbody></table>` : html`<h2>Timeline</h2>${timeline(s)}`}
${s.tasks?.length ? "" : html`<h2>Log</h2>${logFrom ? html`<p class="muted">The first ${formatBytes(logFrom)} are left out: <code>gpulayer job logs ${s.id}</code> prints it all.</p>` : ""}<pre class="log" id="log" data-job="${s.id}" data-offset="${logSize}">${log}</pre>`}
<h2>Events</h2><table><thead><tr><th>Time</th><th>Event</th><th>Data</th></tr></thead><tbody>${events}</tbody></table>`,
    { data: live ? { live: "1" } : {} },
  );
}

export function envsPage(workers: WorkerLine[]): string {
  const sections = workers.map((w) => {
    // Oldest use first: what gc takes first when it has to make room.
    const envs = [...(w.cache?.envs ?? [])].sort((a, b) => (a.last_used ?? "").localeCompare(b.last_used ?? ""));
    const requests = requestLabels(envs.map((e) => ({ summary: e.summary, requirementsFile: e.requirements_file })));
    return html`<h2>${w.name} <span class="muted">${w.cache ? `${formatBytes(w.cache.bytes)} in ${w.cache.entries} env(s)` : "has not reported its cache yet"}</span></h2>
<table><thead><tr><th>Key</th><th>Python</th><th>Request</th><th>Size</th><th>Last used</th><th>State</th></tr></thead><tbody>${
      envs.length
        ? envs.map(
            (e, i) =>
              html`<tr><td>${e.key.slice(0, 12)}</td><td class="wrap"${e.python ? html` title="${e.python.path}"` : ""}>${pythonLabel(e.python)}</td><td class="wrap"${e.requirements_file ? html` title="${e.requirements_file.path}"` : ""}>${requests[i]!}</td><td>${formatBytes(e.bytes)}</td><td>${ago(e.last_used)}</td><td>${e.state}</td></tr>`,
          )
        : html`<tr><td colspan="6" class="muted">No envs</td></tr>`
    }</tbody></table>`;
  });
  return layout("Environments", "envs", html`<h1>Environments</h1><p class="muted">Each worker's cached envs, least recently used first: the order <code>gpulayer gc</code> takes them in.</p>${sections}`, { data: { refresh: "10" } });
}
