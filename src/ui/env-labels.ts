/**
 * What tells envs apart in a listing (`env list`, the dashboard): the
 * interpreter that built each (version and a short path: after `join --python`
 * changed the default, two envs of one request differ only there), and the
 * request, where two envs' requests read the same (`requirements.txt` of two
 * projects), with the file's folder or, in the same folder, its content.
 */

export interface EnvPython {
  version: string;
  path: string;
}

/** The top requirements file (REQ_FILE, -r): its absolute path and a digest of what it says. */
export interface EnvRequirementsFile {
  path: string;
  digest: string;
}

/** `3.11.7 /usr/bin/python3`; a long path keeps its last folders: `3.12.1 …/3.12.1/bin/python3`. */
export function pythonLabel(python: EnvPython | null | undefined, max = 32): string {
  if (!python) return "-";
  return `${python.version} ${shortPath(python.path, max)}`;
}

export function shortPath(path: string, max: number): string {
  if (path.length <= max) return path;
  const parts = path.split("/");
  let tail = parts.pop()!;
  while (parts.length && parts.at(-1)!.length + tail.length + 3 <= max) tail = `${parts.pop()}/${tail}`;
  return `…/${tail}`;
}

/** Each env's request as listed: its summary, and where another env's summary is the same but its file is not, which file. */
export function requestLabels(envs: { summary: string; requirementsFile?: EnvRequirementsFile | null }[]): string[] {
  const bySummary = new Map<string, EnvRequirementsFile[]>();
  for (const e of envs) if (e.requirementsFile) bySummary.set(e.summary, [...(bySummary.get(e.summary) ?? []), e.requirementsFile]);
  return envs.map((e) => {
    const file = e.requirementsFile;
    const same = bySummary.get(e.summary) ?? [];
    const name = file?.path.split("/").pop();
    if (!file || !name || !e.summary.endsWith(name) || new Set(same.map((f) => `${f.path}\0${f.digest}`)).size < 2) return e.summary;
    const folder = (f: EnvRequirementsFile) => f.path.split("/").at(-2) ?? "";
    // Two projects: the folder says which. One file changed over time (or folders of one name): its content does.
    const byFolder = new Set(same.map(folder)).size > 1;
    const byContent = new Set(same.filter((f) => folder(f) === folder(file)).map((f) => f.digest)).size > 1;
    return `${byFolder ? `${e.summary.slice(0, -name.length)}${folder(file)}/${name}` : e.summary}${byContent ? ` (sha256:${file.digest.slice(0, 8)})` : ""}`;
  });
}
