/**
 * The dashboard's stylesheet and its one script, shipped inside the binary
 * (no CDN, no network beyond the server). The script does the live parts
 * only: a running job's log and state, and a refresh of the lists.
 */

export const STYLE = `
:root { --fg: #1d2330; --muted: #6b7280; --line: #e5e7eb; --bg: #f8fafc; --prepare: #f59e0b; --run: #3b82f6; --ok: #15803d; --bad: #b91c1c; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: var(--bg); }
header { display: flex; align-items: center; gap: 24px; padding: 10px 24px; background: #111827; color: #fff; }
header a { color: #cbd5e1; text-decoration: none; margin-right: 16px; }
header a.active, header a:hover { color: #fff; }
header .brand { font-weight: 700; color: #fff; }
header form { margin-left: auto; }
header button { background: none; border: 1px solid #475569; color: #cbd5e1; border-radius: 4px; padding: 3px 10px; cursor: pointer; }
main { padding: 20px 24px; }
h1 { font-size: 20px; margin: 0 0 14px; }
h2 { font-size: 16px; margin: 22px 0 8px; }
table { border-collapse: collapse; width: 100%; background: #fff; border: 1px solid var(--line); }
th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid var(--line); vertical-align: middle; white-space: nowrap; }
th { font-weight: 600; color: var(--muted); background: #f1f5f9; }
td.wrap { white-space: normal; word-break: break-all; }
a { color: #1d4ed8; }
.state-succeeded { color: var(--ok); } .state-failed, .state-lost { color: var(--bad); } .state-running, .state-busy, .state-preparing { color: #1d4ed8; }
.muted { color: var(--muted); }
svg.bar rect.prepare { fill: var(--prepare); } svg.bar rect.run { fill: var(--run); }
svg.timeline rect.prepare, svg.timeline rect.pull { fill: var(--prepare); } svg.timeline rect.pull { opacity: .6; } svg.timeline rect.run { fill: var(--run); }
svg.timeline text { font-size: 12px; fill: var(--fg); }
.legend span { display: inline-block; margin-right: 14px; } .legend .prepare::before, .legend .run::before { content: ""; display: inline-block; width: 10px; height: 10px; margin-right: 5px; }
.legend .prepare::before { background: var(--prepare); } .legend .run::before { background: var(--run); }
pre.log { background: #0b1020; color: #e2e8f0; padding: 12px; border-radius: 6px; max-height: 480px; overflow: auto; white-space: pre-wrap; word-break: break-all; }
form.filters { margin-bottom: 12px; display: flex; gap: 10px; align-items: center; }
.signin { max-width: 360px; margin: 80px auto; background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 24px; }
.signin input { width: 100%; padding: 8px; margin: 8px 0 14px; font: inherit; }
.signin button { padding: 8px 16px; font: inherit; }
.error { color: var(--bad); }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 4px 16px; margin: 0 0 12px; }
dl.facts dt { color: var(--muted); }
`;

export const SCRIPT = `
"use strict";
(function () {
  var body = document.body;
  // A running job: its log grows here, read from where it was; the page reloads once when the job ends (phases, exit code).
  var log = document.getElementById("log");
  if (log && body.dataset.live === "1") {
    var offset = Number(log.dataset.offset || "0");
    var job = log.dataset.job;
    var tick = function () {
      fetch("/dash/api/jobs/" + encodeURIComponent(job) + "/log?offset=" + offset, { credentials: "same-origin" })
        .then(function (r) {
          if (r.status === 401) { location.href = "/login"; return null; }
          var state = r.headers.get("x-gpulayer-state");
          var size = Number(r.headers.get("x-gpulayer-log-size") || offset);
          return r.text().then(function (text) {
            if (text) { log.textContent += text; log.scrollTop = log.scrollHeight; }
            offset = size;
            var shown = document.getElementById("job-state");
            if (shown && state) { shown.textContent = state; shown.className = "state-" + state; }
            if (state === "succeeded" || state === "failed" || state === "cancelled" || state === "skipped") setTimeout(function () { location.reload(); }, 300);
            else setTimeout(tick, 1000);
          });
        })
        .catch(function () { setTimeout(tick, 3000); });
    };
    setTimeout(tick, 1000);
  }
  // Lists: read again every few seconds while the page is open.
  if (body.dataset.refresh) setTimeout(function () { location.reload(); }, Number(body.dataset.refresh) * 1000);
})();
`;
