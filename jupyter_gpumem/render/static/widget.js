// jupyter_gpumem live widget: our own drawing on a canvas (timeline) and an SVG (block layout).
// No libraries, no network. Data arrives as binary columns (see widget_payload.py).

const STATE_COLORS = ["#1f77b4", "#ff7f0e", "#d9d9d9"]; // allocated, pending free, cached free
const STATE_NAMES = ["allocated", "pending free", "cached free"];
const WASTE_COLOR = "#9ecae1";
const ALLOCATED_COLOR = "#111111";
const RESERVED_COLOR = "#d62728";
const DEVICE_COLOR = "#7f7f7f";
const OTHER_COLOR = "#bbbbbb";
const BAND_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2",
  "#17becf", "#bcbd22", "#7f7f7f", "#d62728"];
const MAX_DRAWN_BLOCKS = 50000;
const SVG_NS = "http://www.w3.org/2000/svg";

// -- data helpers -------------------------------------------------------------------------------

function bytesOf(data) {
  // A buffer arrives as a DataView (or ArrayBuffer / typed array); copy it so it is aligned.
  if (data instanceof ArrayBuffer) return new Uint8Array(data).slice();
  if (ArrayBuffer.isView(data)) {
    return new Uint8Array(data.buffer, data.byteOffset, data.byteLength).slice();
  }
  return new Uint8Array(0);
}

function typed(col) {
  const bytes = bytesOf(col.data);
  if (col.dtype === "f8") return new Float64Array(bytes.buffer, 0, bytes.byteLength / 8);
  if (col.dtype === "i4") return new Int32Array(bytes.buffer, 0, bytes.byteLength / 4);
  return bytes;
}

function columns(list) {
  const out = {};
  for (const col of list || []) out[col.name] = typed(col);
  return out;
}

function fmtBytes(b) {
  if (b === null || b === undefined || Number.isNaN(b)) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let u = 0;
  let v = Math.abs(b);
  while (v >= 1024 && u < units.length - 1) { v /= 1024; u += 1; }
  const s = u === 0 ? String(v) : v.toFixed(v >= 100 ? 0 : v >= 10 ? 1 : 2);
  return `${b < 0 ? "-" : ""}${s} ${units[u]}`;
}

function hex(n) { return `0x${Math.round(n).toString(16)}`; }

