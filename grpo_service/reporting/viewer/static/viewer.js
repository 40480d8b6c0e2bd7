// grpo-service trace viewer: run list, rollout replay, group view. Plain JS, no build step.
// Routes (after #): /?filters  /rollout/<session>?t=<position>  /group/<group>  /run/<run id>
"use strict";

const API = "/viewer/api";
const app = document.getElementById("app");
const crumbs = document.getElementById("crumbs");
let stopCurrent = () => {}; // the current view's cleanup (timers, key handlers)

// ------------------------------------------------------------------------------ helpers

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) if (c !== null && c !== undefined && c !== false) el.append(c.nodeType ? c : String(c));
  return el;
}

class ApiError extends Error {
  constructor(status, code, detail) { super(detail); this.status = status; this.code = code; }
}

async function api(path, params) {
  const url = new URL(API + path, location.origin);
  for (const [k, v] of Object.entries(params || {})) {
    if (Array.isArray(v)) v.forEach((x) => url.searchParams.append(k, x));
    else if (v !== "" && v !== null && v !== undefined) url.searchParams.set(k, v);
  }
  const r = await fetch(url, { headers: { Accept: "application/json" } });
  let body = null;
  try { body = await r.json(); } catch (e) { body = null; }
  if (!r.ok) {
    let detail = body && body.detail;
    if (Array.isArray(detail)) detail = detail.map((d) => `${(d.loc || []).slice(-1)[0]}: ${d.msg}`).join("; ");
    throw new ApiError(r.status, body && body.code, detail || `HTTP ${r.status}`);
  }
  return body;
}

function showError(err, where) {
  setCrumbs(h("a", { href: "#/" }, "rollouts"));
  app.replaceChildren(
    h("div", { class: "card" },
      h("h1", {}, where || "Cannot show this"),
      h("p", { class: "err-box", id: "error" }, err.message || String(err)),
      err.status === 401 ? h("p", {}, h("a", { href: "/viewer" }, "Log in")) : h("p", {}, h("a", { href: "#/" }, "Back to the run list"))));
}

const fmt = {
  num: (x, d = 2) => (x === null || x === undefined || Number.isNaN(x) ? "–" : Number(x).toFixed(d)),
  int: (x) => (x === null || x === undefined ? "–" : Number(x).toLocaleString("en-US")),
  date: (t) => (t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) : "–"),
  dur: (s) => (s === null || s === undefined ? "–" : s < 1 ? `${(s * 1000).toFixed(0)} ms` : s < 120 ? `${s.toFixed(1)} s` : `${(s / 60).toFixed(1)} min`),
  ms: (x) => (x === null || x === undefined ? "–" : `${Number(x).toFixed(1)} ms`),
};

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/";
  const [path, query] = raw.split("?");
  return { parts: path.split("/").filter(Boolean).map(decodeURIComponent), params: new URLSearchParams(query || "") };
}

function setCrumbs(...items) {
  crumbs.replaceChildren(...items.filter(Boolean).flatMap((it, i) => [i ? " / " : "", it]));
}

function stopIsError(reason) { return reason && (reason.startsWith("policy_error") || reason === "error" || reason === "time_limit"); }

// ------------------------------------------------------------------------------ routing

async function route() {
  stopCurrent();
  stopCurrent = () => {};
  const { parts, params } = parseHash();
  setCrumbs();
  try {
    if (parts[0] === "rollout" && parts[1]) await rolloutView(parts[1], params);
    else if (parts[0] === "group" && parts[1]) await groupView(parts[1]);
    else if (parts[0] === "run" && parts[1]) await runRedirect(parts[1]);
    else await listView(params);
  } catch (err) {
    showError(err);
  }
}
window.addEventListener("hashchange", route);

let summaryCache = null;
async function summary() {
  if (!summaryCache) {
    summaryCache = await api("/summary");
    document.getElementById("db").textContent = `${summaryCache.db} · ${fmt.int(summaryCache.sessions)} rollouts`;
  }
  return summaryCache;
}

async function runRedirect(runId) {
  const page = await api("/rollouts", { run_id: runId, per_page: 1 });
  if (!page.rows.length) throw new ApiError(404, "unknown_run", `no rollout with run id ${runId} in this trace DB`);
  location.replace(`#/rollout/${encodeURIComponent(page.rows[0].session_id)}`);
}

// ------------------------------------------------------------------------------ run list

const FILTERS = ["env", "model", "policy", "weights_version", "stop_reason", "min_reward", "max_reward", "min_achievements", "since", "until", "q", "group_id", "run_id"];
const COLUMNS = [
  ["started_at", "started"], [null, "rollout"], ["env_name", "env"], ["model", "model"], ["seed", "seed", "num"],
  ["num_turns", "turns", "num"], ["num_steps", "steps", "num"], ["total_reward", "return", "num"],
  ["achievements_count", "achievements"], ["stop_reason", "stop reason"], ["wall_s", "wall", "num"], [null, "group"],
];
const WEIGHTS_COLUMN = [null, "weights"];

