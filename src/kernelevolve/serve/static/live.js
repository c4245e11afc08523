// The live view of a kernelevolve workspace (served by the kernelevolve.serve package).
//
// Hash routes: #/ the runs and benches, #/run/ID a run, #/run/ID/node/N a run with one node open,
// #/bench/ID a bench. Every POLL_MS the current view's JSON is fetched again with the stamp of the
// last answer; the server says {"unchanged": true} until the workspace changes, and only then is
// the view redrawn.
//
// Safety: everything in the answers except the `charts` came from the workspace and is untrusted
// (kernel sources written by a model): it reaches the page only as text nodes (textContent), never
// as markup. The charts are SVG that the server built from escaped parts (report/svg.py), the same
// markup the static reports inline. The page's Content-Security-Policy runs no inline script.
"use strict";

const POLL_MS = 2000;
const STATUS_COLORS = {
  ok: "#2e9e44", incorrect: "#e08a00", compile_error: "#d62728", runtime_error: "#b5179e",
  timeout: "#8c564b", crash: "#7f0000", oom: "#9467bd", guard_violation: "#222222",
  suspicious: "#e377c2", failed: "#777777", pending: "#bbbbbb",
};

let route = null;      // {kind, id, node}
let stamp = "";        // the stamp of the view's last answer
let nodeStamp = "";    // the run stamp the open node was last fetched at
let timer = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "onclick") node.addEventListener("click", v);
    else node.setAttribute(k, v);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function kv(rows) {
  return el("table", { class: "kv" }, rows.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v))));
}

function table(columns, rows, rowAttrs) {
  const head = el("thead", {}, el("tr", {}, columns.map((c) => el("th", {}, c))));
  const body = el("tbody", {}, rows.map((cells, i) =>
    el("tr", rowAttrs ? rowAttrs(i) : {}, cells.map((c) => (c instanceof Node ? el("td", {}, c) : el("td", { class: "text" }, c))))));
  return el("table", {}, head, body);
}

function dot(status, label) {
  const span = el("span", { class: "dot" });
  span.style.background = STATUS_COLORS[status] || "#555";
  return el("span", {}, span, label === undefined ? status : label);
}

// A chart: SVG markup built by the server from escaped parts (see the note at the top).
// `fit`: scaled to the column's width (the charts); otherwise drawn at its size and scrolled (the tree).
function chart(svg, id, fit) {
  const box = el("div", { class: fit ? "chart fit" : "chart", id: id });
  box.innerHTML = svg;
  return box;
}

function setLive(ok, text) {
  const live = document.getElementById("live");
  live.className = "live " + (ok ? "ok" : "down");
  live.textContent = text;
}

function parseRoute() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "run" && parts[1]) return { kind: "run", id: parts[1], node: parts[2] === "node" ? parts[3] : null };
  if (parts[0] === "bench" && parts[1]) return { kind: "bench", id: parts[1] };
  return { kind: "list" };
}

function apiPath(r) {
  if (r.kind === "run") return "/api/runs/" + encodeURIComponent(r.id);
  if (r.kind === "bench") return "/api/benches/" + encodeURIComponent(r.id);
  return "/api/runs";
}

async function getJSON(path) {
  const res = await fetch(path, { cache: "no-store" });
  const doc = await res.json();
  if (!res.ok) throw new Error(doc.error + (doc.hint ? " (" + doc.hint + ")" : ""));
  return doc;
}

// -- views ----------------------------------------------------------------------------------------