// Every value from the data that goes into markup goes through esc(): a loaded snapshot is
// untrusted, and any of its strings (file, line, name, site, label) may hold markup.
function esc(s) {
  return String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function stackHtml(stack) {
  if (!Array.isArray(stack) || !stack.length) {
    return '<div class="gm-stack gm-muted">no stack recorded</div>';
  }
  const lines = stack.map((frame) => {
    const [file, line, name] = Array.isArray(frame) ? frame : ["?", "?", frame];
    return `<div>${esc(name)} <span class="gm-muted">${esc(file)}:${esc(line)}</span></div>`;
  });
  return `<div class="gm-stack">${lines.join("")}</div>`;
}

// Ticks from 0 up to `top` as [value, label] pairs, about `count` steps (default 5): "bytes"
// steps by a power of two bytes (0, 128 MiB, 256 MiB, ...), "events" by a whole 1, 2 or 5
// times a power of ten, "seconds" by 1, 2 or 5 times any power of ten.
export function axisTicks(top, kind, count = 5) {
  const raw = Math.max(top, 0) / count;
  let step;
  let digits = 0;
  if (kind === "bytes") {
    step = 2 ** Math.max(0, Math.ceil(Math.log2(Math.max(raw, 1))));
  } else {
    const e = raw > 0 ? Math.floor(Math.log10(raw)) : 0;
    const m = raw / 10 ** e;
    const mult = m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10;
    step = mult * 10 ** e;
    if (kind === "events") step = Math.max(1, step);
    else digits = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
  }
  const out = [];
  for (let i = 0; i * step <= top * (1 + 1e-12); i++) {
    const v = kind === "seconds" ? Number((i * step).toFixed(digits)) : i * step;
    out.push([v, kind === "bytes" ? byteTickLabel(v) : kind === "seconds" ? `${v} s` : String(v)]);
  }
  return out;
}

function byteTickLabel(v) {
  // Exact, in the largest binary unit not above the value: "0", "384 MiB", "1.25 GiB".
  if (v === 0) return "0";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let u = 0;
  while (u < units.length - 1 && Math.abs(v) >= 1024 ** (u + 1)) u += 1;
  return `${v / 1024 ** u} ${units[u]}`;
}

// The block states the layout's key names, given the bytes in each state: allocated and
// cached free always, pending free only where a block is pending (CuPy never has one).
export function layoutStates(stateBytes) {
  return [0, 1, 2].filter((s) => s !== 1 || stateBytes[1] > 0);
}

// Draw (xs[i], ys[i]) with one vertical stroke per pixel column from its min to its max, so a
// million points cost one pass and no peak is lost.
function drawMinMax(ctx, xs, ys, n, px, py, color, dashed) {
  if (n === 0) return;
  ctx.beginPath();
  ctx.strokeStyle = color;
  ctx.lineWidth = 1.3;
  ctx.setLineDash(dashed ? [4, 3] : []);
  let col = null; let lo = 0; let hi = 0; let last = 0; let started = false;
  const flush = () => {
    if (col === null) return;
    ctx.lineTo(col, py(lo)); ctx.lineTo(col, py(hi)); ctx.lineTo(col, py(last));
  };
  for (let i = 0; i < n; i++) {
    const y = ys[i];
    if (Number.isNaN(y)) continue;
    const c = Math.round(px(xs[i]));
    if (c !== col) {
      flush();
      if (!started) { ctx.moveTo(c, py(y)); started = true; } else ctx.lineTo(c, py(last));
      col = c; lo = y; hi = y;
    }
    if (y < lo) lo = y;
    if (y > hi) hi = y;
    last = y;
  }
  flush();
  ctx.stroke();
  ctx.setLineDash([]);
}

function lowerBound(arr, n, x) {
  let lo = 0; let hi = n;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (arr[mid] < x) lo = mid + 1; else hi = mid; }
  return lo;
}

// -- the view ------------------------------------------------------------------------------------