async function listView(params) {
  setCrumbs(h("span", {}, "rollouts"));
  const facets = await summary();
  const state = {};
  for (const k of FILTERS) if (params.get(k)) state[k] = params.get(k);
  const achievements = params.getAll("achievement");
  const sort = params.get("sort") || "started_at";
  const order = params.get("order") || "desc";
  const page = Number(params.get("page") || 1);
  const perPage = Number(params.get("per_page") || 50);

  const go = (changes) => {
    const next = new URLSearchParams();
    const merged = { ...state, sort, order, page, per_page: perPage, ...changes };
    for (const [k, v] of Object.entries(merged)) if (v !== "" && v !== null && v !== undefined && k !== "achievement") next.set(k, v);
    for (const a of changes.achievement || achievements) next.append("achievement", a);
    if (merged.page === 1 || merged.page === "1") next.delete("page");
    location.hash = `#/?${next.toString()}`;
  };

  const select = (key, label, values, id) =>
    h("label", {}, label,
      h("select", { id, onchange: (e) => go({ [key]: e.target.value, page: 1 }) },
        h("option", { value: "" }, "any"),
        values.map((v) => h("option", { value: v.value, selected: state[key] === String(v.value) }, `${v.value} (${fmt.int(v.count)})`))));
  const input = (key, label, type, id, extra = {}) =>
    h("label", {}, label, h("input", { id, type, value: state[key] || "", ...extra, onchange: (e) => go({ [key]: e.target.value, page: 1 }) }));

  const stopValues = [...facets.stop_reason];
  const families = new Set(stopValues.filter((v) => v.value.includes(":")).map((v) => v.value.split(":")[0]));
  for (const f of families) stopValues.push({ value: `${f}:*`, count: stopValues.filter((v) => v.value.startsWith(f + ":")).reduce((a, v) => a + v.count, 0) });

  const filters = h("div", { class: "filters" },
    select("env", "environment", facets.env, "filter-env"),
    select("model", "model", facets.model, "filter-model"),
    select("policy", "policy", facets.policy, "filter-policy"),
    facets.weights_version.length ? select("weights_version", "weights version", facets.weights_version, "filter-weights") : null,
    select("stop_reason", "stop reason", stopValues, "filter-stop"),
    input("min_reward", "return ≥", "number", "filter-min-reward", { step: "any" }),
    input("max_reward", "return ≤", "number", "filter-max-reward", { step: "any" }),
    h("label", {}, "achievement",
      h("select", { id: "filter-achievement", onchange: (e) => e.target.value && go({ achievement: [...achievements, e.target.value], page: 1 }) },
        h("option", { value: "" }, "add…"),
        facets.achievement.filter((a) => !achievements.includes(a.value)).map((a) => h("option", { value: a.value }, `${a.value} (${fmt.int(a.count)})`)))),
    input("since", "from", "date", "filter-since"),
    input("until", "to", "date", "filter-until"),
    input("q", "id contains", "search", "filter-q", { placeholder: "run, group or session id" }),
    h("button", { id: "clear", onclick: () => { location.hash = "#/"; } }, "Clear"));
  const chips = h("div", { class: "chips", style: "margin-top:10px" },
    achievements.map((a) => h("span", { class: "chip" }, a, h("button", { title: "remove", onclick: () => go({ achievement: achievements.filter((x) => x !== a), page: 1 }) }, "×"))),
    state.group_id ? h("span", { class: "chip" }, `group ${state.group_id}`, h("button", { onclick: () => go({ group_id: "", page: 1 }) }, "×")) : null,
    state.run_id ? h("span", { class: "chip" }, `run ${state.run_id}`, h("button", { onclick: () => go({ run_id: "", page: 1 }) }, "×")) : null);

  const tableCard = h("div", { class: "card" }, h("p", { class: "muted" }, "Loading…"));
  app.replaceChildren(h("div", { class: "card" }, filters, chips), tableCard);

  const t0 = performance.now();
  const data = await api("/rollouts", { ...state, achievement: achievements, sort, order, page, per_page: perPage });
  const ms = performance.now() - t0;

  const withWeights = facets.weights_version.length > 0;
  const columns = withWeights ? [...COLUMNS.slice(0, 4), WEIGHTS_COLUMN, ...COLUMNS.slice(4)] : COLUMNS;
  const head = h("tr", {}, columns.map(([key, label, cls]) => {
    if (!key) return h("th", { class: cls }, label);
    const active = key === sort;
    return h("th", {
      class: `sortable ${cls || ""}`, "data-sort": key, title: "sort",
      onclick: () => go({ sort: key, order: active && order === "desc" ? "asc" : "desc", page: 1 }),
    }, label, active ? h("span", { class: "arrow" }, order === "desc" ? " ▼" : " ▲") : "");
  }));
  const rows = data.rows.map((r) => h("tr", {
    class: "row", "data-session": r.session_id,
    onclick: (e) => { if (!e.target.closest("a")) location.hash = `#/rollout/${encodeURIComponent(r.session_id)}`; },
  },
  h("td", { class: "mono nowrap" }, fmt.date(r.started_at)),
  h("td", { class: "nowrap" }, h("a", { href: `#/rollout/${encodeURIComponent(r.session_id)}` }, r.run_id)),
  h("td", {}, r.env_name),
  h("td", { class: "mono" }, r.model || r.policy_name),
  withWeights ? h("td", { class: "mono" }, r.weights_version ?? "–") : null,
  h("td", { class: "num" }, r.seed ?? "–"),
  h("td", { class: "num" }, fmt.int(r.num_turns)),
  h("td", { class: "num" }, fmt.int(r.num_steps)),
  h("td", { class: "num", "data-col": "return" }, fmt.num(r.total_reward)),
  h("td", { title: r.achievements.join(", ") }, h("b", {}, r.achievements_count), " ", h("span", { class: "muted" }, r.achievements.slice(0, 3).join(", ") + (r.achievements.length > 3 ? ", …" : ""))),
  h("td", { class: `stop ${stopIsError(r.stop_reason) ? "err" : ""}` }, r.stop_reason),
  h("td", { class: "num nowrap" }, fmt.dur(r.wall_s)),
  h("td", { class: "nowrap" }, r.group_id ? h("a", { href: `#/group/${encodeURIComponent(r.group_id)}`, title: `group ${r.group_id}` }, `${r.group_id.length > 16 ? r.group_id.slice(0, 14) + "…" : r.group_id} #${r.group_index}`) : "–")));

  const pager = h("div", { class: "pager" },
    h("button", { id: "prev", disabled: page <= 1, onclick: () => go({ page: page - 1 }) }, "← Previous"),
    h("span", { id: "page-info" }, `page ${page} of ${fmt.int(data.pages)}`),
    h("button", { id: "next", disabled: page >= data.pages, onclick: () => go({ page: page + 1 }) }, "Next →"),
    h("select", { id: "per-page", onchange: (e) => go({ per_page: e.target.value, page: 1 }) },
      [25, 50, 100, 200].map((n) => h("option", { value: n, selected: n === perPage }, `${n} per page`))),
    h("span", { class: "muted", id: "query-ms" }, `${ms.toFixed(0)} ms`));
  tableCard.replaceChildren(
    h("h1", {}, h("span", { id: "total" }, fmt.int(data.total)), ` rollout${data.total === 1 ? "" : "s"}`,
      h("span", { class: "muted", style: "font-weight:400;font-size:14px" }, ` of ${fmt.int(facets.sessions)} in this DB`)),
    data.rows.length ? h("table", { class: "runs", id: "runs" }, h("thead", {}, head), h("tbody", {}, rows))
      : h("p", { class: "muted", id: "empty" }, "No rollout matches these filters."),
    pager);
}

