// nbdiff's notebook view: paired trees, tensor panel, stack panel and replay.
// One self-contained ES module (anywidget loads it from a blob: URL, so no imports),
// no network, no bundler. The tree is virtualised: only the rows in view exist in
// the DOM, so 10,000 rows draw as fast as 50.

const ROW = 22; // px, fixed row height for virtual scrolling

function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "class") el.className = v;
    else if (k === "style") el.style.cssText = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v);
  }
  for (const c of children) if (c != null) el.append(c);
  return el;
}

const PLAY_MS = 350; // the slowest step while replay plays
const PLAY_TO_STOP_MS = 2500; // about how long play takes to reach the next own error, however far

// Icons drawn as SVG: glyphs such as ⓘ and ⏵ are empty boxes where the fonts lack them (Debian's default).
const ICONS = {
  info: '<circle cx="8" cy="8" r="6.5" fill="none" stroke="currentColor" stroke-width="1.4"/><rect x="7.2" y="7" width="1.6" height="5" fill="currentColor"/><circle cx="8" cy="4.8" r="1" fill="currentColor"/>',
  play: '<path d="M4.5 3 L13 8 L4.5 13 Z" fill="currentColor"/>',
  pause: '<rect x="4" y="3" width="3" height="10" fill="currentColor"/><rect x="9" y="3" width="3" height="10" fill="currentColor"/>',
};

function icon(name) {
  const span = document.createElement("span");
  span.className = `nbd-icon nbd-icon-${name}`;
  span.innerHTML = `<svg viewBox="0 0 16 16" width="14" height="14" aria-hidden="true">${ICONS[name]}</svg>`;
  return span;
}

function fmt(x) {
  if (x === null || x === undefined) return "–";
  if (typeof x !== "number") return String(x);
  if (x >= 1e299) return "inf";
  if (x === 0) return "0";
  const a = Math.abs(x);
  return a >= 1e4 || a < 1e-3 ? x.toExponential(2) : x.toPrecision(4).replace(/\.?0+$/, "");
}

// Status classes the filter and the legend use; "none" rows compared nothing.
const FILTERS = [
  ["all", "all rows", () => true],
  ["own", "own error (blamed, local)", (n) => n.status === "blamed" || n.status === "local"],
  ["fail", "diverging (own or inherited)", (n) => ["blamed", "local", "inherited"].includes(n.status)],
  ["pass", "passing", (n) => n.status === "ok"],
  ["framework", "framework difference (not a bug)", (n) => n.status === "framework"],
  ["explained", "over tolerance, explained (inherited in a result that agrees)", (n) => n.status === "explained"],
  ["unpaired", "unpaired", (n) => n.status === "unpaired"],
  ["none", "not compared", (n) => n.status === "none"],
];
const LEGEND =
  "base: the reference model; raw: the one checked against it (the port). " +
  "error / tol: the worst tensor's error over what the tolerance allows; above 1 fails. " +
  "(local x): the error the layer adds on identical inputs. Red: own error; orange: inherited from " +
  "earlier layers; blue: a known framework difference, verified (not the port's bug); pale yellow: over " +
  "tolerance by inherited error in a result that agrees (see its warnings); green: passes; " +
  "grey: unpaired or not compared.";
const NOTHING_OWN = "nothing of its own to compare (no tensor only it holds): the calls under it are compared";

// A tensor's name as a reader says it: in[0] "input", out[1] "output 2", proj:in[0] "proj's input"
// (the recorded name stays in the title, and in search).
function shownName(name) {
  const m = /^(?:(.+):)?(in|out)(?:\[(\d+)\])?$/.exec(name);
  if (!m) return name;
  const k = m[3] === undefined ? 0 : Number(m[3]);
  const what = (m[2] === "in" ? "input" : "output") + (k > 0 ? ` ${k + 1}` : "");
  if (!m[1]) return what;
  return m[1] === "given" ? `given ${what}` : `${m[1]}'s ${what}`;
}

function colour(node) {
  const r = node.status === "blamed" || node.status === "local" ? node.local ?? node.ratio : node.ratio;
  if (node.status === "unpaired" || node.status === "none") return "var(--nbd-unpaired)";
  if (node.status === "ok" || r === null) return "var(--nbd-ok)";
  const k = Math.min(1, Math.log10(Math.max(r, 1)) / 4); // 1x .. 10^4x
  // --nbd-tint thins every tint in a dark theme, so that light text keeps 4.5:1 against it.
  const tint = (rgb, a) => `rgb(${rgb} / calc(var(--nbd-tint, 1) * ${a.toFixed(3)}))`;
  if (node.status === "inherited") return tint("240 173 78", 0.25 + 0.5 * k);
  if (node.status === "framework") return tint("91 192 222", 0.45);
  if (node.status === "explained") return tint("240 210 120", 0.3);
  return tint("217 83 79", 0.35 + 0.55 * k);
}

// The step chart: worst error over tolerance per step (log scale), drawn as SVG from the model's
// data, so it is instant, follows the theme and looks the same in the HTML report.
const SERIES = [
  ["outputs", "forward", "#337ab7"],
  ["loss", "forward", "#8e44ad"],
  ["gradients", "backward", "#e67e22"],
  ["updates", "optimizer", "#27ae60"],
];

function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  for (const c of children) if (c != null) el.append(c);
  return el;
}