function renderList(doc) {
  const main = document.getElementById("main");
  const runs = doc.runs.map((r) => [
    el("a", { href: "#/run/" + encodeURIComponent(r.run_id) }, r.run_id), r.spec, r.platform,
    r.synthesizer + " / " + r.policy,
    dot(r.status === "running" ? "pending" : r.status === "done" ? "ok" : "failed", r.status),
    r.evaluated + (r.budget ? " / " + r.budget : ""), r.best, r.created_at.slice(0, 19).replace("T", " "),
  ]);
  const benches = doc.benches.map((b) => [
    el("a", { href: "#/bench/" + encodeURIComponent(b.bench_id) }, b.bench_id), b.dir, b.status,
    b.done + " / " + b.items, String(b.updated_at || "").slice(0, 19).replace("T", " "),
  ]);
  main.replaceChildren(
    el("h1", {}, "Runs"),
    runs.length ? table(["run", "spec", "platform", "synthesizer / policy", "status", "evaluated", "best", "started"], runs)
      : el("p", { class: "muted" }, "No run in this workspace yet: start one with kernelevolve optimize."),
    el("h2", {}, "Benches"),
    benches.length ? table(["bench", "directory", "status", "done", "updated"], benches)
      : el("p", { class: "muted" }, "No bench in this workspace."),
  );
  document.getElementById("crumbs").replaceChildren();
}

function keepScroll(id, draw) {
  const old = document.getElementById(id);
  const pos = old ? [old.scrollLeft, old.scrollTop] : null;
  draw();
  const now = document.getElementById(id);
  if (pos && now) [now.scrollLeft, now.scrollTop] = pos;
}

function renderRun(doc) {
  const main = document.getElementById("main");
  let runBox = document.getElementById("run");
  if (!runBox || runBox.dataset.run !== doc.run_id) {
    runBox = el("div", { id: "run" });
    runBox.dataset.run = doc.run_id;
    main.replaceChildren(runBox, el("div", { id: "node" }));
  }
  const p = doc.progress;
  const bar = el("progress", { max: String(p.budget || Math.max(p.evaluated, 1)), value: String(p.evaluated) });
  const states = Object.entries(p.states).map(([k, v]) => k + " " + v).join(", ");
  const link = (n) => "#/run/" + encodeURIComponent(doc.run_id) + "/node/" + n.id;
  const rows = doc.nodes.map((n) => {
    const cells = n.cells.slice();
    cells[0] = el("a", { href: link(n) }, cells[0] + (n.id === doc.best ? " ★" : ""));
    cells[3] = dot(n.status);
    return cells;
  });
  const rowAttrs = (i) => {
    const n = doc.nodes[i];
    const sel = route.node && String(n.id) === String(route.node);
    return { class: "click" + (sel ? " sel" : n.id === doc.best ? " best" : ""), "data-node": String(n.id) };
  };
  keepScroll("tree", () => keepScroll("nodes-box", () => runBox.replaceChildren(
    el("h1", {}, doc.title),
    el("p", {}, bar, " ", p.evaluated + (p.budget ? " of " + p.budget : "") + " evaluated; best " + p.best +
      "; " + doc.status + ", " + p.elapsed + " since start"),
    el("p", { class: "muted" }, "nodes: " + states + ". Verdicts: " + p.statuses.map(([s, c]) => s + " " + c).join(", ")),
    el("div", { class: "grid" },
      el("div", {}, el("h2", {}, "Best so far, by nodes evaluated"), chart(doc.charts.curve, "curve", true)),
      el("div", {}, el("h2", {}, "Best so far, over time"), chart(doc.charts.time, "time", true))),
    el("h2", {}, "Search tree"),
    doc.best_path.length ? el("p", {}, "Best path: " + doc.best_path.join(" → ")) : null,
    chart(doc.charts.tree, "tree"),
    el("h2", {}, "Nodes"),
    (() => { const box = el("div", { class: "chart", id: "nodes-box" }, table(doc.columns, rows, rowAttrs)); return box; })(),
    el("details", {}, el("summary", {}, "Run"), kv(doc.header), el("h3", {}, "Best candidate"), kv(doc.headline)),
    el("p", {}, el("a", { href: "/api/runs/" + encodeURIComponent(doc.run_id) + "/report", target: "_blank", rel: "noopener" },
      "The static report, as of now")),
  )));
  for (const tr of runBox.querySelectorAll("tr[data-node]")) {
    tr.addEventListener("click", (e) => { if (!e.target.closest("a")) location.hash = link({ id: tr.dataset.node }); });
  }
  document.getElementById("crumbs").replaceChildren("run " + doc.run_id);
}