// ------------------------------------------------------------------------------ rollout

const VITAL_COLORS = { health: "#d93025", food: "#e37400", drink: "#1a73e8", energy: "#188038" };

async function rolloutView(sessionId, params) {
  const [detail, facets] = await Promise.all([api(`/rollouts/${encodeURIComponent(sessionId)}`), summary()]);
  const s = detail.session;
  const timeline = detail.timeline;
  setCrumbs(h("a", { href: "#/" }, "rollouts"),
    s.group_id ? h("a", { href: `#/group/${encodeURIComponent(s.group_id)}` }, `group ${s.group_id}`) : null,
    h("span", {}, s.run_id));
  void facets;

  // Positions: one per turn (the state the model saw) plus the state after the last executed step.
  const lastExecuted = timeline.length && timeline[timeline.length - 1].env;
  const positions = timeline.length + (lastExecuted ? 1 : 0);
  const cumulative = [];
  let acc = 0;
  for (const t of timeline) { acc += t.env ? t.env.reward : 0; cumulative.push(acc); }
  const unlockedBy = []; // achievements unlocked before each position
  const seen = [];
  for (let i = 0; i <= timeline.length; i++) {
    unlockedBy.push([...seen]);
    if (i < timeline.length && timeline[i].env) for (const a of timeline[i].env.unlocked) if (!seen.includes(a)) seen.push(a);
  }

  const banner = h("div", { class: "banner warn", id: "banner" }, "Replaying the rollout through its environment…");
  const frameBox = h("div", { class: "frame", id: "frame" }, h("div", { class: "none" }, "…"));
  const frameText = h("pre", { class: "text", id: "frame-caption", hidden: true, style: "margin-top:8px" });
  const slider = h("input", { type: "range", id: "slider", min: 0, max: Math.max(0, positions - 1), value: 0, "aria-label": "position" });
  const posLabel = h("span", { class: "pos", id: "pos" });
  const playBtn = h("button", { id: "btn-play", class: "primary", title: "play / pause (space)" }, "▶ play");
  const speed = h("select", { id: "speed", title: "frames per second" }, [2, 4, 8, 16].map((n) => h("option", { value: n, selected: n === 4 }, `${n}/s`)));
  const controls = h("div", {},
    h("div", { class: "controls" }, slider, posLabel),
    h("div", { class: "controls" },
      h("button", { id: "btn-first", title: "first (Home)", onclick: () => show(0) }, "«"),
      h("button", { id: "btn-prev", title: "previous (←)", onclick: () => show(pos - 1) }, "‹ prev"),
      playBtn,
      h("button", { id: "btn-next", title: "next (→)", onclick: () => show(pos + 1) }, "next ›"),
      h("button", { id: "btn-last", title: "last (End)", onclick: () => show(positions - 1) }, "»"),
      h("span", { style: "flex:1" }), speed));
  const vitals = h("div", { class: "vitals", id: "vitals" });
  const achBox = h("div", { class: "chips", id: "achievements" });
  const turnBox = h("div", { id: "turn" }, h("p", { class: "muted" }, "…"));
  const chart = rewardChart(timeline, cumulative, (i) => show(i));

  const meta = h("div", { class: "meta" },
    metaItem("run", s.run_id), metaItem("environment", s.env_name), metaItem("seed", s.seed ?? "–"),
    metaItem("policy", s.policy_name), metaItem("model", s.model || "–"),
    s.weights_version !== null && s.weights_version !== undefined ? metaItem("weights", s.weights_version) : null,
    metaItem("return", fmt.num(s.total_reward)), metaItem("turns / steps", `${s.num_turns} / ${s.num_steps}`),
    metaItem("stop reason", h("span", { class: `stop ${stopIsError(s.stop_reason) ? "err" : ""}`, id: "stop-reason" }, s.stop_reason)),
    metaItem("started", fmt.date(s.started_at)), metaItem("wall", fmt.dur(s.wall_s)),
    s.group_id ? metaItem("group", h("a", { href: `#/group/${encodeURIComponent(s.group_id)}` }, `${s.group_id} #${s.group_index}`)) : null);

  app.replaceChildren(
    h("h1", {}, "Rollout ", h("span", { class: "mono", style: "font-size:15px" }, s.session_id)),
    h("div", { class: "card" }, meta,
      s.error ? h("p", { class: "err-box" }, s.error) : null,
      h("div", { class: "chips", style: "margin-top:10px" }, (s.achievements || []).map((a) => h("span", { class: "chip good" }, a)))),
    banner,
    h("div", { class: "player" },
      h("div", {},
        h("div", { class: "card" }, frameBox, frameText, controls, h("div", { class: "hint" }, "← → step · space play/pause · Home/End")),
        h("div", { class: "card" }, h("h2", {}, "Vitals"), vitals),
        h("div", { class: "card" }, h("h2", {}, "Achievements so far"), achBox)),
      h("div", {},
        h("div", { class: "card" }, h("h2", {}, "Reward per step"), chart.svg,
          h("div", { class: "legend" }, h("i", { style: "background:#1e8e3e" }), "reward", h("i", { style: "background:#2f5bd3" }), "return so far", h("i", { style: "background:#e8a600" }), "achievement")),
        turnBox)));

  // Frames: replay status first (the server replays and checks the trace), then images on demand.
  let replay = null;
  const frameUrl = (i, kind) => `${API}/rollouts/${encodeURIComponent(sessionId)}/frames/${i}.${kind}`;
  api(`/rollouts/${encodeURIComponent(sessionId)}/replay`).then((r) => {
    replay = r;
    renderBanner(banner, r);
    drawFrame();
  }).catch((err) => { banner.className = "banner bad"; banner.textContent = `Replay failed: ${err.message}`; });

  const chunks = new Map();
  const chunkSize = 50;
  function turnData(i) {
    const c = Math.floor(i / chunkSize);
    if (!chunks.has(c)) {
      chunks.set(c, api(`/rollouts/${encodeURIComponent(sessionId)}/turns`, { start: c * chunkSize, count: chunkSize }).then((d) => d.turns));
    }
    return chunks.get(c).then((list) => list.find((t) => t.turn === i) || null);
  }

  let pos = -1;
  const prefetched = new Set();
  function drawFrame() {
    if (!replay || pos < 0) return;
    if (!replay.available) {
      frameBox.replaceChildren(h("div", { class: "none" }, "No frames: ", replay.reason || "replay unavailable"));
      return;
    }
    if (pos >= replay.reachable) {
      frameBox.replaceChildren(h("div", { class: "none" }, `No frame: the replay stops at position ${replay.reachable - 1}.`));
      return;
    }
    const kids = [];
    if (replay.frame_png) kids.push(h("img", { id: "frame-img", src: frameUrl(pos, "png"), alt: `frame ${pos}`, "data-position": pos }));
    if (replay.frame_text && !replay.frame_png) {
      const pre = h("pre", { id: "frame-text" }, "…");
      fetch(frameUrl(pos, "txt")).then((r) => r.text()).then((t) => { pre.textContent = t; });
      kids.push(pre);
    }
    if (!kids.length) kids.push(h("div", { class: "none" }, `${s.env_name} draws no frames; its observation text is on the right.`));
    frameBox.replaceChildren(...kids);
    if (replay.frame_text && replay.frame_png) { // an image and a text rendering: the text below
      fetch(frameUrl(pos, "txt")).then((r) => r.text()).then((t) => { frameText.textContent = t; frameText.hidden = false; });
    }
    if (replay.frame_png) for (let k = 1; k <= 3; k++) {
      const j = pos + k;
      if (j < replay.reachable && !prefetched.has(j)) { prefetched.add(j); new Image().src = frameUrl(j, "png"); }
    }
  }

  async function show(i) {
    i = Math.max(0, Math.min(positions - 1, i));
    if (i === pos) return;
    pos = i;
    slider.value = i;
    const final = i === timeline.length;
    posLabel.textContent = final ? `end · ${positions - 1}/${positions - 1}` : `turn ${i} / ${positions - 1}`;
    history.replaceState(null, "", `#/rollout/${encodeURIComponent(sessionId)}?t=${i}`);
    drawFrame();
    chart.mark(i);
    const t = timeline[Math.min(i, timeline.length - 1)];
    renderVitals(vitals, final ? null : t && t.vitals);
    const before = unlockedBy[i];
    const fresh = i > 0 && timeline[i - 1].env ? timeline[i - 1].env.unlocked : [];
    achBox.replaceChildren(...(before.length ? before.map((a) => h("span", { class: `chip ${fresh.includes(a) ? "new" : ""}` }, a)) : [h("span", { class: "muted" }, "none yet")]));
    if (final) {
      turnBox.replaceChildren(h("div", { class: "card" }, h("h2", {}, "End of the rollout"),
        h("p", {}, `Stop reason `, h("b", { class: "stop" }, s.stop_reason), `; return ${fmt.num(s.total_reward)} over ${s.num_steps} steps.`)));
      return;
    }
    const data = await turnData(i);
    if (pos !== i) return;
    renderTurn(turnBox, data, timeline[i], s, sessionId);
  }

  slider.addEventListener("input", () => show(Number(slider.value)));
  let timer = null;
  const play = () => {
    if (timer) { clearInterval(timer); timer = null; playBtn.textContent = "▶ play"; return; }
    if (pos >= positions - 1) show(0);
    playBtn.textContent = "❚❚ pause";
    timer = setInterval(() => { if (pos >= positions - 1) play(); else show(pos + 1); }, 1000 / Number(speed.value));
  };
  playBtn.addEventListener("click", play);
  speed.addEventListener("change", () => { if (timer) { play(); play(); } });
  const onKey = (e) => {
    if (e.target.closest && e.target.closest("input, select, textarea")) { if (e.target !== slider) return; }
    if (e.key === " " && e.target.closest && e.target.closest("button")) return; // the button's own click
    if (e.key === "ArrowRight") { show(pos + 1); e.preventDefault(); }
    else if (e.key === "ArrowLeft") { show(pos - 1); e.preventDefault(); }
    else if (e.key === " ") { play(); e.preventDefault(); }
    else if (e.key === "Home") { show(0); e.preventDefault(); }
    else if (e.key === "End") { show(positions - 1); e.preventDefault(); }
  };
  document.addEventListener("keydown", onKey);
  stopCurrent = () => { if (timer) clearInterval(timer); document.removeEventListener("keydown", onKey); };
  if (positions) show(Number(params.get("t") || 0));
  else turnBox.replaceChildren(h("div", { class: "card" }, h("p", { class: "muted" }, "This rollout recorded no turns.")));
}

