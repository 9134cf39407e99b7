// ArborKV viewer: one problem's search tree (top-down SVG), every block coloured by its KV residency
// at the chosen step, and the memory-over-steps chart with the run's events as marks.
// Plain SVG and DOM, no library; the data is the JSON in <script id="arbor-data"> (arbor_cli/view/data.py).
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("arbor-data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  // residency states; the legend and the block fills (the browser tests read these fills)
  const STATES = [
    ["whole", "#2e7d32", "whole on device"],
    ["shared", "#00838f", "whole, shared (2+ live children)"],
    ["partial", "#f9a825", "partial"],
    ["host", "#7e57c2", "on host"],
    ["dropped", "#c62828", "dropped"],
    ["released", "#cfcfcf", "released"],
    ["future", "#ffffff", "not yet created"],
  ];
  const COLOR = Object.fromEntries(STATES.map((s) => [s[0], s[1]]));
  const BW = 14, BH = 18; // block size in px
  const EVENT_LANES = [
    ["node_end", "#757575", "node end"],
    ["branch_switch", "#1565c0", "branch switch"],
    ["memory_threshold", "#c62828", "memory threshold"],
    ["rehydration", "#7e57c2", "rehydration"],
  ];

  // ---- DOM helpers -------------------------------------------------------------------------
  function svg(tag, attrs, parent) {
    const e = document.createElementNS(NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function html(tag, attrs, text, parent) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function fmt(v, digits) {
    if (v === null || v === undefined) return "-";
    if (typeof v === "number") return Number.isInteger(v) ? v.toLocaleString("en") : v.toFixed(digits === undefined ? 3 : digits);
    if (typeof v === "boolean") return v ? "yes" : "no";
    return String(v);
  }

  // ---- the tree ----------------------------------------------------------------------------
  const tree = D.tree;
  const nodes = tree ? tree.nodes : [];
  const byId = new Map(nodes.map((n) => [n.id, n]));
  const pos = new Map(nodes.map((n, i) => [n.id, i]));
  const kids = new Map(nodes.map((n) => [n.id, []]));
  for (const n of nodes) if (byId.has(n.parent)) kids.get(n.parent).push(n);
  for (const list of kids.values()) list.sort((a, b) => a.id - b.id);
  const roots = nodes.filter((n) => !byId.has(n.parent));
  const best = new Set();
  for (let id = tree ? tree.best : null; id !== null && id !== undefined && byId.has(id); id = byId.get(id).parent) best.add(id);
  const answerId = tree && tree.best !== null && D.row.solved ? tree.best : null;
  const subtreeSize = new Map();
  (function sizes() {
    const order = [];
    const stack = roots.slice();
    while (stack.length) { const n = stack.pop(); order.push(n); stack.push(...kids.get(n.id)); }
    for (let i = order.length - 1; i >= 0; i--) {
      const n = order[i];
      subtreeSize.set(n.id, 1 + kids.get(n.id).reduce((s, c) => s + subtreeSize.get(c.id), 0));
    }
  })();

  // ---- residency per step: 4 ints per node (device, host, dropped, flags: 1 created, 2 released) --
  const trace = D.trace || [];
  const S = Math.max(trace.length, 1);
  const N = nodes.length;
  const res = [];
  const changedAt = []; // per step: node ids whose residency changed at that step
  (function replay() {
    const cur = new Int32Array(N * 4);
    const deltas = D.residency ? D.residency.deltas.slice().sort((a, b) => a[0] - b[0]) : null;
    if (!deltas) { // no residency.jsonl: the end of the search at every step
      nodes.forEach((n, i) => { cur.set([n.kv_device, n.kv_host, n.kv_dropped, 1 | (n.released ? 2 : 0)], 4 * i); });
    }
    let at = 0;
    for (let s = 0; s < S; s++) {
      const step = trace.length ? trace[s].step : Infinity;
      const changed = new Set();
      while (deltas && at < deltas.length && deltas[at][0] <= step) {
        const d = deltas[at++];
        const i = pos.get(d[1]);
        if (i === undefined) continue; // a block of another tree (an LLM verifier's prompt)
        cur[4 * i] += d[2]; cur[4 * i + 1] += d[3]; cur[4 * i + 2] += d[4];
        cur[4 * i + 3] |= 1 | (String(d[5]).indexOf("release") >= 0 ? 2 : 0);
        changed.add(d[1]);
      }
      res.push(cur.slice());
      changedAt.push(changed);
    }
  })();

  function stateOf(id, s) {
    const r = res[s], i = pos.get(id);
    const dev = r[4 * i], host = r[4 * i + 1], drop = r[4 * i + 2], flags = r[4 * i + 3];
    if (!(flags & 1)) return "future";
    if (flags & 2) return "released";
    if (dev > 0 && host === 0 && drop === 0) {
      let live = 0;
      for (const c of kids.get(id)) { const f = r[4 * pos.get(c.id) + 3]; if ((f & 1) && !(f & 2)) live++; }
      return live >= 2 ? "shared" : "whole";
    }
    if (dev > 0) return "partial";
    if (host > 0) return "host";
    return "dropped";
  }
  function residencyOf(id, s) {
    const r = res[s], i = pos.get(id);
    return [r[4 * i], r[4 * i + 1], r[4 * i + 2]];
  }

  // ---- page skeleton -----------------------------------------------------------------------
  const app = document.getElementById("app");
  const header = html("header", {}, null, app);
  html("a", { href: "index.html" }, "◀ all problems", header);
  html("h1", {}, "problem " + D.index + (D.question ? ": " + D.question : ""), header);
  const facts = html("div", { class: "facts" }, null, header);
  const row = D.row || {};
  html("span", { class: row.solved ? "yes" : "no" }, row.solved ? "solved" : (row.oom ? "OOM" : "not solved"), facts);
  html("span", {}, "answer: " + fmt(row.answer), facts);
  for (const [k, label] of [["policy", "policy"], ["controller", "controller"], ["budget_tokens", "budget"],
    ["peak_device_tokens", "peak KV"], ["rehydrations", "rehydrations"], ["seconds", "seconds"]]) {
    if (row[k] !== undefined) html("span", {}, label + " " + fmt(row[k], 1), facts);
  }
  const main = html("div", { class: "main" }, null, app);
  const box = html("div", { class: "treebox", id: "treebox" }, null, main);
  const panel = html("div", { id: "panel" }, null, main);
  const footer = html("footer", {}, null, app);
  const controls = html("div", { class: "controls" }, null, footer);
  const prev = html("button", { id: "prev", title: "previous step (←)" }, "◀", controls);
  const slider = html("input", { id: "step", type: "range", min: 0, max: S - 1, value: S - 1, "aria-label": "step" }, null, controls);
  const next = html("button", { id: "next", title: "next step (→)" }, "▶", controls);
  const stepLabel = html("span", { id: "steplabel" }, "", controls);
  const legend = html("div", { class: "legend", id: "legend" }, null, footer);
  const chart = svg("svg", { id: "chart", height: 150 }, footer);
  const tip = html("div", { id: "tip" }, null, document.body);
  if (!D.residency && tree) html("div", { class: "note" }, "This run has no residency.jsonl: blocks show their residency at the end of the search.", footer);

  // ---- tree layout (top-down; collapsed subtrees show "+n") ------------------------------
  const treeSvg = svg("svg", { id: "tree" }, box);
  const edgeLayer = svg("g", { class: "edges" }, treeSvg);
  const nodeLayer = svg("g", { class: "nodes" }, treeSvg);
  const collapsed = new Set(); // nodes whose whole subtree is hidden
  const folded = new Set(); // nodes whose pruned (released) leaf children are hidden
  const MIN_GAP = BW + 8;
  let gapX = MIN_GAP;
  let layoutPos = new Map();
  let selected = null;
  let step = S - 1;

  const prunedLeaf = (c) => c.released && !kids.get(c.id).length;
  function shownKids(id) {
    if (collapsed.has(id)) return [];
    return folded.has(id) ? kids.get(id).filter((c) => !prunedLeaf(c)) : kids.get(id);
  }
  function hiddenBelow(id) { // nodes a "+n" badge stands for
    if (collapsed.has(id)) return subtreeSize.get(id) - 1;
    return folded.has(id) ? kids.get(id).filter(prunedLeaf).length : 0;
  }
  function computeLayout() {
    const out = new Map();
    let leaf = 0, depthMax = 0;
    function place(n, depth) {
      depthMax = Math.max(depthMax, depth);
      const cs = shownKids(n.id);
      let x;
      if (!cs.length) { x = leaf; leaf += hiddenBelow(n.id) ? 2 : 1; } // room for its badge
      else { const xs = cs.map((c) => place(c, depth + 1)); x = (xs[0] + xs[xs.length - 1]) / 2; }
      out.set(n.id, { x: x, depth: depth });
      return x;
    }
    roots.forEach((r) => place(r, 0));
    return { pos: out, leaves: leaf, depth: depthMax };
  }
  function visibleLeaves(id) { // leaves of id's subtree in the current layout
    const cs = shownKids(id);
    return cs.length ? cs.reduce((s, c) => s + visibleLeaves(c.id), 0) : 1;
  }
  function better(k, key) { // lexicographic: is key k larger than key?
    for (let i = 0; i < k.length; i++) if (k[i] !== key[i]) return k[i] > key[i];
    return false;
  }
  function autoCollapse(maxLeaves) {
    // until the leaves fit: collapse pruned subtrees, then fold pruned leaves away (most first),
    // then collapse live subtrees (deepest first); the best path always stays open
    for (let guard = 0; guard < 3 * N && computeLayout().leaves > maxLeaves; guard++) {
      const lay = computeLayout();
      let pick = null, key = null, how = null;
      for (const n of nodes) {
        const p = lay.pos.get(n.id);
        if (!p || collapsed.has(n.id) || !kids.get(n.id).length) continue;
        const pruned = folded.has(n.id) ? 0 : kids.get(n.id).filter(prunedLeaf).length;
        const closable = !best.has(n.id) && byId.has(n.parent);
        const options = [];
        if (closable && n.released) options.push([[3, p.depth, visibleLeaves(n.id)], "collapse"]);
        if (pruned >= 2) options.push([[2, pruned, p.depth], "fold"]);
        if (closable) options.push([[1, p.depth, visibleLeaves(n.id)], "collapse"]);
        for (const [k, h] of options) if (key === null || better(k, key)) { pick = n; key = k; how = h; }
      }
      if (pick === null) break;
      (how === "fold" ? folded : collapsed).add(pick.id);
    }
  }

  const elems = new Map(); // id -> {g, block, fr: [3 rects], badge}
  for (const n of nodes) {
    const g = svg("g", { class: "node", id: "node-" + n.id, "data-id": n.id }, nodeLayer);
    const block = svg("rect", { class: "block", width: BW, height: BH, rx: 2, stroke: best.has(n.id) ? "#000" : "#555",
      "stroke-width": best.has(n.id) ? 2 : 1, fill: COLOR.future }, g);
    if (n.released) block.setAttribute("stroke-dasharray", "3,2");
    const fr = [0, 1, 2].map((k) => svg("rect", { class: "frac", y: BH + 1, height: 3, width: 0,
      fill: [COLOR.whole, COLOR.host, COLOR.dropped][k] }, g));
    const marks = [];
    if (n.released) marks.push("✕");
    if (n.meta && n.meta.duplicate) marks.push("=");
    if (n.meta && n.meta.valid === false) marks.push("!");
    if (n.id === answerId) marks.push("★");
    if (marks.length) svg("text", { class: "mark", x: BW / 2, y: BH + 14, "text-anchor": "middle" }, g).textContent = marks.join("");
    const badge = svg("text", { class: "badge", x: BW + 2, y: 12, display: "none" }, g);
    const valueText = svg("text", { class: "value", x: BW / 2, y: BH + 25, "text-anchor": "middle", display: "none" }, g);
    valueText.textContent = n.value === null || n.value === undefined ? "" : n.value.toFixed(2);
    g.addEventListener("mouseenter", (ev) => showTip(n, ev));
    g.addEventListener("mousemove", moveTip);
    g.addEventListener("mouseleave", () => { tip.style.display = "none"; });
    g.addEventListener("click", (ev) => { ev.stopPropagation(); if (ev.target === badge) toggle(n.id); select(n.id); });
    elems.set(n.id, { g: g, block: block, fr: fr, badge: badge, value: valueText, edge: null });
  }
  for (const n of nodes) {
    if (!byId.has(n.parent)) continue;
    const e = svg("path", { class: "edge" + (best.has(n.id) && best.has(n.parent) ? " best" : "") }, edgeLayer);
    elems.get(n.id).edge = e;
  }

  function render() {
    const lay = computeLayout();
    gapX = Math.max(MIN_GAP, Math.min(64, (box.clientWidth - 40) / Math.max(1, lay.leaves)));
    const width = Math.max(box.clientWidth - 4, lay.leaves * gapX + 40);
    const gapY = Math.max(44, Math.min(110, (box.clientHeight - 66) / Math.max(1, lay.depth)));
    const height = Math.max(box.clientHeight - 4, lay.depth * gapY + 62);
    const x0 = (width - lay.leaves * gapX) / 2 + gapX / 2 - BW / 2;
    const values = gapX >= 30 && gapY >= 56; // room for each block's value under it
    treeSvg.setAttribute("width", width);
    treeSvg.setAttribute("height", height);
    layoutPos = new Map();
    for (const n of nodes) {
      const el = elems.get(n.id), p = lay.pos.get(n.id);
      if (!p) { el.g.setAttribute("display", "none"); if (el.edge) el.edge.setAttribute("display", "none"); continue; }
      const x = x0 + p.x * gapX, y = 14 + p.depth * gapY;
      layoutPos.set(n.id, [x, y]);
      el.g.removeAttribute("display");
      el.g.setAttribute("transform", "translate(" + x.toFixed(1) + "," + y.toFixed(1) + ")");
      el.value.setAttribute("display", values && el.value.textContent ? "inline" : "none");
      const hidden = hiddenBelow(n.id);
      el.badge.setAttribute("display", hidden ? "inline" : "none");
      el.badge.textContent = hidden ? "+" + hidden : "";
    }
    for (const n of nodes) {
      const el = elems.get(n.id);
      if (!el.edge || !layoutPos.has(n.id)) continue;
      const [px, py] = layoutPos.get(n.parent), [cx, cy] = layoutPos.get(n.id);
      const a = px + BW / 2, b = py + BH + 5, c = cx + BW / 2, d = cy, m = (b + d) / 2;
      el.edge.removeAttribute("display");
      el.edge.setAttribute("d", "M" + a + "," + b + "C" + a + "," + m + " " + c + "," + m + " " + c + "," + d);
    }
  }
  function toggle(id) {
    if (collapsed.has(id) || folded.has(id)) { collapsed.delete(id); folded.delete(id); }
    else if (kids.get(id).length) collapsed.add(id);
    render();
    if (selected !== null) select(selected);
  }

  // ---- node details ------------------------------------------------------------------------
  function marksOf(n) {
    const m = [];
    if (best.has(n.id)) m.push("best path");
    if (n.id === answerId) m.push("answer");
    if (n.released) m.push("pruned (released)");
    if (n.meta && n.meta.duplicate) m.push("duplicate state");
    if (n.meta && n.meta.valid === false) m.push("invalid" + (n.meta.reason ? ": " + n.meta.reason : ""));
    if (n.meta && n.meta.terminal) m.push("terminal");
    return m.join(", ") || "-";
  }
  function showTip(n, ev) {
    const [d, h, x] = residencyOf(n.id, step);
    const text = n.kind === "prompt" ? "(prompt, " + n.tokens + " tokens)" : n.text;
    tip.textContent = "#" + n.id + "  value " + fmt(n.value) + "  mean logprob " + fmt(n.mean_logprob) + "\n" +
      stateOf(n.id, step) + ": " + d + " device / " + h + " host / " + x + " dropped\n" +
      (text.length > 220 ? text.slice(0, 219) + "…" : text);
    tip.style.display = "block";
    moveTip(ev);
  }
  function moveTip(ev) {
    const w = tip.offsetWidth, hgt = tip.offsetHeight;
    tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - w - 6) + "px";
    tip.style.top = Math.min(ev.clientY + 14, window.innerHeight - hgt - 6) + "px";
  }
  function select(id) {
    if (selected !== null && elems.has(selected)) elems.get(selected).g.classList.remove("selected");
    selected = id;
    panel.textContent = "";
    if (id === null || !byId.has(id)) {
      html("p", { class: "hint" }, tree ? "Hover a block for its thought; click it for the details. " +
        "Drag the slider (or press ← →) to see where every block's KV was at each step." : "This problem has no saved tree (it did not run, or save_trees=false).", panel);
      legendPanel();
      return;
    }
    elems.get(id).g.classList.add("selected");
    const n = byId.get(id);
    const [d, h, x] = residencyOf(id, step);
    html("h2", {}, "#" + n.id + " · " + n.kind + " · depth " + n.depth, panel);
    const t = html("table", {}, null, panel);
    const rows = [["value", fmt(n.value)], ["mean logprob", fmt(n.mean_logprob)], ["tokens", fmt(n.tokens)],
      ["expansion", fmt(n.expansion)], ["marks", marksOf(n)], ["at this step", stateOf(id, step) + ": " + d + " device, " + h + " host, " + x + " dropped"],
      ["at the end", n.kv_device + " device, " + n.kv_host + " host, " + n.kv_dropped + " dropped"]];
    if (n.stop_reason) rows.push(["stop", n.stop_reason]);
    for (const [k, v] of rows) { const tr = html("tr", {}, null, t); html("td", {}, k, tr); html("td", {}, v, tr); }
    html("pre", { class: "text", id: "node-text" }, n.text, panel);
    if (kids.get(id).length) {
      const b = html("button", { id: "toggle" }, hiddenBelow(id) ? "show the " + hiddenBelow(id) + " hidden below" : "collapse subtree", panel);
      b.addEventListener("click", () => toggle(id));
    }
  }
  function legendPanel() {
    const p = html("p", { class: "hint" }, "Marks: ✕ pruned, = duplicate, ! invalid, ★ answer; thick outline and orange edges: the best path. " +
      "The bar under a block: device / host / dropped share of its tokens.", panel);
    return p;
  }

  // ---- memory chart ------------------------------------------------------------------------
  const stepIndex = (function () { // trace step value -> index of the first trace point at or after it
    const steps = trace.map((p) => p.step);
    return function (s) { let lo = 0, hi = steps.length - 1; while (lo < hi) { const m = (lo + hi) >> 1; if (steps[m] < s) lo = m + 1; else hi = m; } return Math.max(lo, 0); };
  })();
  const eventsAt = Array.from({ length: S }, () => []);
  (D.events || []).forEach((ev, k) => { const s = (D.event_steps || [])[k]; if (s !== undefined && trace.length) eventsAt[stepIndex(s)].push(ev); });
  const rehydAt = trace.map((p, i) => (i ? p.rehydrations - trace[i - 1].rehydrations : p.rehydrations || 0));
  let chartX = () => 0;
  function drawChart() {
    chart.textContent = "";
    const W = Math.max(footer.clientWidth - 24, 300), H = 150, L = 104, R = 12, T = 44, B = 18;
    chart.setAttribute("width", W);
    const keys = ["resident_tokens", "host_tokens", "peak_tokens"];
    let ymax = D.budget || 0;
    for (const p of trace) for (const k of keys) ymax = Math.max(ymax, p[k] || 0);
    ymax = Math.max(ymax, 1) * 1.05;
    chartX = (i) => L + (S > 1 ? (i / (S - 1)) * (W - L - R) : 0);
    const y = (v) => T + (1 - v / ymax) * (H - T - B);
    svg("line", { class: "axis", x1: L, y1: y(0), x2: W - R, y2: y(0) }, chart);
    svg("line", { class: "axis", x1: L, y1: T, x2: L, y2: y(0) }, chart);
    for (const v of [0, Math.round(ymax / 2), Math.round(ymax / 1.05)]) {
      svg("text", { class: "tick", x: L - 4, y: y(v) + 3, "text-anchor": "end" }, chart).textContent = v.toLocaleString("en");
    }
    svg("text", { class: "tick", x: W - R, y: H - 4, "text-anchor": "end" }, chart).textContent = "step (operation) →";
    if (D.budget) {
      svg("line", { x1: L, x2: W - R, y1: y(D.budget), y2: y(D.budget), stroke: "#c62828", "stroke-dasharray": "5,3" }, chart);
      svg("text", { class: "tick", x: W - R - 2, y: y(D.budget) - 3, "text-anchor": "end", fill: "#c62828" }, chart).textContent = "budget " + D.budget;
    }
    const series = [["peak_tokens", "#a5d6a7", "peak in op"], ["resident_tokens", "#2e7d32", "device"], ["host_tokens", "#7e57c2", "host"]];
    let lx = L;
    for (const [k, color, label] of series) {
      const pts = trace.map((p, i) => chartX(i).toFixed(1) + "," + y(p[k] || 0).toFixed(1)).join(" ");
      svg("polyline", { points: pts, fill: "none", stroke: color, "stroke-width": k === "peak_tokens" ? 1 : 1.8, class: "series-" + k }, chart);
      svg("rect", { x: lx, y: H - 8, width: 12, height: 3, fill: color }, chart);
      svg("text", { class: "tick", x: lx + 15, y: H - 4 }, chart).textContent = label + " tokens";
      lx += 110;
    }
    EVENT_LANES.forEach(([kind, color, label], lane) => {
      const ly = 3 + lane * 10;
      svg("text", { class: "lane", x: L - 4, y: ly + 8, "text-anchor": "end" }, chart).textContent = label;
      for (let i = 0; i < S; i++) {
        const n = kind === "rehydration" ? rehydAt[i] || 0 : eventsAt[i].filter((e) => e.kind === kind).length;
        if (!n) continue;
        const m = svg("rect", { class: "event event-" + kind, x: chartX(i) - 1, y: ly, width: 2.5, height: 8, fill: color }, chart);
        svg("title", {}, m).textContent = label + " × " + n + " at step " + i;
      }
    });
    svg("line", { class: "cursor", id: "cursor", y1: 0, y2: y(0) }, chart);
    const pick = (ev) => {
      const r = chart.getBoundingClientRect();
      const f = (ev.clientX - r.left - L) / Math.max(1, W - L - R);
      setStep(Math.round(Math.min(1, Math.max(0, f)) * (S - 1)));
    };
    chart.onmousedown = (ev) => { pick(ev); chart.onmousemove = (e) => { if (e.buttons) pick(e); }; };
  }

  // ---- the step ----------------------------------------------------------------------------
  function setStep(s) {
    step = Math.max(0, Math.min(S - 1, s | 0));
    slider.value = step;
    const counts = {};
    for (const n of nodes) {
      const st = stateOf(n.id, step), el = elems.get(n.id);
      counts[st] = (counts[st] || 0) + 1;
      const [d, h, x] = residencyOf(n.id, step);
      if (el.block.getAttribute("fill") !== COLOR[st]) el.block.setAttribute("fill", COLOR[st]);
      el.g.setAttribute("data-state", st);
      el.g.setAttribute("data-res", d + "/" + h + "/" + x);
      el.g.setAttribute("opacity", st === "future" ? 0.3 : 1);
      const total = Math.max(1, d + h + x);
      let off = 0;
      [d, h, x].forEach((v, k) => { const w = st === "released" || st === "future" ? 0 : (BW * v) / total; el.fr[k].setAttribute("x", off); el.fr[k].setAttribute("width", w); off += w; });
    }
    const p = trace[step] || {};
    const evs = eventsAt[step] || [];
    const kinds = {};
    for (const e of evs) kinds[e.kind] = (kinds[e.kind] || 0) + 1;
    if (rehydAt[step]) kinds.rehydration = rehydAt[step];
    const evText = Object.keys(kinds).map((k) => k.replace("_", " ") + (kinds[k] > 1 ? " ×" + kinds[k] : "")).join(", ");
    stepLabel.textContent = "step " + step + " / " + (S - 1) + (p.op ? " · " + p.op : "") +
      " · device " + fmt(p.resident_tokens) + " · host " + fmt(p.host_tokens) + " tokens · " +
      (changedAt[step] ? changedAt[step].size : 0) + " blocks changed" + (evText ? " · " + evText : "");
    legend.textContent = "";
    for (const [name, color, label] of STATES) {
      const item = html("span", { "data-state": name }, null, legend);
      html("i", { style: "background:" + color }, null, item);
      item.appendChild(document.createTextNode(label + " (" + (counts[name] || 0) + ")"));
    }
    const cur = document.getElementById("cursor");
    if (cur) { cur.setAttribute("x1", chartX(step)); cur.setAttribute("x2", chartX(step)); }
    if (selected !== null) select(selected);
  }

  slider.addEventListener("input", () => setStep(+slider.value));
  prev.addEventListener("click", () => setStep(step - 1));
  next.addEventListener("click", () => setStep(step + 1));
  document.addEventListener("keydown", (ev) => {
    if (document.activeElement === slider) return; // the slider steps itself (its input event)
    if (ev.key === "ArrowLeft") { setStep(step - 1); ev.preventDefault(); }
    else if (ev.key === "ArrowRight") { setStep(step + 1); ev.preventDefault(); }
    else if (ev.key === "Home") setStep(0);
    else if (ev.key === "End") setStep(S - 1);
  });
  box.addEventListener("click", () => select(null));
  window.addEventListener("resize", () => { render(); drawChart(); setStep(step); });

  const hashStep = /(?:^#|&)step=(\d+)/.exec(location.hash);
  const hashNode = /(?:^#|&)node=(\d+)/.exec(location.hash);
  drawChart();
  setStep(hashStep ? +hashStep[1] : S - 1); // the footer (chart, legend) first: the tree gets the room left
  autoCollapse(Math.max(8, Math.floor((box.clientWidth - 40) / MIN_GAP)));
  render();
  select(hashNode ? +hashNode[1] : null);
  // for tests and the console: the step shown, each block's state, and the layout
  window.arborView = { setStep: setStep, step: () => step, stateOf: (id) => stateOf(id, step), residency: (id) => residencyOf(id, step), collapsed: collapsed, folded: folded, best: Array.from(best), render: render };
})();