function diffPre(text) {
  const pre = el("pre", { id: "diff" });
  for (const line of text.split("\n")) {
    const cls = /^(\+\+\+|---)/.test(line) ? "file" : line.startsWith("@@") ? "hunk"
      : line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : "";
    pre.append(cls ? el("span", { class: cls }, line) : document.createTextNode(line), "\n");
  }
  return pre;
}

function renderNode(doc) {
  const box = document.getElementById("node");
  if (!box) return;
  box.replaceChildren(
    el("h2", {}, "Node " + doc.id),
    kv(doc.facts),
    doc.shapes.length ? table(doc.shape_columns, doc.shapes) : null,
    el("h3", {}, "Diff against its parent"),
    doc.diff ? diffPre(doc.diff) : el("p", { class: "muted" }, doc.diff_note),
    el("h3", {}, "Source"),
    doc.source === null ? el("p", { class: "muted" }, "no source recorded (not yet proposed, or it failed)")
      : el("pre", { id: "source" }, doc.source),
  );
}

function renderBench(doc) {
  const main = document.getElementById("main");
  const rows = doc.rows.map((r) => {
    const cells = r.cells.slice();
    if (r.run_id) cells[0] = el("a", { href: "#/run/" + encodeURIComponent(r.run_id) }, cells[0]);
    return cells;
  });
  const charts = ["speedup", "roofline", "progress", "cost"].filter((n) => doc.charts[n])
    .map((n) => el("div", {}, el("h2", {}, n), chart(doc.charts[n], "chart-" + n, n !== "cost")));
  main.replaceChildren(
    el("h1", {}, "Bench " + doc.bench_id),
    kv(doc.header),
    el("h2", {}, "Summary"),
    table(["metric", "vs eager", "vs compile"], doc.summary),
    el("h2", {}, "Per op"),
    rows.length ? el("div", { class: "chart" }, table(doc.columns, rows)) : el("p", { class: "muted" }, "No op finished yet."),
    doc.pending.length ? el("p", { class: "muted" }, "Not yet run: " + doc.pending.join(", ")) : null,
    doc.load_errors.length ? el("ul", {}, doc.load_errors.map((e) => el("li", {}, e.path + ": " + e.error))) : null,
    ...charts,
  );
  document.getElementById("crumbs").replaceChildren("bench " + doc.bench_id);
}

// -- the loop -------------------------------------------------------------------------------------

async function refresh() {
  const r = route;
  try {
    const doc = await getJSON(apiPath(r) + (stamp ? "?since=" + encodeURIComponent(stamp) : ""));
    if (r !== route) return;  // the route changed while this answer travelled
    const changed = !doc.unchanged;
    if (changed) {
      stamp = doc.stamp;
      if (r.kind === "run") renderRun(doc);
      else if (r.kind === "bench") renderBench(doc);
      else renderList(doc);
    }
    if (r.kind === "run" && r.node && (changed || nodeStamp !== stamp)) {
      nodeStamp = stamp;
      const node = await getJSON(apiPath(r) + "/nodes/" + encodeURIComponent(r.node));
      if (r === route) renderNode(node);
    }
    setLive(true, "live, updated " + new Date().toLocaleTimeString());
  } catch (err) {
    setLive(false, "cannot reach the workspace: " + err.message);
    if (!stamp) document.getElementById("main").replaceChildren(el("p", { class: "error" }, String(err.message)));
  }
}

function navigate() {
  const next = parseRoute();
  const sameRun = route && route.kind === "run" && next.kind === "run" && route.id === next.id;
  route = next;
  nodeStamp = "";
  if (!sameRun) stamp = "";
  else {  // the same run, another node: mark its row, fetch the node now
    for (const tr of document.querySelectorAll("tr[data-node]")) {
      tr.classList.toggle("sel", String(tr.dataset.node) === String(next.node));
    }
    if (!next.node) document.getElementById("node")?.replaceChildren();
  }
  refresh();
}

window.addEventListener("hashchange", navigate);
navigate();
timer = setInterval(refresh, POLL_MS);
