/**
 * One spelling for a plain requirement (`name[extras] specifiers ; marker`),
 * only where pip certainly reads two spellings alike: PEP 503 names, the
 * order of extras and of specifier clauses, whitespace around them, and
 * versions that `packaging` calls equal (`==1.0`, `==1.0.0`). Anything else
 * (URLs, paths, options, `${VAR}`, unusual versions) returns null and is
 * keyed by its exact text.
 */

const PLAIN = /^([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(?:\[([A-Za-z0-9._,\s-]*)\])?\s*(\(?[^;@()]*\)?)?\s*(?:;(.*))?$/;
const CLAUSE = /^(~=|===|==|!=|<=|>=|<|>)\s*([A-Za-z0-9.*+!_-]+)$/;
const RELEASE = /^\d+(\.\d+)*$/;

function canonicalClause(clause: string): string | null {
  const m = CLAUSE.exec(clause.trim());
  if (!m) return null;
  const [, op, version] = m as unknown as [string, string, string];
  // packaging strips trailing zeros of a release for every operator but ~= (whose length counts) and === (text).
  if (op !== "~=" && op !== "===" && RELEASE.test(version)) return `${op}${version.replace(/(\.0)+$/, "") || "0"}`;
  return `${op}${version}`;
}

export function canonicalPlainRequirement(text: string): string | null {
  const m = PLAIN.exec(text.trim());
  if (!m) return null;
  const [, name, extrasText, specText, marker] = m;
  let spec = (specText ?? "").trim();
  if (spec.startsWith("(") !== spec.endsWith(")")) return null;
  if (spec.startsWith("(")) spec = spec.slice(1, -1).trim();
  const clauses: string[] = [];
  if (spec) {
    for (const c of spec.split(",")) {
      const canon = canonicalClause(c);
      if (!canon) return null;
      clauses.push(canon);
    }
  }
  const extras = extrasText === undefined ? [] : extrasText.split(",").map((e) => e.trim()).filter(Boolean);
  if (extras.some((e) => /\s/.test(e))) return null;
  const extrasPart = extras.length ? `[${[...new Set(extras)].sort().join(",")}]` : "";
  const markerPart = marker === undefined ? "" : `; ${marker.trim()}`;
  if (marker !== undefined && !marker.trim()) return null;
  return `${normalizeName(name!)}${extrasPart}${[...new Set(clauses)].sort().join(",")}${markerPart}`;
}

/** PEP 503 normalisation. */
export function normalizeName(name: string): string {
  return name.toLowerCase().replace(/[-_.]+/g, "-");
}
