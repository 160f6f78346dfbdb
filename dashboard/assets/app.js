// The dashboard's script: it asks the server for data every two seconds and
// writes it into the page. Every value from the server is written as text
// (textContent), never as markup: caller keys come from outsiders.
"use strict";
(function () {
  const body = document.body;
  const page = body.dataset.page, name = body.dataset.name, key = body.dataset.key;
  const every = 2000;
  const q = (o) => Object.entries(o).map(([k, v]) => k + "=" + encodeURIComponent(v)).join("&");
  const $ = (id) => document.getElementById(id);
  const el = (tag, text, cls) => { const e = document.createElement(tag); if (text !== undefined) e.textContent = text; if (cls) e.className = cls; return e; };
  const link = (href, text) => { const a = el("a", text); a.href = href; return a; };
  const fmtRate = (x) => x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2);
  const fmtMs = (ms) => ms <= 0 ? "–" : ms < 1000 ? ms + " ms" : ms < 60000 ? (ms / 1000).toFixed(1) + " s" : ms < 3600000 ? (ms / 60000).toFixed(1) + " min" : (ms / 3600000).toFixed(1) + " h";
  const keyHref = (k) => "key?" + q({ name: name, key: k });

  function status(text, bad) { const s = $("status"); s.textContent = text; s.className = bad ? "status error" : "status"; }

  // answer reads a response: its JSON, or an error saying what came back
  // (a proxy's error page is not JSON).
  async function answer(r) {
    let v = null;
    if ((r.headers.get("Content-Type") || "").startsWith("application/json")) v = await r.json();
    if (!r.ok || v === null) throw new Error((v && v.error) || r.status + " " + r.statusText);
    return v;
  }
  async function get(path) {
    return answer(await fetch(path, { headers: { Accept: "application/json" } }));
  }
  const isoTime = (ms) => { const d = new Date(ms); return isNaN(d.getTime()) ? String(ms) : d.toISOString(); };

  function fill(tbody, rows) {
    tbody.replaceChildren(...rows.map((cells) => {
      const tr = document.createElement("tr");
      for (const c of cells) {
        const td = el("td");
        if (c instanceof Node) td.appendChild(c); else if (c && typeof c === "object") { td.textContent = c.text; td.className = c.cls || ""; } else td.textContent = c;
        tr.appendChild(td);
      }
      return tr;
    }));
  }
  const num = (text) => ({ text: String(text), cls: "num" });

  function stateCells(s, keyCell) {
    if (s.hashed) return [keyCell, "stored by hash", num("–"), num("–"), num("–"), num("–"), num(s.admitted), num(s.heldBack)];
    if (!s.known) return [keyCell, "policy unknown", num("–"), num("–"), num("–"), num(s.leases || "–"), num(s.admitted), num(s.heldBack)];
    const now = s.throttled ? { text: s.blockedForMs > 0 ? "blocked" : "throttled", cls: "bad" } : { text: "admits", cls: "ok" };
    return [keyCell, now, num(s.remaining + " / " + s.limit), num(fmtMs(s.retryAfterMs)), num(fmtMs(s.blockedForMs)), num(s.leases), num(s.admitted), num(s.heldBack)];
  }

  function facts(dl, pairs) {
    dl.replaceChildren();
    for (const [k, v] of pairs) { dl.appendChild(el("dt", k)); const dd = el("dd"); if (v instanceof Node) dd.appendChild(v); else dd.textContent = v; dl.appendChild(dd); }
  }

  function policyFacts(l) {
    const pairs = [["Kind", l.kind + (l.live ? ", live (applies stored policies)" : "")], ["Policy in force", l.policy || "unknown"], ["From", l.source]];
    pairs.push(["Used by rules", (l.rules || []).length ? l.rules.join(", ") : "none recorded"]);
    if (l.codePolicy) pairs.push(["In code", l.codePolicy]);
    if (l.storedPolicy) pairs.push(["Stored", l.storedPolicy]);
    for (const o of l.overrides || []) { const s = el("span"); s.append(link(keyHref(o.key), o.key), " → " + o.policy); pairs.push(["Stored for a key", s]); }
    for (const i of l.invalid || []) pairs.push(["Unreadable stored", i]);
    pairs.push(["Keys in Redis", String(l.keys)]);
    return pairs;
  }

  // The chart: three lines over the last 15 minutes, one point a second.
  const chart = { points: new Map(), svg: null, legend: null };
  function chartInit() {
    const box = $("chart");
    if (!box) return false;
    const ns = "http://www.w3.org/2000/svg";
    chart.svg = document.createElementNS(ns, "svg");
    chart.svg.setAttribute("viewBox", "0 0 900 222");
    chart.lines = {};
    const axis = document.createElementNS(ns, "line");
    for (const [a, v] of Object.entries({ x1: 0, y1: 200, x2: 900, y2: 200, class: "axis" })) axis.setAttribute(a, v);
    chart.svg.appendChild(axis);
    chart.axis = axis;
    const text = (x, y, anchor) => { const t = document.createElementNS(ns, "text"); t.setAttribute("x", x); t.setAttribute("y", y); t.setAttribute("text-anchor", anchor); chart.svg.appendChild(t); return t; };
    chart.max = text(4, 14, "start");
    chart.from = text(4, 216, "start");
    chart.now = text(896, 216, "end");
    chart.now.textContent = "now";
    for (const s of ["admitted", "throttled", "rescheduled"]) {
      const p = document.createElementNS(ns, "polyline");
      p.setAttribute("class", s);
      chart.svg.appendChild(p);
      chart.lines[s] = p;
    }
    chart.legend = el("div", undefined, "legend");
    chart.values = {};
    for (const s of ["admitted", "throttled", "rescheduled"]) {
      const span = el("span"); span.appendChild(el("span", undefined, "sw " + s));
      span.append(s + " ");
      const b = el("b", "0"); b.id = "now-" + s; chart.values[s] = b;
      span.append(b, "/s");
      chart.legend.appendChild(span);
    }
    box.append(chart.svg, chart.legend);
    return true;
  }
  let last = 0;
  async function chartPoll() {
    const args = { name: name };
    if (page === "key") args.key = key;
    // counts come in with the fleet's flushes, a few seconds late: the
    // last half minute is read again each time
    if (last) args.since = last - 30;
    const v = await get("api/series?" + q(args));
    for (const p of v.points) chart.points.set(p[0], p);
    if (v.points.length) last = v.points[v.points.length - 1][0];
    const end = Math.floor(v.now / 1000);
    for (const t of chart.points.keys()) if (t < end - 900) chart.points.delete(t);
    // The chart spans the last 15 minutes, or less when the counts began
    // later (at least a minute): a young fleet's seconds stay readable.
    let top = 1, first = end;
    for (const [t, p] of chart.points) { top = Math.max(top, p[1], p[2], p[3]); if (p[1] || p[2] || p[3]) first = Math.min(first, t); }
    const span = Math.min(900, Math.max(60, end - first + 10)), start = end - span;
    // drawn at the chart's own width, so that its text is not stretched
    const w = Math.max(300, Math.round(chart.svg.clientWidth || 900));
    chart.svg.setAttribute("viewBox", "0 0 " + w + " 222");
    chart.axis.setAttribute("x2", w);
    chart.now.setAttribute("x", w - 4);
    chart.max.textContent = top + "/s";
    chart.from.textContent = span >= 120 ? Math.round(span / 60) + " min ago" : span + " s ago";
    ["admitted", "throttled", "rescheduled"].forEach((s, i) => {
      const pts = [];
      for (let t = start; t < end; t++) { const p = chart.points.get(t); const y = p ? p[i + 1] : 0; pts.push(((t - start) * w / span).toFixed(1) + "," + (200 - 180 * y / top).toFixed(1)); }
      chart.lines[s].setAttribute("points", pts.join(" "));
      // the latest second the fleet has surely written: three seconds back
      const p = chart.points.get(end - 3);
      chart.values[s].textContent = String(p ? p[i + 1] : 0);
    });
  }

  async function overview() {
    const v = await get("api/overview");
    $("fleet").textContent = v.processes.length + " process" + (v.processes.length === 1 ? "" : "es") + " publishing counts" + (v.processes.length ? ": " + v.processes.join(", ") : "") + ".";
    fill($("limiters").tBodies[0], v.limiters.map((l) => [link("limiter?" + q({ name: l.name }), l.name), (l.rules || []).join(", ") || "–", l.kind, l.policy || "unknown", l.source,
      num(l.keys), num(fmtRate(l.rates.admitted)), num(fmtRate(l.rates.throttled)), num(fmtRate(l.rates.rescheduled)), num(l.heldBack)]));
  }

  let keysPage = 1, keysPages = 1;
  async function limiter() {
    const v = await get("api/limiter?" + q({ name: name }));
    facts($("policy"), policyFacts(v.limiter));
    fill($("hottest").tBodies[0], v.hottest.map((s) => stateCells(s, link(keyHref(s.key), s.key))));
    const k = await get("api/keys?" + q({ name: name, prefix: $("prefix").value, sort: $("sort").value, page: keysPage }));
    keysPage = k.page; keysPages = k.pages;
    $("pageinfo").textContent = "page " + k.page + " of " + k.pages + " (" + k.total + " keys)";
    fill($("keys").tBodies[0], k.rows.map((s) => stateCells(s, link(keyHref(s.key), s.key))));
  }

  async function keyPage() {
    const v = await get("api/key?" + q({ name: name, key: key }));
    const s = v.state, cap = v.limiter.kind === "concurrency";
    const pairs = [["Limiter", link("limiter?" + q({ name: name }), name)], ["Policy in force", s.policy || "unknown"], ["From", s.source || ""]];
    if (s.hashed) pairs.push(["State", "stored by hash: not readable"]);
    else if (!s.known) pairs.push(["State", "not readable: the limiter's policy is not known here"]);
    else if (cap) {
      pairs.push(["Now", s.throttled ? "every slot taken" : "a slot is free"], ["Leases held", s.leases + " of " + s.limit]);
    } else {
      pairs.push(["Now", s.throttled ? (s.blockedForMs > 0 ? "blocked" : "throttled") : "admits"]);
      pairs.push(["Remaining", s.remaining + " of " + s.limit], ["Retry after", fmtMs(s.retryAfterMs)], ["Blocked for", fmtMs(s.blockedForMs)], ["Full again in", fmtMs(s.resetAfterMs)]);
    }
    // a cap has no block and no stored policy: only its reset applies
    document.querySelectorAll("#act [data-rate]").forEach((e) => { e.hidden = cap; });
    pairs.push(["Admitted, 15 min", String(s.admitted)], ["Held back, 15 min", String(s.heldBack)]);
    facts($("state"), pairs);
    const sh = v.shares || { holders: [] }, holders = sh.holders || [];
    $("shares-section").hidden = !sh.leased;
    if (sh.leased) {
      $("shares-note").textContent = (holders.length === 0 ? "No process holds a share of this key's rate" :
        holders.length + " process" + (holders.length === 1 ? " holds a share" : "es hold shares") + " of this key's rate, and decide within them in memory") +
        "; Redis decides the rest for the others: " + fmtRate(sh.restRatePerSecond) + "/s, burst " + sh.restBurst.toFixed(2) + " (" + sh.restTokens.toFixed(2) + " left). The state above is the rest's.";
      fill($("shares").tBodies[0], holders.map((hd) => [hd.holder, num(fmtRate(hd.ratePerSecond) + "/s"), num(hd.burst.toFixed(2)), num(fmtMs(hd.leaseEndsInMs)), num(fmtRate(hd.askedPerSecond) + "/s")]));
    }
    const b = v.bookings, tickets = b.tickets || [];
    $("ahead").textContent = v.limiter.leased ? "A limiter with leased shares books nothing ahead." : !b.meter ? "Only TokenBucket and GCRA keys book ahead." :
      "Capacity taken for the next " + fmtMs(b.aheadMs) + "; " + tickets.length + " ticket" + (tickets.length === 1 ? "" : "s") + " booked; " + b.waiting + " task" + (b.waiting === 1 ? "" : "s") + " in the waiting room.";
    fill($("bookings").tBodies[0], tickets.map((t) => [t.ticket, isoTime(t.untilMs), num(fmtMs(t.inMs))]));
    const flows = b.flows || [];
    $("room").textContent = v.limiter.leased ? "A limiter with leased shares has no waiting room." : !b.meter ? "Only TokenBucket and GCRA keys have a waiting room." : b.waiting === 0 ? "No task waits in this key's waiting room." :
      b.waiting + " task" + (b.waiting === 1 ? "" : "s") + " wait; the last is expected to start in " + fmtMs(b.expectedWaitMs) + ", at the policy in force.";
    fill($("waiting").tBodies[0], flows.map((f) => [f.flow, num(String(f.waiting)), num(String(f.first)), num(fmtMs(f.expectedWaitMs))]));
  }

  function actions() {
    const form = $("act");
    if (!form) return;
    const token = $("token");
    token.value = sessionStorage.getItem("jobthrottle-token") || "";
    form.addEventListener("submit", (e) => e.preventDefault());
    form.querySelectorAll("button[data-act]").forEach((btn) => btn.addEventListener("click", async () => {
      sessionStorage.setItem("jobthrottle-token", token.value);
      const req = { action: btn.dataset.act, name: name, key: page === "key" ? key : "" };
      if ($("duration")) req.duration = $("duration").value;
      if (req.action === "set") req.policy = $("policy-in").value;
      const out = $("act-result");
      try {
        const r = await fetch("api/action", { method: "POST", headers: { "Content-Type": "application/json", "X-Dashboard-Token": token.value }, body: JSON.stringify(req) });
        let v;
        try { v = await answer(r); } catch (err) { out.textContent = "Refused: " + err.message; out.className = "note bad"; return; }
        out.textContent = "Done: " + v.message;
        out.className = "note ok";
        tick();
      } catch (err) { out.textContent = "Failed: " + err.message; out.className = "note bad"; }
    }));
  }

  const hasChart = chartInit();
  const refresh = { overview: overview, limiter: limiter, key: keyPage }[page];
  let busy = false;
  async function tick() {
    if (busy) return;
    busy = true;
    try {
      await refresh();
      if (hasChart) await chartPoll();
      status("updated " + new Date().toLocaleTimeString());
    } catch (err) { status(err.message, true); }
    busy = false;
  }
  if ($("crumb-limiter")) $("crumb-limiter").href = "limiter?" + q({ name: name });
  if ($("search")) {
    $("search").addEventListener("submit", (e) => { e.preventDefault(); keysPage = 1; tick(); });
    $("sort").addEventListener("change", () => { keysPage = 1; tick(); });
    $("prev").addEventListener("click", () => { if (keysPage > 1) { keysPage--; tick(); } });
    $("next").addEventListener("click", () => { if (keysPage < keysPages) { keysPage++; tick(); } });
  }
  actions();
  tick();
  setInterval(tick, every);
})();