function metaItem(label, value) { return h("div", {}, h("b", {}, label), h("span", {}, value)); }

function renderBanner(el, r) {
  if (!r.available) {
    el.className = "banner bad";
    el.textContent = `Frames unavailable: ${r.reason}.`;
  } else if (r.divergence) {
    el.className = "banner bad";
    el.id = "banner";
    el.textContent = `Replay diverges from the trace at turn ${r.divergence.turn} (${r.divergence.what}): ${r.divergence.detail}. Frames from there on do not show what the model saw.`;
  } else {
    el.className = `banner ${r.reason ? "warn" : "ok"}`;
    el.textContent = `✓ Replay matches the trace: ${r.checked} recorded observation${r.checked === 1 ? "" : "s"} checked (replayed in ${fmt.dur(r.replay_s)}).` + (r.reason ? ` Only partly: ${r.reason}.` : "");
  }
}

function renderVitals(el, v) {
  if (!v) { el.replaceChildren(h("span", { class: "muted" }, "not recorded at this position")); return; }
  el.replaceChildren(...Object.entries(v).flatMap(([k, n]) => [
    h("span", {}, k),
    h("div", { class: "bar" }, h("i", { style: `width:${Math.max(0, Math.min(9, n)) / 9 * 100}%;background:${VITAL_COLORS[k] || "#888"}` })),
    h("span", { class: "num", "data-vital": k }, n)]));
}