function render({ model, el }) {
  el.classList.add("gm-root");
  el.innerHTML = `
    <div class="gm-head">
      <span class="gm-title"></span>
      <span class="gm-tabs"><button data-tab="trace">trace</button><button data-tab="live">live samples</button></span>
      <span class="gm-status gm-muted"></span>
    </div>
    <div class="gm-plot"><canvas class="gm-timeline"></canvas></div>
    <div class="gm-legend"></div>
    <div class="gm-info gm-muted">Click the timeline to see the allocation under it.</div>
    <div class="gm-layout-head"></div>
    <div class="gm-layout-wrap"></div>
    <div class="gm-tip" hidden></div>`;
  const $ = (sel) => el.querySelector(sel);
  const canvas = $(".gm-timeline");
  const status = $(".gm-status");
  const info = $(".gm-info");
  const tip = $(".gm-tip");
  const layoutWrap = $(".gm-layout-wrap");
  const layoutHead = $(".gm-layout-head");
  const legend = $(".gm-legend");
  const tabs = $(".gm-tabs");

  // live samples, grown by doubling
  const S = { n: 0, cap: 0, t: null, a: null, r: null, d: null };
  function grow(need) {
    if (need <= S.cap) return;
    const cap = Math.max(256, S.cap * 2, need);
    for (const k of ["t", "a", "r", "d"]) {
      const next = new Float64Array(cap);
      if (S[k]) next.set(S[k].subarray(0, S.n));
      S[k] = next;
    }
    S.cap = cap;
  }
  function addRows(rows, from, count) {
    grow(S.n + count);
    for (let i = from; i < count; i++) {
      S.t[S.n] = rows[4 * i]; S.a[S.n] = rows[4 * i + 1];
      S.r[S.n] = rows[4 * i + 2]; S.d[S.n] = rows[4 * i + 3];
      S.n += 1;
    }
  }

  let T = null; // the final trace timeline, decoded
  let L = null; // the block layout, decoded
  let tab = "trace";
  let hoverX = null;
  let frame = 0;
  let plotBox = null; // mapping of the current drawing, for mouse handling

  function loadTimeline() {
    const p = model.get("timeline") || {};
    if (!p.n_events) { T = null; return; }
    const c = columns(p.columns);
    const bands = (p.bands || []).map(typed);
    const m = p.n_points;
    const cum = [];
    let below = new Float64Array(m);
    for (const b of bands) {
      const top = new Float64Array(m);
      for (let i = 0; i < m; i++) top[i] = below[i] + b[i];
      cum.push(top); below = top;
    }
    T = { p, m, idx: c.index, time: c.time_s, alloc: c.allocated, res: c.reserved, cum };
  }

  function loadLayout() {
    const p = model.get("block_layout") || {};
    if (p.n_segments === undefined) { L = null; return; }
    L = { p, seg: columns(p.segments), blk: columns(p.blocks) };
  }

  function loadFrozenSamples() {
    const s = model.get("samples") || {};
    if (!s.n || S.n >= s.n) return;
    const rows = typed({ dtype: "f8", data: s.data });
    addRows(rows, S.n, s.n);
  }

  function schedule() {
    if (frame) return;
    frame = requestAnimationFrame(() => { frame = 0; drawTimeline(); });
  }

  // -- timeline drawing --------------------------------------------------------------------

  function showing() {
    const hasTrace = T !== null;
    const hasLive = S.n > 0;
    tabs.hidden = !(hasTrace && hasLive);
    for (const b of tabs.querySelectorAll("button")) b.classList.toggle("gm-on", b.dataset.tab === tab);
    if (hasTrace && (tab === "trace" || !hasLive)) return "trace";
    return "live";
  }

  function drawTimeline() {
    const width = Math.max(320, el.clientWidth || 760);
    const height = 230;
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
    canvas.style.width = `${width}px`;
    canvas.style.height = `${height}px`;
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    const what = showing();
    el.dataset.mode = model.get("mode");
    el.dataset.showing = what;
    el.dataset.sampleCount = String(S.n);
    canvas.dataset.sampleCount = String(S.n);
    canvas.dataset.points = String(what === "trace" ? T.m : S.n);
    const box = { l: 66, r: width - 12, t: 12, b: height - 24 };
    let xmax; let ymax; let xs; let n;
    if (what === "trace") {
      n = T.m; xs = T.idx;
      xmax = Math.max(1, T.p.n_events - 1);
      ymax = Math.max(T.p.peak.reserved, T.p.peak.allocated, 1);
    } else {
      n = S.n; xs = S.t;
      xmax = Math.max(n ? S.t[n - 1] : 0, 1);
      ymax = 1;
      for (let i = 0; i < n; i++) {
        ymax = Math.max(ymax, S.a[i], S.r[i], Number.isNaN(S.d[i]) ? 0 : S.d[i]);
      }
    }
    ymax *= 1.08;
    const px = (x) => box.l + (x / xmax) * (box.r - box.l);
    const py = (y) => box.b - (y / ymax) * (box.b - box.t);
    plotBox = { box, xmax, ymax, px, py, what };
    axes(ctx, box, xmax, ymax, px, py, what === "trace" ? "event" : "seconds");
    if (n === 0) {
      ctx.fillStyle = "#888";
      ctx.fillText("waiting for samples…", box.l + 10, box.t + 20);
      status.textContent = "";
      legendFor(what);
      return;
    }
    if (what === "trace") drawTrace(ctx, px, py, box);
    else {
      drawMinMax(ctx, S.t, S.d, n, px, py, DEVICE_COLOR, true);
      drawMinMax(ctx, S.t, S.r, n, px, py, RESERVED_COLOR, false);
      drawMinMax(ctx, S.t, S.a, n, px, py, ALLOCATED_COLOR, false);
      const k = n - 1;
      status.textContent = `${model.get("mode") === "live" ? "live" : "sampled"} · ${n} samples · ` +
        `allocated ${fmtBytes(S.a[k])} · reserved ${fmtBytes(S.r[k])}` +
        (Number.isNaN(S.d[k]) ? "" : ` · device used ${fmtBytes(S.d[k])}`);
    }
    if (hoverX !== null && hoverX >= box.l && hoverX <= box.r) {
      ctx.strokeStyle = "rgba(0,0,0,0.35)";
      ctx.beginPath(); ctx.moveTo(hoverX + 0.5, box.t); ctx.lineTo(hoverX + 0.5, box.b); ctx.stroke();
    }
    legendFor(what);
  }

  function axes(ctx, box, xmax, ymax, px, py, xlabel) {
    ctx.font = "11px sans-serif";
    ctx.fillStyle = "#666";
    ctx.strokeStyle = "#eee";
    ctx.lineWidth = 1;
    ctx.textAlign = "right"; ctx.textBaseline = "middle";
    for (const [y, label] of axisTicks(ymax, "bytes")) {
      const yy = Math.round(py(y)) + 0.5;
      ctx.beginPath(); ctx.moveTo(box.l, yy); ctx.lineTo(box.r, yy); ctx.stroke();
      ctx.fillText(label, box.l - 6, yy);
    }
    ctx.textAlign = "center"; ctx.textBaseline = "top";
    for (const [x, label] of axisTicks(xmax, xlabel === "seconds" ? "seconds" : "events", 6)) {
      ctx.fillText(label, px(x), box.b + 5);
    }
    ctx.strokeStyle = "#999";
    ctx.beginPath(); ctx.moveTo(box.l + 0.5, box.t); ctx.lineTo(box.l + 0.5, box.b + 0.5);
    ctx.lineTo(box.r, box.b + 0.5); ctx.stroke();
  }

  function drawTrace(ctx, px, py, box) {
    const { m, idx, cum, p } = T;
    // site bands, stacked bottom-up, "other" last
    for (let g = cum.length - 1; g >= 0; g--) {
      const top = cum[g];
      const bottom = g > 0 ? cum[g - 1] : null;
      ctx.beginPath();
      for (let i = 0; i < m; i++) ctx.lineTo(px(idx[i]), py(top[i]));
      for (let i = m - 1; i >= 0; i--) ctx.lineTo(px(idx[i]), py(bottom ? bottom[i] : 0));
      ctx.closePath();
      ctx.globalAlpha = 0.55;
      ctx.fillStyle = g === cum.length - 1 ? OTHER_COLOR : BAND_COLORS[g % BAND_COLORS.length];
      ctx.fill();
      ctx.globalAlpha = 1;
    }
    // cell boundaries
    ctx.strokeStyle = "#555"; ctx.setLineDash([2, 3]); ctx.fillStyle = "#555";
    ctx.textAlign = "left"; ctx.textBaseline = "top";
    for (const [i, cell] of p.cells || []) {
      const x = Math.round(px(i)) + 0.5;
      ctx.beginPath(); ctx.moveTo(x, box.t); ctx.lineTo(x, box.b); ctx.stroke();
      ctx.fillText(`[${cell}]`, x + 2, box.t);
    }
    ctx.setLineDash([]);
    drawMinMax(ctx, idx, T.res, m, px, py, RESERVED_COLOR, false);
    drawMinMax(ctx, idx, T.alloc, m, px, py, ALLOCATED_COLOR, false);
    // OOMs
    ctx.strokeStyle = RESERVED_COLOR; ctx.lineWidth = 2;
    for (const [i, a] of p.ooms || []) {
      const x = px(i); const y = py(a);
      ctx.beginPath(); ctx.moveTo(x - 4, y - 4); ctx.lineTo(x + 4, y + 4);
      ctx.moveTo(x + 4, y - 4); ctx.lineTo(x - 4, y + 4); ctx.stroke();
    }
    ctx.lineWidth = 1;
    // peak
    const pk = p.peak;
    const x = px(pk.index); const y = py(pk.allocated);
    canvas.dataset.peakX = x.toFixed(1);
    canvas.dataset.peakY = y.toFixed(1);
    canvas.dataset.baseY = String(box.b);
    ctx.fillStyle = ALLOCATED_COLOR;
    ctx.beginPath(); ctx.arc(x, y, 3.5, 0, 2 * Math.PI); ctx.fill();
    ctx.textAlign = x > (box.l + box.r) / 2 ? "right" : "left"; ctx.textBaseline = "bottom";
    ctx.fillText(`peak ${fmtBytes(pk.allocated)} @ event ${pk.index}`, x + (ctx.textAlign === "left" ? 6 : -6), y - 3);
    status.textContent = `${p.n_events.toLocaleString()} events (${m.toLocaleString()} drawn)` +
      ` · peak allocated ${fmtBytes(pk.allocated)} · peak reserved ${fmtBytes(pk.reserved)}` +
      (p.n_ooms ? ` · ${p.n_ooms} OOM` : "");
  }

  function legendFor(what) {
    const item = (color, label, dashed) =>
      `<span class="gm-key"><i style="background:${color}${dashed ? ";opacity:.6" : ""}"></i>${esc(label)}</span>`;
    const parts = [item(ALLOCATED_COLOR, "allocated"), item(RESERVED_COLOR, "reserved")];
    if (what === "live") parts.push(item(DEVICE_COLOR, "device used (NVML)", true));
    if (what === "trace") {
      T.p.band_labels.forEach((label, g) => {
        const last = g === T.p.band_labels.length - 1;
        parts.push(item(last ? OTHER_COLOR : BAND_COLORS[g % BAND_COLORS.length], label));
      });
    }
    legend.innerHTML = parts.join("");
  }

  // -- timeline mouse ----------------------------------------------------------------------

  function pointAt(ev) {
    const rect = canvas.getBoundingClientRect();
    return { x: ev.clientX - rect.left, y: ev.clientY - rect.top };
  }

  function onMove(ev) {
    hoverX = pointAt(ev).x;
    schedule();
  }

  function onLeave() { hoverX = null; schedule(); }

  function onClick(ev) {
    if (!plotBox) return;
    const { x, y } = pointAt(ev);
    const { box, xmax, ymax, what } = plotBox;
    if (x < box.l || x > box.r) return;
    const xv = ((x - box.l) / (box.r - box.l)) * xmax;
    const yv = ((box.b - y) / (box.b - box.t)) * ymax;
    if (what === "live") {
      if (!S.n) return;
      const k = Math.min(lowerBound(S.t, S.n, xv), S.n - 1);
      info.innerHTML = `<b>${S.t[k].toFixed(2)} s</b>: allocated ${fmtBytes(S.a[k])},` +
        ` reserved ${fmtBytes(S.r[k])}` +
        (Number.isNaN(S.d[k]) ? "" : `, device used ${fmtBytes(S.d[k])}`);
      return;
    }
    const k = Math.min(lowerBound(T.idx, T.m, xv), T.m - 1);
    const event = T.idx[k];
    let band = -1;
    for (let g = 0; g < T.cum.length; g++) {
      const lo = g > 0 ? T.cum[g - 1][k] : 0;
      if (yv >= lo && yv < T.cum[g][k]) { band = g; break; }
    }
    const head = `<b>event ${event}</b>: allocated ${fmtBytes(T.alloc[k])}, reserved ${fmtBytes(T.res[k])}`;
    if (band < 0) {
      info.innerHTML = `${head}<div class="gm-muted">${yv <= T.res[k] ? "cached by the pool, not allocated" : "above reserved"}</div>`;
      delete info.dataset.band;
      return;
    }
    const lo = band > 0 ? T.cum[band - 1][k] : 0;
    const bandBytes = T.cum[band][k] - lo;
    info.dataset.band = String(band);
    info.innerHTML = `${head}<div><b>${esc(T.p.band_labels[band])}</b>: ${fmtBytes(bandBytes)} live</div>` +
      `<div class="gm-pick gm-muted">asking the kernel for the allocation…</div>` +
      stackHtml(T.p.band_stacks[band]);
    model.send({ type: "pick", event, band, offset: yv - lo });
  }

  function showPicked(a) {
    const slot = info.querySelector(".gm-pick");
    if (!a) { if (slot) slot.textContent = "no single allocation here"; return; }
    info.dataset.pickedAddr = hex(a.addr);
    const life = `allocated at event ${esc(a.alloc_event ?? "(before the trace)")}` +
      (a.free_event !== null ? `, freed at event ${esc(a.free_event)}` : ", still live at the end");
    info.innerHTML = `<b>event ${esc(a.event)}</b>: allocation ${esc(hex(a.addr))} · ${esc(fmtBytes(a.size))}` +
      (a.requested !== null ? ` (requested ${esc(fmtBytes(a.requested))})` : "") +
      `<div class="gm-muted">${esc(a.site)} · ${life}</div>${stackHtml(a.stack)}`;
  }

  // -- block layout ------------------------------------------------------------------------

  function drawLayout() {
    if (!L) { layoutWrap.innerHTML = ""; layoutHead.textContent = ""; return; }
    const width = Math.max(320, el.clientWidth || 760);
    const labelW = 200; const rowH = 14; const gap = 3;
    const barW = width - labelW - 14;
    const { seg, blk, p } = L;
    const nSeg = p.n_segments;
    const parts = [];
    let drawn = 0;
    for (let i = 0; i < nSeg; i++) {
      const y = i * (rowH + gap);
      const total = seg.total_size[i];
      parts.push(`<text class="gm-seglabel" x="${labelW - 6}" y="${y + rowH - 3}">${hex(seg.address[i])} ${fmtBytes(total)} ${seg.large[i] ? "large" : "small"} s${seg.stream[i]}</text>`);
      parts.push(`<rect class="gm-seg" x="${labelW}" y="${y}" width="${barW}" height="${rowH}"/>`);
    }
    const nb = p.n_blocks;
    for (let k = 0; k < nb && drawn < MAX_DRAWN_BLOCKS; k++) {
      const i = blk.segment[k];
      const total = seg.total_size[i];
      const y = i * (rowH + gap);
      const x = labelW + (blk.offset[k] / total) * barW;
      const w = Math.max((blk.size[k] / total) * barW, 0.5);
      const st = blk.state[k];
      parts.push(`<rect class="gm-block" data-i="${k}" data-state="${st}" x="${x.toFixed(2)}" y="${y}" width="${w.toFixed(2)}" height="${rowH}" fill="${STATE_COLORS[st] || "#000"}"/>`);
      const req = blk.requested[k];
      if (st !== 2 && req > 0 && req < blk.size[k]) {
        const wx = x + (req / total) * barW;
        const ww = ((blk.size[k] - req) / total) * barW;
        if (ww >= 0.5) parts.push(`<rect class="gm-waste" x="${wx.toFixed(2)}" y="${y + 3}" width="${ww.toFixed(2)}" height="${rowH - 6}" fill="${WASTE_COLOR}"/>`);
      }
      drawn += 1;
    }
    const h = Math.max(nSeg * (rowH + gap), rowH);
    layoutWrap.innerHTML = `<svg xmlns="${SVG_NS}" class="gm-layout" width="${width - 4}" height="${h}" data-block-count="${nb}" data-segment-count="${nSeg}" data-drawn-blocks="${drawn}">${parts.join("")}</svg>`;
    const state = [0, 0, 0];
    for (let k = 0; k < nb; k++) state[blk.state[k]] += blk.size[k];
    layoutHead.innerHTML = `<b>Block layout</b> · ${nSeg} segments · ${nb} blocks` +
      (drawn < nb ? ` (${drawn} drawn)` : "") +
      layoutStates(state).map((s) => ` <span class="gm-key"><i style="background:${STATE_COLORS[s]}"></i>${STATE_NAMES[s]} ${fmtBytes(state[s])}</span>`).join("") +
      ` <span class="gm-key"><i style="background:${WASTE_COLOR}"></i>rounding</span>`;
  }

  function blockHtml(k) {
    const { seg, blk, p } = L;
    const i = blk.segment[k];
    const st = blk.state[k];
    const sid = blk.stack[k];
    const addr = seg.address[i] + blk.offset[k];
    return `<b>${hex(addr)}</b> · ${fmtBytes(blk.size[k])} · ${STATE_NAMES[st]}` +
      (st !== 2 ? ` (requested ${fmtBytes(blk.requested[k])})` : "") +
      `<div class="gm-muted">segment ${hex(seg.address[i])}, ${seg.large[i] ? "large" : "small"} pool, stream ${seg.stream[i]}</div>` +
      (st !== 2 ? stackHtml(sid >= 0 ? p.stacks[sid] : null) : "");
  }

  function onLayoutMove(ev) {
    const k = ev.target && ev.target.dataset ? ev.target.dataset.i : undefined;
    if (k === undefined || !L) { tip.hidden = true; return; }
    tip.innerHTML = blockHtml(Number(k));
    tip.dataset.i = k;
    const rect = el.getBoundingClientRect();
    tip.style.left = `${Math.min(ev.clientX - rect.left + 12, Math.max(0, rect.width - 340))}px`;
    tip.style.top = `${ev.clientY - rect.top + 14}px`;
    tip.hidden = false;
  }

  function onLayoutClick(ev) {
    const k = ev.target && ev.target.dataset ? ev.target.dataset.i : undefined;
    if (k !== undefined && L) info.innerHTML = blockHtml(Number(k));
  }

  // -- wiring ------------------------------------------------------------------------------

  function onCustom(msg, buffers) {
    if (msg.type === "samples") {
      if (msg.first > S.n) { model.send({ type: "ready", have: S.n }); return; }
      const rows = typed({ dtype: "f8", data: buffers[0] });
      addRows(rows, S.n - msg.first, msg.n);
      schedule();
    } else if (msg.type === "picked") {
      showPicked(msg.allocation);
    }
  }

  const onTimeline = () => { loadTimeline(); schedule(); };
  const onLayout = () => { loadLayout(); drawLayout(); };
  const onSamples = () => { loadFrozenSamples(); schedule(); };
  const onTitle = () => { $(".gm-title").textContent = model.get("title") || "GPU memory"; };
  const handlers = [
    ["msg:custom", onCustom],
    ["change:timeline", onTimeline],
    ["change:block_layout", onLayout],
    ["change:samples", onSamples],
    ["change:mode", schedule],
    ["change:title", onTitle],
  ];
  for (const [name, fn] of handlers) model.on(name, fn);
  canvas.addEventListener("mousemove", onMove);
  canvas.addEventListener("mouseleave", onLeave);
  canvas.addEventListener("click", onClick);
  layoutWrap.addEventListener("mousemove", onLayoutMove);
  layoutWrap.addEventListener("mouseleave", () => { tip.hidden = true; });
  layoutWrap.addEventListener("click", onLayoutClick);
  tabs.addEventListener("click", (ev) => {
    if (ev.target.dataset && ev.target.dataset.tab) { tab = ev.target.dataset.tab; schedule(); }
  });
  let lastWidth = 0;
  const ro = new ResizeObserver(() => {
    const w = el.clientWidth;
    if (w && w !== lastWidth) { lastWidth = w; schedule(); drawLayout(); }
  });
  ro.observe(el);

  onTitle();
  loadTimeline();
  loadLayout();
  loadFrozenSamples();
  drawTimeline();
  drawLayout();
  if (model.get("mode") === "live") model.send({ type: "ready", have: S.n });

  return () => {
    for (const [name, fn] of handlers) model.off(name, fn);
    ro.disconnect();
    if (frame) cancelAnimationFrame(frame);
  };
}

export default { render };