function stepChart(rows, first, onPick) {
  const W = 520, H = 150, L = 44, R = 8, T = 8, B = 22;
  const vals = rows.flatMap((r) => SERIES.map(([k]) => r[k]).filter((v) => v !== null && v !== undefined));
  if (rows.length < 2 || !vals.length) return null;
  const lo = Math.floor(Math.log10(Math.max(1e-6, Math.min(1, ...vals.map((v) => Math.max(v, 1e-6))))));
  const hi = Math.ceil(Math.log10(Math.max(10, ...vals.filter((v) => v < 1e299))));
  const steps = rows.map((r) => r.step);
  const s0 = Math.min(...steps), s1 = Math.max(...steps);
  const x = (s) => L + ((s - s0) / Math.max(1, s1 - s0)) * (W - L - R);
  const y = (v) => T + (1 - (Math.log10(Math.min(Math.max(v, 1e-6), 10 ** hi)) - lo) / (hi - lo)) * (H - T - B);
  const parts = [];
  for (let e = lo; e <= hi; e++) {
    parts.push(svg("line", { x1: L, x2: W - R, y1: y(10 ** e), y2: y(10 ** e), class: "nbd-grid" }));
    parts.push(svg("text", { x: L - 4, y: y(10 ** e) + 3, "text-anchor": "end", class: "nbd-axis" }, `1e${e}`));
  }
  parts.push(svg("line", { x1: L, x2: W - R, y1: y(1), y2: y(1), class: "nbd-limit" }));
  if (first !== null) parts.push(svg("line", { x1: x(first), x2: x(first), y1: T, y2: H - B, class: "nbd-first" }));
  const tick = Math.max(1, Math.ceil(rows.length / 10));
  rows.forEach((r, i) => {
    // A decode loop's axis reads token positions: where a late (position-dependent) bug starts.
    if (i % tick === 0) parts.push(svg("text", { x: x(r.step), y: H - 6, "text-anchor": "middle", class: "nbd-axis" }, String(r.position ?? r.step)));
  });
  const legend = [];
  const points = [];
  for (const [key, phase, colour] of SERIES) {
    const pts = rows.filter((r) => r[key] !== null && r[key] !== undefined);
    if (!pts.length) continue;
    parts.push(svg("polyline", { points: pts.map((r) => `${x(r.step)},${y(r[key])}`).join(" "), fill: "none", stroke: colour, "stroke-width": 1.5 }));
    for (const r of pts) {
      const what = `step ${r.step}${r.position === undefined ? "" : ` (token position ${r.position})`} ${key}: ${fmt(r[key])}x tolerance`;
      const dot = svg("circle", { cx: x(r.step), cy: y(r[key]), r: 4, fill: colour, class: "nbd-point", "data-step": r.step, "data-phase": phase, "data-series": key, tabindex: "-1", role: "button", "aria-label": what },
        svg("title", {}, what));
      dot.addEventListener("click", () => onPick(r.step, phase));
      points.push(dot);
      parts.push(dot);
    }
    legend.push(h("span", { class: "nbd-key", style: `color:${colour}` }, `● ${key}`));
  }
  const per = rows.some((r) => r.position !== undefined) ? "decode step (axis: token position)" : "step";
  // One Tab stop for every point (roving tabindex): arrows move along the steps, Enter picks.
  points.sort((a, b) => a.dataset.step - b.dataset.step);
  const start = Math.max(0, points.findIndex((p) => Number(p.dataset.step) === first));
  if (points.length) points[start].setAttribute("tabindex", "0");
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: "nbd-chart" }, ...parts);
  // ← → move along one series (step by step), ↑ ↓ pick another series at the same step.
  const series = SERIES.map(([key]) => key);
  const along = (p) => points.filter((q) => q.dataset.series === p.dataset.series);
  chart.addEventListener("keydown", (ev) => {
    const cur = ev.target;
    if (points.indexOf(cur) < 0) return;
    const line = along(cur);
    const i = line.indexOf(cur);
    let next;
    if (ev.key === "ArrowRight" || ev.key === "ArrowLeft") next = line[Math.max(0, Math.min(line.length - 1, i + (ev.key === "ArrowRight" ? 1 : -1)))];
    else if (ev.key === "Home" || ev.key === "End") next = ev.key === "Home" ? line[0] : line[line.length - 1];
    else if (ev.key === "ArrowUp" || ev.key === "ArrowDown") {
      // The nearest other series with a point at this step, in the legend's order.
      const here = points.filter((q) => q.dataset.step === cur.dataset.step);
      here.sort((a, b) => series.indexOf(a.dataset.series) - series.indexOf(b.dataset.series));
      const j = here.indexOf(cur) + (ev.key === "ArrowDown" ? 1 : -1);
      next = here[(j + here.length) % here.length];
    }
    if (next) {
      points.forEach((p) => p.setAttribute("tabindex", p === next ? "0" : "-1"));
      next.focus();
    } else if (ev.key === "Enter" || ev.key === " ") {
      onPick(Number(ev.target.dataset.step), ev.target.dataset.phase);
    } else return;
    ev.preventDefault();
    ev.stopPropagation();
  });
  return h("div", { class: "nbd-steps" }, h("div", { class: "nbd-steps-title" }, `worst error / tolerance per ${per} (click a point, or Tab to it and use the arrows and Enter) `, ...legend), chart);
}

function labUrl(relpath) {
  // The kernel runs in the notebook's folder: the notebook's own URL gives that folder. Notebook 7
  // opens files in its own editor (/edit/...), JupyterLab in a tab (/lab/tree/...).
  const m = location.pathname.match(/^(.*?)\/(lab(?:\/workspaces\/[^/]+)?\/tree|notebooks|tree)\/(.*)$/);
  if (!m) return null;
  const dir = decodeURIComponent(m[3]).split("/").slice(0, -1).join("/");
  const path = dir ? dir + "/" + relpath : relpath;
  const lab = m[2].startsWith("lab");
  return { path, lab, href: `${m[1]}/${lab ? "lab/tree" : "edit"}/${encodeURI(path)}`, label: lab ? "open in JupyterLab" : "open in the editor" };
}

function openAtLine(a, model, link, line) {
  // Neither front end takes a line in its URL. JupyterLab's own link handler opens the file in a tab
  // and moves the cursor to "#line=N" (0-based). Notebook 7 opens files in a new browser tab: once
  // that tab's editor has the file, move its cursor there (same origin). Either way, without those
  // the plain link still opens the file.
  const handler = link.lab && model.widget_manager?.rendermime?.linkHandler;
  if (handler) return handler.handleLink(a, link.path, `#line=${line - 1}`);
  a.addEventListener("click", (e) => {
    const tab = window.open(a.href, "_blank");
    if (!tab) return;
    e.preventDefault();
    const started = performance.now();
    const poll = () => {
      const view = tab.closed ? null : editorView(tab.document);
      if (view && view.state.doc.lines >= line) return goToLine(view, line);
      if (!tab.closed && performance.now() - started < 20000) setTimeout(poll, 100);
    };
    poll();
  });
}