function renderTurn(el, t, light, s, sessionId) {
  if (!t) { el.replaceChildren(h("div", { class: "card" }, h("p", { class: "muted" }, "Turn not found."))); return; }
  const obsText = t.prompt_last && typeof t.prompt_last.content === "string" ? t.prompt_last.content : (t.observation && t.observation.text) || JSON.stringify(t.observation, null, 2);
  const reply = t.reply || {};
  const calls = t.tool_calls || [];
  const llmMs = t.llm ? t.llm.latency_ms : 0;
  const envMs = t.env ? t.env.env_ms : 0;
  const total = (llmMs || 0) + (envMs || 0) || 1;
  const prompt = h("details", { id: "prompt-details" }, h("summary", {}, `full prompt (${t.prompt_messages} messages)`));
  prompt.addEventListener("toggle", async () => {
    if (!prompt.open || prompt.dataset.loaded) return;
    prompt.dataset.loaded = "1";
    const d = await api(`/rollouts/${encodeURIComponent(sessionId)}/turns/${t.turn}/prompt`);
    prompt.append(...d.messages.map((m) => h("div", { class: "msg" }, h("div", { class: "role" }, m.role),
      h("pre", { class: "text" }, typeof m.content === "string" ? m.content : JSON.stringify(m.content ?? m.tool_calls, null, 2)))));
  });
  el.replaceChildren(
    h("div", { class: "grid2" },
      h("div", { class: "card" }, h("h2", {}, `Turn ${t.turn} · what the model saw`),
        h("pre", { class: "text", id: "obs-text" }, obsText),
        t.prompt_messages ? prompt : null),
      h("div", { class: "card" }, h("h2", {}, "The model's reply"),
        reply.content ? h("pre", { class: "text", id: "reply" }, reply.content) : h("p", { class: "muted", id: "reply" }, t.llm ? "(no text, tool calls only)" : "(no LLM: a scripted policy)"),
        h("div", { id: "tool-calls", style: "margin-top:8px" }, calls.length ? calls.map((c) => h("div", { class: "mono" }, `${c.tool}(${JSON.stringify(c.args)})`)) : h("span", { class: "muted" }, "no tool call")),
        t.error ? h("p", { class: "err-box", id: "turn-error", style: "margin-top:8px" }, `${t.error}${t.error_detail ? ": " + t.error_detail : ""}`) : null,
        t.llm && t.llm.error ? h("p", { class: "err-box" }, `LLM: ${t.llm.error}`) : null)),
    h("div", { class: "card" }, h("h2", {}, "Step"),
      h("div", { class: "kv" },
        h("b", {}, "actions"), h("span", { class: "mono", id: "step-actions" }, t.env ? t.env.actions.join(", ") || "–" : "not executed"),
        h("b", {}, "reward"), h("span", { id: "step-reward" }, t.env ? fmt.num(t.env.reward) : "–"),
        h("b", {}, "unlocked"), h("span", { id: "step-unlocked" }, t.env && t.env.unlocked.length ? t.env.unlocked.map((a) => h("span", { class: "chip new" }, a)) : "–"),
        h("b", {}, "episode / env step"), h("span", {}, `${t.episode} / ${t.env ? t.env.step_idx : "–"}`),
        h("b", {}, "done"), h("span", {}, t.env ? `${t.env.done}${t.env.truncated ? " (truncated)" : ""}` : "–"),
        h("b", {}, "model"), h("span", { class: "mono" }, t.llm ? `${t.llm.model || "–"} · ${t.llm.finish_reason || "–"} · ${t.llm.attempts} attempt${t.llm.attempts === 1 ? "" : "s"}` : "–"),
        h("b", {}, "tokens"), h("span", {}, t.llm && t.llm.usage ? `${fmt.int(t.llm.usage.prompt_tokens)} prompt, ${fmt.int(t.llm.usage.completion_tokens)} completion` : "–"),
        h("b", {}, "timing"), h("div", { id: "timing" },
          h("div", { class: "timing" }, h("div", { class: "llm", style: `width:${(100 * (llmMs || 0)) / total}%` }), h("div", { class: "env", style: `width:${(100 * (envMs || 0)) / total}%` })),
          h("span", { class: "legend" }, h("i", { style: "background:#7b61ff" }), `LLM ${fmt.ms(llmMs)}`, h("i", { style: "background:#15a28a" }), `env ${fmt.ms(envMs)}`)))));
  void light; void s;
}

function rewardChart(timeline, cumulative, onPick) {
  const W = 800, H = 120, pad = 4;
  const n = Math.max(1, timeline.length);
  const rewards = timeline.map((t) => (t.env ? t.env.reward : 0));
  const maxAbs = Math.max(0.1, ...rewards.map(Math.abs));
  const maxCum = Math.max(0.1, ...cumulative.map(Math.abs));
  const mid = H / 2;
  const x = (i) => pad + ((W - 2 * pad) * (i + 0.5)) / n;
  const bw = Math.max(1, (W - 2 * pad) / n - 1);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("class", "chart");
  svg.id = "reward-chart";
  const el = (tag, attrs) => { const e = document.createElementNS(ns, tag); for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v); svg.append(e); return e; };
  el("line", { x1: 0, x2: W, y1: mid, y2: mid, stroke: "#d5d9e2" });
  timeline.forEach((t, i) => {
    if (t.env && t.env.unlocked.length) el("rect", { x: x(i) - bw / 2, y: 0, width: bw, height: H, fill: "#e8a600", opacity: 0.18 });
    const r = rewards[i];
    if (r) el("rect", { x: x(i) - bw / 2, y: r > 0 ? mid - (r / maxAbs) * (mid - pad) : mid, width: bw, height: (Math.abs(r) / maxAbs) * (mid - pad), fill: r > 0 ? "#1e8e3e" : "#c5221f" });
    if (t.error) el("circle", { cx: x(i), cy: H - 6, r: 3, fill: "#c5221f" });
  });
  if (cumulative.length) el("polyline", { points: cumulative.map((c, i) => `${x(i)},${mid - (c / maxCum) * (mid - pad)}`).join(" "), fill: "none", stroke: "#2f5bd3", "stroke-width": 1.5, "vector-effect": "non-scaling-stroke" });
  const cursor = el("line", { class: "cursor", x1: 0, x2: 0, y1: 0, y2: H, "vector-effect": "non-scaling-stroke" });
  svg.addEventListener("click", (e) => {
    const box = svg.getBoundingClientRect();
    onPick(Math.floor(((e.clientX - box.left) / box.width) * n));
  });
  return { svg, mark: (i) => { const cx = i >= timeline.length ? W - pad : x(i); cursor.setAttribute("x1", cx); cursor.setAttribute("x2", cx); } };
}