function editorView(doc) {
  // CodeMirror 6 keeps its view on the content element: cmTile since 6.39, cmView before.
  const content = doc.querySelector(".cm-content");
  const tile = content && (content.cmTile || content.cmView);
  return tile ? tile.view || tile.rootView?.view || null : null;
}

function goToLine(view, line) {
  view.dispatch({ selection: { anchor: view.state.doc.line(line).from }, scrollIntoView: true });
  view.focus();
}

// Error pictures: histogram of log10 |raw - base| and the max-pooled error map, from the panel's data.
const MAGMA = [[0, 0, 4], [59, 15, 112], [140, 41, 129], [222, 73, 104], [254, 159, 109], [252, 253, 191]];

function magma(level) {
  const t = (level / 255) * (MAGMA.length - 1);
  const i = Math.min(MAGMA.length - 2, Math.floor(t));
  const f = t - i;
  return MAGMA[i].map((c, k) => Math.round(c + f * (MAGMA[i + 1][k] - c)));
}

function histogram(p) {
  const W = 300, H = 130, L = 34, R = 6, T = 16, B = 28;
  const top = Math.max(1, ...p.counts);
  const bw = (W - L - R) / p.counts.length;
  const y = (c) => H - B - (c / top) * (H - T - B);
  const x = (e) => L + ((e - p.lo) / (p.hi - p.lo)) * (W - L - R);
  const parts = [svg("text", { x: L, y: 11, class: "nbd-axis" }, `|raw − base|: ${p.total - p.zeros - p.nonfinite} differ, ${p.zeros} equal${p.masked ? ` (${p.masked} masked alike)` : ""}${p.nonfinite ? `, ${p.nonfinite} NaN/Inf apart` : ""}`)];
  p.counts.forEach((c, i) => {
    if (c) parts.push(svg("rect", { x: L + i * bw, y: y(c), width: Math.max(1, bw - 1), height: H - B - y(c), class: p.passed ? "nbd-bar nbd-bar-ok" : "nbd-bar" }, svg("title", {}, `${c} elements`)));
  });
  for (let e = Math.ceil(p.lo); e <= Math.floor(p.hi); e++) {
    parts.push(svg("line", { x1: x(e), x2: x(e), y1: H - B, y2: H - B + 3, class: "nbd-grid" }));
    parts.push(svg("text", { x: x(e), y: H - B + 13, "text-anchor": "middle", class: "nbd-axis" }, `1e${e}`));
  }
  parts.push(svg("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "nbd-grid" }));
  parts.push(svg("text", { x: L - 4, y: T + 4, "text-anchor": "end", class: "nbd-axis" }, String(top)));
  return svg("svg", { class: "nbd-hist", viewBox: `0 0 ${W} ${H}`, width: W, height: H }, ...parts);
}

function errorMap(p) {
  const canvas = h("canvas", { class: "nbd-map", width: String(p.cols), height: String(p.rows), title: `error map: rows × last dimension of ${JSON.stringify(p.shape)}, max-pooled to ${p.rows}×${p.cols}; darker is smaller, cyan is NaN/Inf` });
  const ctx = canvas.getContext("2d");
  if (ctx) {
    const img = ctx.createImageData(p.cols, p.rows);
    p.cells.forEach((v, i) => {
      const [r, g, b] = v < 0 ? [0, 0, 0] : v > 255 ? [0, 255, 255] : magma(v);
      img.data.set([r, g, b, v < 0 ? 0 : 255], i * 4); // equal elements stay transparent: the theme shows
    });
    ctx.putImageData(img, 0, 0);
  }
  // The range is the finite differences'; NaN/Inf apart are drawn in cyan, and said so with their count.
  const differ = p.total - p.zeros - p.nonfinite;
  const range = differ ? `${fmt(10 ** p.lo)} … ${fmt(10 ** p.hi)}` : "no finite difference";
  const apart = p.nonfinite ? ` · cyan: ${p.nonfinite} NaN/Inf apart` : "";
  const masked = p.masked ? ` · ${p.masked} masked alike (no error)` : "";
  return h("div", { class: "nbd-mapbox" }, h("div", { class: "nbd-axis-html" }, `error map · ${range}${apart}${masked}`), canvas);
}

function render({ model, el }) {
  const started = performance.now();
  let clickedAt = null; // for the click-to-panel time, kept in el.dataset.nbdClickMs
  let plotWait = null; // the same click, until its pictures are drawn (el.dataset.nbdPlotMs)
  const nodes = () => model.get("nodes");
  const kids = new Map();
  const collapsed = new Set();
  let visible = [];
  let replayAt = -1;

  const summary = h("div", { class: "nbd-summary" });
  // Only the entries some row has: a "framework difference" entry in a run with none listed nothing.
  const present = FILTERS.filter(([v, , pass], i) => i === 0 || v === "own" || nodes().some(pass));
  const filter = h("select", { class: "nbd-filter", title: LEGEND }, ...present.map(([v, label]) => h("option", { value: v }, label)));
  // A diverging result opens on the rows with their own error (and their ancestors): the inherited
  // rows downstream of a bug are most of a deep model's red. An agreeing one shows every row.
  filter.value = nodes().some(FILTERS[1][2]) ? "own" : "all";
  const search = h("input", { type: "search", class: "nbd-search", placeholder: "search layers" });
  const slider = h("input", { type: "range", class: "nbd-slider", min: "0", max: "0", value: "0" });
  const replayLabel = h("span", { class: "nbd-replay-label" });
  const btn = (text, title, fn) => h("button", { class: "nbd-btn", title, "aria-label": title, onclick: fn, tabindex: "-1" }, text);
  let playing = null; // the timer while replay plays
  const playBtn = btn(icon("play"), "play: go through the events in execution order, stopping at the next one with its own error (space)", () => togglePlay());
  playBtn.classList.add("nbd-play");
  const jumpLabel = h("span", { class: "nbd-jump-label", "aria-live": "polite" });
  const toolbar = h(
    "div",
    { class: "nbd-toolbar" },
    h("label", { title: LEGEND }, "show ", filter),
    search,
    btn("↑", "previous divergence (p)", () => jump(-1)),
    btn("↓", "next divergence (n)", () => jump(1)),
    jumpLabel,
    btn("⊞", "expand all", () => setAll(false)),
    btn("⊟", "collapse all", () => setAll(true)),
    btn("⤢", "wide: the tree takes the full width and most of the window's height, the panel goes below it", () => toggleWide()),
    h("span", { class: "nbd-legend", title: LEGEND }, icon("info")),
    h(
      "span",
      { class: "nbd-replay" },
      btn("«", "first event", () => replay(0)),
      btn("⇤", "start of this phase, or of the one before", () => phaseJump(-1)),
      btn("‹", "previous event", () => replay(replayAt - 1)),
      playBtn,
      slider,
      btn("›", "next event", () => replay(replayAt + 1)),
      btn("⇥", "start of the next phase (forward, backward, optimizer, next step)", () => phaseJump(1)),
      btn("»", "last event", () => replay(model.get("order").length - 1)),
      replayLabel,
    ),
  );
  const header = h(
    "div",
    { class: "nbd-row nbd-header" },
    h("span", { class: "nbd-cell nbd-base", title: "base: the reference model, whose results count as right" }, "base (reference)"),
    h("span", { class: "nbd-cell nbd-raw", title: "raw: the model checked against base (the port)" }, "raw (port)"),
    h("span", { class: "nbd-cell nbd-err" }, "error / tol"),
  );
  const spacer = h("div", { class: "nbd-spacer" });
  const rows = h("div", { class: "nbd-rows" });
  const scroller = h("div", { class: "nbd-scroll" }, spacer, rows);
  // Focusable, and Lumino (JupyterLab, Notebook 7) leaves keys pressed in here alone.
  const tree = h("div", { class: "nbd-tree", tabindex: "0", "data-lm-suppress-shortcuts": "true" }, header, scroller);
  const panel = h("div", { class: "nbd-panel" }, h("div", { class: "nbd-hint" }, "Click a row to see its tensors."));
  const stack = h("div", { class: "nbd-stack" });
  const plotBox = h("div", { class: "nbd-plots" });
  const source = h("div", { class: "nbd-source" });
  const side = h("div", { class: "nbd-side" }, panel, stack, source);
  // The toolbar's buttons are one Tab stop (roving tabindex): arrows move between them.
  const buttons = [...toolbar.querySelectorAll("button")];
  buttons[0].setAttribute("tabindex", "0");
  toolbar.setAttribute("role", "toolbar");
  toolbar.addEventListener("keydown", (ev) => {
    const i = buttons.indexOf(ev.target);
    const to = i < 0 ? undefined : { ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: buttons.length - 1 }[ev.key];
    if (to === undefined) return;
    const next = buttons[(to + buttons.length) % buttons.length];
    buttons.forEach((b) => b.setAttribute("tabindex", b === next ? "0" : "-1"));
    next.focus();
    ev.preventDefault();
  });
  const firstNode = nodes()[model.get("first")];
  const chart = stepChart(model.get("steps") || [], firstNode ? firstNode.step : null, (step, phase) => {
    const group = nodes().find((n) => n.event === -1 && n.step === step && n.phase === phase);
    if (group) {
      clickedAt = performance.now();
      select(group.id);
      // A step whose rows the filter hides (no own error there): show every row rather than nothing.
      if (!visible.some((n) => n.id === group.id)) {
        filter.value = "all";
        reveal(group.id);
      }
    } else {
      showSummarised(step);
    }
  });

  // A step whose events were not kept (memory stays bounded): its worst errors, as the chart has them,
  // and how to open it.
  function showSummarised(step) {
    const r = (model.get("steps") || []).find((x) => x.step === step);
    if (!r) return;
    const cells = [["model outputs", r.outputs], ["loss", r.loss], ["gradients", r.gradients], ["updates", r.updates]]
      .filter(([, v]) => v !== null && v !== undefined)
      .map(([k, v]) => h("tr", v > 1 ? { class: "nbd-differs" } : {}, h("td", {}, k), h("td", {}, `${fmt(v)}x`)));
    panel.replaceChildren(
      h("div", { class: "nbd-title" }, `step ${step}${r.position === undefined ? "" : ` (token position ${r.position})`} · summarised`),
      h(
        "table",
        { class: "nbd-args nbd-settings nbd-summarised", title: "the step's worst error over its tolerance, per kind of tensor" },
        h("tr", {}, h("th", {}, "worst error"), h("th", {}, "/ tolerance")),
        ...cells,
      ),
      h(
        "div",
        { class: "nbd-hint" },
        `Its events were not kept, so that memory stays bounded: the first steps, the first failing one and two on either ` +
          `side of it are. To open this one, run again with keep_steps=${step + 1} (%%modeldiff … --keep-steps ${step + 1}).`,
      ),
    );
    stack.replaceChildren();
    source.replaceChildren();
  }
  const root = h("div", { class: "nbd", tabindex: "-1", "data-lm-suppress-shortcuts": "true" }, summary, chart, toolbar, h("div", { class: "nbd-main" }, tree, side));
  el.append(root);
  // "t" anywhere in the view (outside a text field) goes to the tree; Escape on the view itself
  // (the tree's Escape lands there) hands focus back to the notebook, in command mode.
  root.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape" && ev.target === root) {
      const notebook = root.closest(".jp-Notebook");
      if (notebook) {
        notebook.focus();
        ev.preventDefault();
      }
      return;
    }
    if (ev.key !== "t" || ev.target.closest("input, select, textarea") || ev.ctrlKey || ev.metaKey || ev.altKey) return;
    tree.focus();
    ev.preventDefault();
  });
  // The view keeps JupyterLab's command-mode keys (arrows, a, b, d d) from acting on the notebook
  // while it has focus; the save key is the user's wherever focus is: lifted for that one event.
  // On the window, before anything: Notebook 7 reads its shortcuts as the event goes down.
  const saveKey = (ev) => {
    if (!(ev.ctrlKey || ev.metaKey) || ev.altKey || ev.key.toLowerCase() !== "s" || !root.contains(ev.target)) return;
    const held = [];
    for (let e = ev.target; e && e !== root.parentElement; e = e.parentElement) {
      if (e.hasAttribute("data-lm-suppress-shortcuts")) held.push(e), e.removeAttribute("data-lm-suppress-shortcuts");
    }
    setTimeout(() => held.forEach((e) => e.setAttribute("data-lm-suppress-shortcuts", "true")), 0);
  };
  window.addEventListener("keydown", saveKey, true);

  function index() {
    kids.clear();
    for (const n of nodes()) (kids.get(n.parent) ?? kids.set(n.parent, []).get(n.parent)).push(n);
  }

  function keep() {
    // Rows shown by the filters: matches plus their ancestors.
    const q = search.value.trim().toLowerCase();
    const pass = FILTERS.find(([v]) => v === filter.value)[2];
    if (!q && filter.value === "all") return null;
    const all = nodes();
    const shown = new Set();
    for (const n of all) {
      const hit = pass(n) && (!q || `${n.base} ${n.raw} ${n.base_type} ${n.raw_type}`.toLowerCase().includes(q));
      if (!hit || n.event === -1) continue;
      for (let p = n; p && !shown.has(p.id); p = all[p.parent]) shown.add(p.id);
    }
    return shown;
  }

  function flatten() {
    const shown = keep();
    visible = [];
    const walk = (parent) => {
      for (const n of kids.get(parent) ?? []) {
        if (shown && !shown.has(n.id)) continue;
        visible.push(n);
        if (!collapsed.has(n.id)) walk(n.id);
      }
    };
    walk(-1);
    spacer.style.height = `${visible.length * ROW}px`;
    draw();
  }

  function nothingShown() {
    const q = search.value.trim();
    const what = [filter.value !== "all" ? `the filter "${filter.selectedOptions[0].textContent}"` : "", q ? `the search "${q}"` : ""].filter(Boolean).join(" and ");
    return h(
      "div",
      { class: "nbd-empty" },
      `No row matches ${what}. `,
      h("button", { class: "nbd-jump", onclick: () => ((search.value = ""), (filter.value = "all"), flatten()) }, "show every row"),
    );
  }

  function draw() {
    const top = scroller.scrollTop;
    // Before the output area lays the view out, clientHeight is 0: draw a full box's worth.
    const height = scroller.clientHeight || 420;
    const first = Math.max(0, Math.floor(top / ROW) - 10);
    const last = Math.min(visible.length, Math.ceil((top + height) / ROW) + 10);
    const blamed = model.get("first");
    const selected = model.get("selected");
    const out = [];
    for (let i = first; i < last; i++) {
      const n = visible[i];
      const hasKids = kids.has(n.id);
      const twisty = hasKids ? (collapsed.has(n.id) ? "▸" : "▾") : " ";
      const holdsBlamed = hasKids && collapsed.has(n.id) && blamed >= 0 && isAncestor(n.id, blamed);
      // A row with nothing of its own to compare (a backward root, a container): a dash, said on hover.
      const err =
        n.status === "none"
          ? "–"
          : n.event < 0
            ? fmt(n.ratio)
            : n.local !== null
              ? `${fmt(n.ratio)} (local ${fmt(n.local)})`
              : fmt(n.ratio);
      const row = h(
        "div",
        {
          class: `nbd-row nbd-${n.status}${n.id === selected ? " nbd-selected" : ""}${n.event === -1 ? " nbd-group" : ""}`,
          style: `top:${i * ROW}px;background:${colour(n)}`,
          dataset: { id: n.id },
          title: `${n.base_type} ~ ${n.raw_type}`,
        },
        h(
          "span",
          { class: "nbd-cell nbd-base", style: `text-indent:${n.depth * 14}px` }, // indent inside: every row's columns line up
          h("span", { class: "nbd-twisty", dataset: { toggle: n.id } }, twisty),
          n.event === -1 ? n.label : n.base || (n.event === -2 ? "—" : "<root>"),
          n.event === -1 ? null : h("small", {}, " " + n.base_type),
          holdsBlamed ? h("span", { class: "nbd-holds", title: "the blamed row is inside" }, " ●") : null,
        ),
        h("span", { class: "nbd-cell nbd-raw" }, n.event === -1 ? "" : n.raw || (n.event === -2 ? "—" : "<root>"), n.event === -1 ? null : h("small", {}, " " + n.raw_type)),
        h(
          "span",
          { class: "nbd-cell nbd-err", title: n.status === "none" && n.event >= 0 ? NOTHING_OWN : "" },
          n.event === -2 ? "unpaired" : n.status === "blamed" ? `◀ ${err}` : err,
        ),
      );
      out.push(row);
    }
    rows.replaceChildren(...out, ...(visible.length ? [] : [nothingShown()]));
  }

  function isAncestor(a, id) {
    const all = nodes();
    for (let p = all[id] && all[all[id].parent]; p; p = all[p.parent]) if (p.id === a) return true;
    return false;
  }

  function setAll(collapse) {
    collapsed.clear();
    // Every fold, the steps' and phases' too (an optimizer phase is one flat list of hundreds of rows).
    if (collapse) for (const n of nodes()) if (kids.has(n.id)) collapsed.add(n.id);
    const sel = model.get("selected");
    if (sel >= 0 && !collapse) return reveal(sel); // expanded: the selected row is brought into view
    flatten();
  }

  // Next/previous row with its own error (or, when none has, any diverging row), in tree order.
  function jump(dir) {
    const all = nodes();
    const own = FILTERS[1][2];
    // Rows, not the step and phase rows that hold them.
    let targets = all.filter((n) => n.event !== -1 && own(n));
    if (!targets.length) targets = all.filter((n) => n.event !== -1 && FILTERS[2][2](n));
    if (!targets.length) return;
    const pos = treeOrder();
    targets.sort((a, b) => pos.get(a.id) - pos.get(b.id));
    const cur = pos.get(model.get("selected")) ?? -1;
    const ahead = dir > 0 ? targets.find((n) => pos.get(n.id) > cur) : [...targets].reverse().find((n) => pos.get(n.id) < cur);
    const next = ahead ?? (dir > 0 ? targets[0] : targets[targets.length - 1]);
    const kind = targets.some(own) ? "own error" : "divergence";
    jumpLabel.textContent = `${kind === "own error" ? "event" : kind} ${targets.indexOf(next) + 1} of ${targets.length}${kind === "own error" ? " with its own error" : ""}${ahead ? "" : dir > 0 ? " (from the top)" : " (from the end)"}`;
    clickedAt = performance.now();
    select(next.id);
    tree.focus({ preventScroll: true }); // the arrows go on from here
  }

  function treeOrder() {
    const pos = new Map();
    const walk = (parent) => {
      for (const n of kids.get(parent) ?? []) {
        pos.set(n.id, pos.size);
        walk(n.id);
      }
    };
    walk(-1);
    return pos;
  }

  function reveal(id) {
    const all = nodes();
    for (let p = all[id] && all[all[id].parent]; p; p = all[p.parent]) collapsed.delete(p.id);
    flatten();
    const i = visible.findIndex((n) => n.id === id);
    if (i >= 0 && (i * ROW < scroller.scrollTop || (i + 1) * ROW > scroller.scrollTop + scroller.clientHeight)) {
      scroller.scrollTop = Math.max(0, i * ROW - scroller.clientHeight / 3);
    }
    draw();
  }

  function select(id) {
    if (id < 0) return;
    model.set("selected", id);
    model.save_changes();
    reveal(id);
  }

  function label() {
    const order = model.get("order");
    const n = nodes()[model.get("selected")];
    const at = n ? order.indexOf(n.id) : -1;
    replayLabel.textContent = n ? `${at >= 0 ? `event ${at + 1} of ${order.length}` : "–"} · step ${n.step} ${n.phase}` : "";
  }

  function replay(i) {
    const order = model.get("order");
    if (!order.length) return;
    replayAt = Math.max(0, Math.min(order.length - 1, i));
    slider.value = String(replayAt);
    select(order[replayAt]);
  }

  function toggleWide() {
    root.classList.toggle("nbd-wide");
    // More rows fit, and the selected row must stay in view in the new box.
    requestAnimationFrame(() => (model.get("selected") >= 0 ? reveal(model.get("selected")) : draw()));
  }

  function togglePlay() {
    if (playing !== null) {
      clearInterval(playing);
      playing = null;
      playBtn.replaceChildren(icon("play"));
      el.dataset.nbdPlaying = "0";
      return;
    }
    playBtn.replaceChildren(icon("pause"));
    el.dataset.nbdPlaying = "1";
    // As fast as it takes to reach the next own error in about PLAY_TO_STOP_MS, never slower than PLAY_MS.
    const order = model.get("order");
    let stop = replayAt + 1;
    while (stop < order.length - 1 && !FILTERS[1][2](nodes()[order[stop]])) stop++;
    const delay = Math.max(16, Math.min(PLAY_MS, PLAY_TO_STOP_MS / Math.max(1, stop - replayAt)));
    el.dataset.nbdPlayMs = delay.toFixed(0);
    playing = setInterval(() => {
      const order = model.get("order");
      if (replayAt >= order.length - 1) return togglePlay();
      replay(replayAt + 1);
      if (FILTERS[1][2](nodes()[order[replayAt]])) togglePlay(); // an event with its own error: look here
    }, delay);
  }

  function phaseJump(dir) {
    // Events come step by step, phase by phase: a (step, phase) change starts a new phase.
    const order = model.get("order");
    const all = nodes();
    if (!order.length) return;
    const key = (i) => `${all[order[i]].step} ${all[order[i]].phase}`;
    let i = Math.max(0, replayAt);
    if (dir > 0) {
      const cur = key(i);
      while (i < order.length - 1 && key(i) === cur) i++;
    } else {
      const startOf = (j) => {
        while (j > 0 && key(j - 1) === key(j)) j--;
        return j;
      };
      const start = startOf(i);
      i = start === i && i > 0 ? startOf(i - 1) : start;
    }
    replay(i);
  }

  // Keys once the tree has focus: arrows move and fold, Enter opens, n/p jump between divergences.
  tree.addEventListener("keydown", (ev) => {
    const all = nodes();
    const cur = visible.findIndex((n) => n.id === model.get("selected"));
    const n = visible[cur];
    // Key-to-panel time, kept as a click's (el.dataset.nbdClickMs).
    if (["ArrowDown", "ArrowUp", "ArrowLeft", "Home", "End", "n", "p"].includes(ev.key)) clickedAt = performance.now();
    let handled = true;
    if (ev.key === "ArrowDown") select(visible[Math.min(visible.length - 1, cur + 1)]?.id ?? -1);
    else if (ev.key === "ArrowUp") select(visible[Math.max(0, cur - 1)]?.id ?? -1);
    else if (ev.key === "ArrowRight" && n && kids.has(n.id)) collapsed.delete(n.id), flatten();
    else if (ev.key === "ArrowLeft" && n && kids.has(n.id) && !collapsed.has(n.id)) collapsed.add(n.id), flatten();
    else if (ev.key === "ArrowLeft" && n && n.parent >= 0) select(all[n.parent].id);
    else if (ev.key === "Enter" && n) (clickedAt = performance.now()), select(n.id);
    else if (ev.key === " ") togglePlay();
    else if (ev.key === "n") jump(1);
    else if (ev.key === "p") jump(-1);
    else if (ev.key === "Escape") root.focus(); // out of the tree: Tab goes on from the view
    else if (ev.key === "Home") select(visible[0]?.id ?? -1);
    else if (ev.key === "End") select(visible[visible.length - 1]?.id ?? -1);
    else handled = false;
    if (handled) {
      ev.preventDefault();
      ev.stopPropagation();
    }
  });

  rows.addEventListener("click", (ev) => {
    const toggle = ev.target.closest("[data-toggle]");
    if (toggle && kids.has(Number(toggle.dataset.toggle))) {
      const id = Number(toggle.dataset.toggle);
      collapsed.has(id) ? collapsed.delete(id) : collapsed.add(id);
      flatten();
      return;
    }
    const row = ev.target.closest(".nbd-row");
    tree.focus({ preventScroll: true });
    if (row) {
      clickedAt = performance.now();
      const id = Number(row.dataset.id);
      const at = model.get("order").indexOf(id);
      if (at >= 0) {
        replayAt = at;
        slider.value = String(at);
      }
      select(id);
    }
  });
  scroller.addEventListener("scroll", () => requestAnimationFrame(draw));
  // The box can be resized (and is laid out late): draw what fits whenever its size changes.
  new ResizeObserver(() => draw()).observe(scroller);
  // Another filter keeps the selected row in sight (the rows above it come and go).
  filter.addEventListener("change", () => (model.get("selected") >= 0 ? reveal(model.get("selected")) : flatten()));
  // A search opens the folds and scrolls to its first match.
  search.addEventListener("input", () => {
    collapsed.clear();
    flatten();
    const q = search.value.trim().toLowerCase();
    const i = q ? visible.findIndex((n) => n.event !== -1 && `${n.base} ${n.raw} ${n.base_type} ${n.raw_type}`.toLowerCase().includes(q)) : -1;
    if (i >= 0) {
      scroller.scrollTop = Math.max(0, i * ROW - scroller.clientHeight / 3);
      draw();
    }
  });
  slider.addEventListener("input", () => replay(Number(slider.value)));

  function statsCells(s) {
    if (!s) return [h("td", { colspan: "6" }, "not on this side (another layout, or not recorded)")];
    return ["min", "max", "mean", "std"].map((k) => h("td", {}, fmt(s[k]))).concat([h("td", {}, `${s.nan ?? 0}/${s.inf ?? 0}`), h("td", {}, `${s.dtype} ${JSON.stringify(s.shape)}`)]);
  }

  function drawDetail() {
    const d = model.get("detail");
    if (!d || !d.node) return;
    if (clickedAt !== null) {
      el.dataset.nbdClickMs = (performance.now() - clickedAt).toFixed(0);
      plotWait = clickedAt;
      clickedAt = null;
    }
    const n = d.node;
    const parts = [h("div", { class: "nbd-title" }, n.event === -1 ? n.label : n.event === -2 ? `${n.base || n.raw} (${n.base_type || n.raw_type}): only the ${n.base ? "base" : "raw"} model has this call; a LayerMap can pair it` : `${n.base || "<root>"} (${n.base_type}) ~ ${n.raw || "<root>"} (${n.raw_type}) · step ${n.step} ${n.phase}`)];
    if (d.released) parts.push(h("div", { class: "nbd-released", role: "status" }, d.released));
    if (d.step) parts.push(stepSummary(d.step));
    if (d.arguments && d.arguments.length) {
      parts.push(
        h(
          "table",
          { class: "nbd-args", title: "constructor arguments whose meaning differs between the two layers" },
          h("tr", {}, h("th", {}, "argument differs"), h("th", {}, "base"), h("th", {}, "raw")),
          ...d.arguments.map((a) => h("tr", {}, h("td", {}, a.name), h("td", {}, a.base), h("td", {}, a.raw))),
        ),
      );
    }
    if (d.settings && d.settings.length) {
      parts.push(
        h(
          "table",
          { class: "nbd-args nbd-settings", title: "what each optimizer applies to this layer's parameters at this step" },
          h("tr", {}, h("th", {}, "optimizer setting"), h("th", {}, "base"), h("th", {}, "raw")),
          ...d.settings.map((s) =>
            h("tr", s.differs ? { class: "nbd-differs" } : {}, h("td", {}, s.name), h("td", {}, fmt(s.base)), h("td", {}, fmt(s.raw))),
          ),
        ),
      );
    }
    const metricRow = (m) => h("tr", {}, h("td", {}, fmt(m.max_abs)), h("td", {}, fmt(m.max_rel)), h("td", {}, fmt(m.mean_abs)), h("td", {}, fmt(m.cosine)), h("td", {}, m.nan.join("/")), h("td", {}, m.inf.join("/")));
    for (const t of d.tensors) {
      // A tensor measured only on base's inputs (what the layer's own code handed a sublayer) has
      // no accumulated error: its local measurement is its headline.
      const m = t.metrics || t.local;
      // The tolerance itself is in the title's tooltip: the same long formula on every tensor read as noise.
      const own = t.local_label || "run alone on base's inputs";
      const head = t.metrics
        ? `${shownName(t.name)}: ${fmt(m.ratio)}x its tolerance${m.note ? " · " + m.note : ""}`
        : `${shownName(t.name)}: own error ${fmt(m.ratio)}x its tolerance (${own})`;
      const allowed = `${t.name} · allowed: ${m.tolerance} (${m.mode === "strict" ? "every element within it" : m.mode})`;
      parts.push(
        h(
          "div",
          { class: `nbd-tensor${m.passed && (!t.local || t.local.passed) ? "" : " nbd-fail"}`, dataset: { tensor: t.name } },
          h("div", { class: "nbd-tname", title: allowed }, head),
          t.what ? h("div", { class: "nbd-what" }, t.what) : null,
          h(
            "table",
            { class: "nbd-metrics" },
            h("tr", {}, ...["max abs", "max rel", "mean abs", "cosine", "NaN b/r", "Inf b/r"].map((x) => h("th", {}, x))),
            metricRow(m),
            t.metrics && t.local
              ? h("tr", { class: "nbd-local" }, h("td", { colspan: "6" }, `own error (${own}): ${fmt(t.local.ratio)}x, max abs ${fmt(t.local.max_abs)}`))
              : null,
          ),
          h(
            "table",
            { class: "nbd-stats" },
            h("tr", {}, h("th", {}), ...["min", "max", "mean", "std", "NaN/Inf", "dtype shape"].map((x) => h("th", {}, x))),
            h("tr", {}, h("th", {}, "base"), ...statsCells(t.base)),
            h("tr", {}, h("th", {}, "raw"), ...statsCells(t.raw)),
          ),
        ),
      );
    }
    parts.push(plotBox);
    panel.replaceChildren(...parts);
    drawPlots();
    const frames = [];
    const frameRow = (key, f, i) =>
      h(
        "div",
        {
          class: "nbd-frame",
          tabindex: "0",
          role: "button",
          dataset: { side: key, index: i },
          onclick: () => {
            model.set("frame_request", { side: key, index: i, nonce: Date.now() });
            model.save_changes();
          },
          onkeydown: (ev) => {
            if (ev.key !== "Enter" && ev.key !== " ") return;
            ev.preventDefault();
            ev.target.click();
          },
        },
        `${f.label || `${f.file.split("/").pop()}:${f.line}`} in ${f.function}`,
      );
    for (const sideName of ["base", "raw"]) {
      const built = d.stacks[`${sideName}_built`] || [];
      if (built.length) {
        frames.push(h("div", { class: "nbd-stack-title nbd-built" }, `${sideName} built at`), frameRow(`${sideName}_built`, built[0], 0));
      }
      const called = d.stacks[sideName] || [];
      if (called.length) frames.push(h("div", { class: "nbd-stack-title" }, `${sideName} called from (innermost first)`));
      called.forEach((f, i) => frames.push(frameRow(sideName, f, i)));
    }
    // A detail that arrives late (the kernel's answer to an earlier selection) must not take the
    // keyboard away from the frame it is on: the same frame, redrawn, gets the focus back.
    const focused = stack.contains(document.activeElement) ? document.activeElement.dataset : null;
    stack.replaceChildren(...frames);
    source.replaceChildren();
    if (focused) {
      const again = stack.querySelector(`.nbd-frame[data-side="${focused.side}"][data-index="${focused.index}"]`);
      (again || stack.querySelector(".nbd-frame"))?.focus();
    }
  }

  // A group row: the step at a glance, each worst row a link to it.
  function stepSummary(st) {
    const rows = st.phases.map((p) =>
      h(
        "tr",
        {},
        h("td", {}, p.phase),
        h("td", {}, p.own ? `${p.own} own error${p.own > 1 ? "s" : ""} of ${p.rows}` : `${p.rows} rows, no own error`),
        h(
          "td",
          {},
          ...p.worst.map((w) =>
            h(
              "button",
              { class: `nbd-jump nbd-${w.status}`, title: `select ${w.label}`, onclick: () => select(w.id) },
              `${w.label} ${fmt(w.ratio)}${w.local !== null && (w.status === "blamed" || w.status === "local") ? ` (local ${fmt(w.local)})` : ""}`,
            ),
          ),
        ),
      ),
    );
    const loss = st.loss ? h("div", { class: "nbd-step-loss" }, `loss: base ${fmt(st.loss[0])}, raw ${fmt(st.loss[1])}`) : null;
    return h(
      "div",
      { class: "nbd-step-summary" },
      loss,
      h("table", { class: "nbd-args" }, h("tr", {}, h("th", {}, "phase"), h("th", {}, "errors"), h("th", {}, "worst rows (click to select)")), ...rows),
    );
  }

  function drawPlots() {
    const p = (model.get("detail") || {}).picture;
    // Identical values have no error to draw: say so rather than draw an empty histogram and a blank map.
    const same = p && p.zeros === p.total;
    const masked = same && p.masked ? ` (${p.masked} of them masked alike: an infinity against a mask value of its sign)` : "";
    const note = same && h("div", { class: "nbd-same" }, `every one of the ${p.total} elements is equal on both sides${masked}`);
    plotBox.replaceChildren(...(same ? [note] : p ? [histogram(p), errorMap(p)] : []));
    if (p && plotWait !== null) {
      el.dataset.nbdPlotMs = (performance.now() - plotWait).toFixed(0); // drawn with the panel
      plotWait = null;
    }
  }

  function drawSource() {
    const s = model.get("source");
    if (!s || !s.kind) return;
    const since = s.since ?? s.line;
    const lines = s.lines.map((text, i) => {
      const at = s.first + i;
      const mark = at === s.line ? " nbd-src-here" : at >= since && at < s.line ? " nbd-src-span" : "";
      return h("div", { class: `nbd-src-line${mark}` }, h("span", { class: "nbd-lineno" }, String(at)), text);
    });
    const link = s.relpath ? labUrl(s.relpath) : null;
    // A frame standing for lines since..line (a layer's own code between two sublayers) says all of them.
    const span = since < s.line ? `lines ${since}-${s.line}` : `line ${s.line}`;
    const title = s.kind === "cell" ? s.label || `notebook cell, ${span}` : `${s.file}:${since < s.line ? `${since}-${s.line}` : s.line}`;
    const pre = h("pre", { class: "nbd-src" }, ...lines);
    const open = link ? h("a", { href: link.href, target: "_blank", class: "nbd-open", title: span }, `${link.label} at ${span}`) : null;
    if (open) openAtLine(open, model, link, s.line);
    source.replaceChildren(
      h("div", { class: "nbd-src-title" }, title, " ", open),
      pre,
    );
    // In view: measured against the <pre> itself (offsetTop counts from whichever ancestor is
    // positioned, which put line 30 below the fold).
    const here = pre.querySelector(".nbd-src-span") || pre.querySelector(".nbd-src-here");
    if (here) {
      const top = here.getBoundingClientRect().top - pre.getBoundingClientRect().top + pre.scrollTop;
      pre.scrollTop = Math.max(0, top - pre.clientHeight / 3);
    }
  }

  model.on("change:nodes", () => {
    index();
    flatten();
  });
  model.on("change:summary", () => (summary.textContent = model.get("summary")));
  model.on("change:detail", drawDetail);
  model.on("change:source", drawSource);
  model.on("change:selected", () => {
    draw();
    label();
  });

  index();
  summary.textContent = model.get("summary");
  slider.max = String(Math.max(0, model.get("order").length - 1));
  flatten();
  drawDetail();
  label();
  requestAnimationFrame(draw);
  // Open on the first divergence, or (a result that agrees) on the row the kernel chose to show.
  const first = model.get("first") >= 0 ? model.get("first") : model.get("selected");
  if (first >= 0) {
    replayAt = model.get("order").indexOf(first);
    slider.value = String(Math.max(0, replayAt));
    requestAnimationFrame(() => reveal(first));
  }
  // The static copy (an output of its own, for when this view cannot be drawn) is hidden while it is.
  const sid = model.get("static_id");
  const copy = sid ? document.querySelector(`[data-nbd-static="${sid}"]`) : null;
  const copyBox = copy ? copy.closest(".jp-OutputArea-child") || copy : null;
  if (copyBox) copyBox.style.display = "none";
  el.dataset.nbdRenderMs = (performance.now() - started).toFixed(0);
  // The kernel holds the result while some drawing shows it (see nbdiff/notebook/widget.py).
  const tell = (drawing) => {
    try {
      model.send?.({ drawing });
    } catch (e) {
      // the kernel is gone (restarted, shut down): nothing to let go of
    }
  };
  tell("shown");
  return () => {
    if (playing !== null) clearInterval(playing); // the view is gone (cell re-run or cleared)
    window.removeEventListener("keydown", saveKey, true);
    tell("gone");
  };
}

export default { render };