// ------------------------------------------------------------------------------ group

async function groupView(groupId) {
  const g = await api(`/groups/${encodeURIComponent(groupId)}`);
  await summary();
  setCrumbs(h("a", { href: "#/" }, "rollouts"), h("span", {}, `group ${groupId}`));
  const maxAdv = Math.max(1, ...g.members.map((m) => Math.abs(m.advantage)));
  const maxTurns = Math.max(1, ...g.members.map((m) => m.first_turn + m.num_turns));
  const forks = g.tree ? g.tree.forks : [];
  const rootFork = g.fork_turn === null ? "–" : g.fork_turn === 0 ? "at the first turn" : `after ${g.fork_turn} identical turn${g.fork_turn === 1 ? "" : "s"}`;
  const forkText = g.tree ? `roots: ${rootFork}; ${forks.length} fork${forks.length === 1 ? "" : "s"} into ${forks.reduce((n, f) => n + f.children.length, 0)} continuations` : rootFork;
  const cards = g.members.map((m) => {
    const link = `#/rollout/${encodeURIComponent(m.session_id)}`;
    const adv = m.advantage;
    const w = (Math.abs(adv) / maxAdv) * 50;
    return h("div", { class: "member", "data-index": m.group_index },
      h("a", { href: link }, h("img", {
        loading: "lazy", alt: `member ${m.group_index}, last frame`, "data-tries": 0,
        src: `${API}/rollouts/${encodeURIComponent(m.session_id)}/frames/${m.num_turns}.png`,
        onerror: (e) => { // the last position is one less when the last turn ran no step
          const img = e.target;
          if (img.dataset.tries === "0" && m.num_turns > 0) { img.dataset.tries = "1"; img.src = img.src.replace(/\/\d+\.png$/, `/${m.num_turns - 1}.png`); }
          else img.replaceWith(h("div", { class: "frame" }, h("div", { class: "none" }, "no frame")));
        },
      })),
      h("div", { style: "display:flex;justify-content:space-between;margin-top:6px" }, h("a", { href: link }, h("b", {}, `#${m.group_index}`)), h("span", { class: "mono" }, `R ${fmt.num(m.total_reward)}`)),
      m.parent_index === null ? null : h("div", { class: "muted", style: "font-size:12px", "data-parent": m.group_index }, `forked from #${m.parent_index} at turn ${m.fork_turn}`),
      h("div", { class: "adv", title: `advantage ${fmt.num(adv, 3)}` }, h("i", { style: `left:${adv >= 0 ? 50 : 50 - w}%;width:${w}%;background:${adv >= 0 ? "#1e8e3e" : "#c5221f"}` })),
      h("div", { class: "muted", style: "font-size:12px" }, `advantage `, h("b", { "data-advantage": m.group_index }, fmt.num(adv, 3)), ` · ${m.num_turns} turns · ${m.achievements_count} ach.`),
      h("div", { class: `stop ${stopIsError(m.stop_reason) ? "err" : ""}` }, m.stop_reason));
  });
  // Tree order: each member followed by the continuations forked from it.
  const ordered = [];
  const place = (m, depth) => {
    ordered.push([m, depth]);
    g.members.filter((c) => c.parent_index === m.group_index).forEach((c) => place(c, depth + 1));
  };
  g.members.filter((m) => m.parent_index === null).forEach((m) => place(m, 0));
  const lanes = h("div", { class: "lanes" }, ordered.map(([m, depth]) => [
    h("span", { style: `padding-left:${12 * depth}px` }, depth ? `↳ #${m.group_index}` : `#${m.group_index}`),
    lane(m, maxTurns, g.fork_turn, forks.filter((f) => f.parent_index === m.group_index))]));
  app.replaceChildren(
    h("h1", {}, "GRPO group ", h("span", { class: "mono", style: "font-size:15px" }, groupId)),
    h("div", { class: "card" }, h("div", { class: "meta" },
      metaItem("members", g.size), metaItem("mean return", fmt.num(g.mean_return, 3)), metaItem("std", fmt.num(g.std_return, 3)),
      metaItem("start", g.start_step ? `env step ${g.start_step} (a snapshot)` : "a fresh reset"),
      metaItem("fork", h("span", { id: "fork" }, forkText)),
      metaItem("list", h("a", { href: `#/?group_id=${encodeURIComponent(groupId)}&sort=total_reward` }, "as a table")))),
    h("div", { class: "members", id: "members" }, cards),
    h("div", { class: "card", style: "margin-top:14px" }, h("h2", {}, g.tree
      ? "The tree, turn by turn (hatched: the parent's turns, shared; orange: a fork, with the value there; green/red: reward)"
      : "Turns side by side (grey: same moves as every member so far; green/red: reward)"), lanes));
}

function lane(m, maxTurns, fork, ownForks) {
  const first = m.first_turn || 0;
  const el = h("div", { class: "lane", title: `${m.num_turns} turns` + (first ? ` from turn ${first}` : "") });
  for (let i = 0; i < maxTurns; i++) {
    const r = (m.rewards || [])[i - first] || 0;
    const cls = i < first ? "shared" : r > 0 ? "r" : r < 0 ? "n" : m.parent_index === null && fork !== null && i < fork ? "same" : "";
    el.append(h("span", { class: cls, style: i >= first + m.num_turns ? "visibility:hidden" : "" }));
  }
  if (first) el.append(h("div", { class: "fork", style: `left:${(100 * first) / maxTurns}%`, title: `forked from #${m.parent_index} at turn ${first}` }));
  else if (fork !== null) el.append(h("div", { class: "fork", style: `left:${(100 * fork) / maxTurns}%`, title: `roots differ from turn ${fork}` }));
  for (const f of ownForks) el.append(h("div", { class: "fork", "data-fork": `${f.parent_index}@${f.turn}`, style: `left:${(100 * f.turn) / maxTurns}%`, title: `fork at turn ${f.turn} into ${f.children.map((c) => "#" + c).join(", ")}; value ${fmt.num(f.value, 3)}` }));
  el.addEventListener("click", () => { location.hash = `#/rollout/${encodeURIComponent(m.session_id)}`; });
  el.style.cursor = "pointer";
  return el;
}

route();
