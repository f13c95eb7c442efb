// jupyter_gpumem offline viewer: a timeline and the block layout after any event.
// Reads the JSON payload built by jupyter_gpumem.render.html.build_payload. No dependencies.

// Pure helpers, apart from the page so that a test can run them without one.
var gpumemViewerHelpers = (function () {
  "use strict";
  var UNITS = [["B", 1], ["KiB", 1024], ["MiB", 1048576], ["GiB", 1073741824],
               ["TiB", 1099511627776]];
  function byteLabel(v) {
    // Exact, in the largest binary unit not above the value: "0", "384 MiB", "1.25 GiB".
    if (v === 0) return "0";
    var u = 0;
    while (u < UNITS.length - 1 && Math.abs(v) >= UNITS[u + 1][1]) u++;
    return String(v / UNITS[u][1]) + " " + UNITS[u][0];
  }
  // Ticks from 0 up to `top` as [value, label] pairs, about `count` steps (default 5):
  // "bytes" steps by a power of two bytes (0, 128 MiB, 256 MiB, ...), "events" by a whole
  // 1, 2 or 5 times a power of ten.
  function axisTicks(top, kind, count) {
    var steps = count || 5, raw = Math.max(top, 0) / steps, step;
    if (kind === "bytes") {
      step = Math.pow(2, Math.max(0, Math.ceil(Math.log2(Math.max(raw, 1)))));
    } else {
      var p = raw > 0 ? Math.pow(10, Math.floor(Math.log10(raw))) : 1, m = raw / p;
      step = Math.max(1, (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p);
    }
    var out = [];
    for (var i = 0; i * step <= top; i++) {
      out.push([i * step, kind === "bytes" ? byteLabel(i * step) : String(i * step)]);
    }
    return out;
  }
  return { axisTicks: axisTicks };
})();

if (typeof document !== "undefined") (function () {
  "use strict";
  var D = JSON.parse(document.getElementById("gm-data").textContent);
  function col(s, T) {
    var bin = atob(s), u = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) u[i] = bin.charCodeAt(i);
    return new T(u.buffer);
  }
  var T = D.timeline, B = D.blocks, S = D.segments;
  var tIdx = col(T.index, Int32Array), tAl = col(T.allocated, Float64Array),
      tRes = col(T.reserved, Float64Array);
  var bStart = col(B.start, Int32Array), bEnd = col(B.end, Int32Array),
      bAddr = col(B.addr, Float64Array), bSize = col(B.size, Float64Array),
      bReq = col(B.req, Float64Array), bStack = col(B.stack, Int32Array),
      bSite = col(B.site, Int32Array), bCell = col(B.cell, Int32Array);
  var sStart = col(S.start, Int32Array), sEnd = col(S.end, Int32Array),
      sAddr = col(S.addr, Float64Array), sSize = col(S.size, Float64Array),
      sStream = col(S.stream, Float64Array), sSmall = col(S.small, Int32Array);
  var n = D.n;
  var COL = { alloc: "#1f77b4", round: "#9ecae1", free: "#d9d9d9", small: "#9467bd",
              large: "#2ca02c", allocated: "#111", reserved: "#d62728" };

  function fmt(b) {
    var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0, s = b < 0 ? "-" : "";
    b = Math.abs(b);
    if (b < 1024) return s + b + " B";
    while (b >= 1024 && i < 4) { b /= 1024; i++; }
    return s + (b < 100 ? b.toFixed(1) : b.toFixed(0)) + " " + u[i];
  }
  function hex(a) { return "0x" + a.toString(16); }
  function fit(canvas, h) {
    var r = window.devicePixelRatio || 1, w = canvas.clientWidth || 800;
    canvas.width = Math.round(w * r); canvas.height = Math.round(h * r);
    canvas.style.height = h + "px";
    var ctx = canvas.getContext("2d"); ctx.setTransform(r, 0, 0, r, 0, 0);
    return { ctx: ctx, w: w, h: h };
  }

  // ---- state after event k: live segments and their blocks (start <= k < end) ------------
  function layoutAt(k) {
    var segs = [], i;
    for (i = 0; i < sStart.length; i++) {
      if (sStart[i] <= k && k < sEnd[i]) {
        segs.push({ addr: sAddr[i], size: sSize[i], stream: sStream[i], small: sSmall[i],
                    blocks: [] });
      }
    }
    segs.sort(function (a, b) { return a.addr - b.addr; });
    var starts = segs.map(function (s) { return s.addr; });
    for (i = 0; i < bStart.length; i++) {
      if (!(bStart[i] <= k && k < bEnd[i])) continue;
      var lo = 0, hi = starts.length - 1, a = bAddr[i], at = -1;
      while (lo <= hi) {
        var mid = (lo + hi) >> 1;
        if (starts[mid] <= a) { at = mid; lo = mid + 1; } else hi = mid - 1;
      }
      if (at >= 0 && a < starts[at] + segs[at].size) segs[at].blocks.push(i);
    }
    segs.forEach(function (s) { s.blocks.sort(function (x, y) { return bAddr[x] - bAddr[y]; }); });
    return segs;
  }

  // ---- timeline ----------------------------------------------------------------------------
  var tl = document.getElementById("gm-timeline"), slider = document.getElementById("gm-slider");
  var ymax = 1, m;
  for (m = 0; m < tRes.length; m++) ymax = Math.max(ymax, tRes[m], tAl[m]);
  var PAD = { l: 70, r: 10, t: 10, b: 20 };
  var cur = n - 1;
  function xOf(i, w) { return PAD.l + (n > 1 ? i / (n - 1) : 0) * (w - PAD.l - PAD.r); }
  function yOf(v, h) { return h - PAD.b - v / (ymax * 1.1) * (h - PAD.t - PAD.b); }
  function drawTimeline() {
    var g = fit(tl, 220), c = g.ctx, w = g.w, h = g.h, i;
    c.clearRect(0, 0, w, h);
    c.fillStyle = "#555"; c.font = "11px sans-serif"; c.strokeStyle = "#eee";
    gpumemViewerHelpers.axisTicks(ymax * 1.1, "bytes").forEach(function (t) {
      var y = yOf(t[0], h);
      c.beginPath(); c.moveTo(PAD.l, y); c.lineTo(w - PAD.r, y); c.stroke();
      c.fillText(t[1], 4, y + 4);
    });
    var axisLeft = w - 40;  // where the axis name "event" starts
    c.textAlign = "center";
    gpumemViewerHelpers.axisTicks(n - 1, "events", 6).forEach(function (t) {
      var x = xOf(t[0], w), half = t[1].length * 3.5 + 4;  // 11px digits are ~6.5px wide
      if (x + half < axisLeft) c.fillText(t[1], x, h - 4);
    });
    c.textAlign = "left";
    c.strokeStyle = "#888"; c.setLineDash([2, 3]);
    D.cells.forEach(function (b) {
      var x = xOf(b[0], w);
      c.beginPath(); c.moveTo(x, PAD.t); c.lineTo(x, h - PAD.b); c.stroke();
      c.fillText("[" + b[1] + "]", x + 2, PAD.t + 9);
    });
    function line(ys, color, dash) {
      c.strokeStyle = color; c.setLineDash(dash); c.lineWidth = 1.3; c.beginPath();
      for (var j = 0; j < tIdx.length; j++) {
        var x = xOf(tIdx[j], w), y = yOf(ys[j], h);
        if (j === 0) c.moveTo(x, y); else { c.lineTo(x, yOf(ys[j - 1], h)); c.lineTo(x, y); }
      }
      c.stroke();
    }
    line(tRes, COL.reserved, [5, 3]); line(tAl, COL.allocated, []);
    c.setLineDash([]); c.lineWidth = 1;
    c.fillStyle = COL.reserved;
    D.ooms.forEach(function (k) { c.fillRect(xOf(k, w) - 3, h - PAD.b - 8, 6, 6); });
    if (D.peak >= 0) {
      var px = xOf(D.peak, w), py = yOf(D.peak_allocated, h);
      c.fillStyle = "#111"; c.beginPath(); c.arc(px, py, 3, 0, 7); c.fill();
      c.fillText("peak " + fmt(D.peak_allocated), Math.min(px + 5, w - 110), py - 5);
    }
    c.strokeStyle = "#1f77b4"; c.beginPath();
    var cx = xOf(Math.max(cur, 0), w); c.moveTo(cx, PAD.t); c.lineTo(cx, h - PAD.b); c.stroke();
    c.fillStyle = "#555"; c.fillText("event", w - 40, h - 4);
  }
  function pick(ev) {
    var r = tl.getBoundingClientRect(), w = r.width;
    var f = (ev.clientX - r.left - PAD.l) / (w - PAD.l - PAD.r);
    setAt(Math.round(Math.max(0, Math.min(1, f)) * (n - 1)));
  }
  var dragging = false;
  tl.addEventListener("mousedown", function (ev) { dragging = true; pick(ev); });
  window.addEventListener("mouseup", function () { dragging = false; });
  tl.addEventListener("mousemove", function (ev) { if (dragging) pick(ev); });

  // ---- block layout --------------------------------------------------------------------------
  var lay = document.getElementById("gm-layout"), tip = document.getElementById("gm-tip");
  var rows = [], rowH = 16, LABEL = 150;
  function drawLayout() {
    rows = layoutAt(cur);
    rowH = rows.length > 60 ? Math.max(1, Math.floor(900 / rows.length)) : 16;
    var label = rowH >= 10, left = label ? LABEL : 12;
    var g = fit(lay, Math.max(30, rows.length * rowH + 10)), c = g.ctx, w = g.w - left - 4;
    c.clearRect(0, 0, g.w, g.h); c.font = "11px sans-serif";
    rows.forEach(function (s, r) {
      var y = 5 + r * rowH, hh = Math.max(1, label ? rowH - 3 : rowH);
      c.fillStyle = s.small ? COL.small : COL.large; c.fillRect(left - 9, y, 6, hh);
      c.fillStyle = COL.free; c.fillRect(left, y, w, hh);
      if (label) {
        c.fillStyle = "#333";
        c.fillText((s.small ? "small" : "large") + " · s" + s.stream + " · " + fmt(s.size),
                   2, y + hh - 2);
      }
      s.blocks.forEach(function (b) {
        var x0 = left + (bAddr[b] - s.addr) / s.size * w, bw = bSize[b] / s.size * w;
        var rw = Math.min(bReq[b], bSize[b]) / s.size * w;
        c.fillStyle = COL.round; c.fillRect(x0, y, Math.max(bw, 0.5), hh);
        c.fillStyle = COL.alloc; c.fillRect(x0, y, Math.max(rw, 0.5), hh);
        if (label && bw > 3) { c.fillStyle = "#fff"; c.fillRect(x0 + bw - 1, y, 1, hh); }
      });
    });
    lay.dataset.segments = String(rows.length);
    lay.dataset.blocks = String(rows.reduce(function (t, s) { return t + s.blocks.length; }, 0));
    lay._left = left; lay._w = w;
  }
  lay.addEventListener("mousemove", function (ev) {
    var r = lay.getBoundingClientRect(), row = Math.floor((ev.clientY - r.top - 5) / rowH);
    var s = rows[row], text = "";
    if (s) {
      var a = s.addr + (ev.clientX - r.left - lay._left) / lay._w * s.size, hit = -1;
      s.blocks.forEach(function (b) { if (bAddr[b] <= a && a < bAddr[b] + bSize[b]) hit = b; });
      if (hit >= 0) {
        text = fmt(bSize[hit]) + " block at " + hex(bAddr[hit]) + "  (requested " +
          fmt(bReq[hit]) + (bCell[hit] >= 0 ? ", cell [" + bCell[hit] + "]" : "") + ")\n" +
          (bSite[hit] >= 0 ? "allocated at " + D.sites[bSite[hit]] + "\n" : "") +
          (bStack[hit] >= 0 ? D.stacks[bStack[hit]].join("\n") : "(allocated before the trace)");
      } else if (a >= s.addr && a < s.addr + s.size) {
        text = "cached free, in a " + fmt(s.size) + " " + (s.small ? "small" : "large") +
          " segment at " + hex(s.addr) + ", stream " + s.stream;
      }
    }
    tip.style.display = text ? "block" : "none";
    tip.textContent = text;
    tip.style.left = Math.min(ev.clientX + 12, window.innerWidth - 420) + "px";
    tip.style.top = (ev.clientY + 12) + "px";
  });
  lay.addEventListener("mouseleave", function () { tip.style.display = "none"; });

  function setAt(k) {
    cur = Math.max(-1, Math.min(n - 1, k));
    slider.value = String(cur);
    document.getElementById("gm-at").textContent =
      cur < 0 ? "before the trace" : "after event " + cur + " of " + n;
    drawTimeline(); drawLayout();
  }
  slider.max = String(n - 1);
  slider.addEventListener("input", function () { setAt(parseInt(slider.value, 10)); });
  document.getElementById("gm-peak").onclick = function () { setAt(D.peak); };
  document.getElementById("gm-end").onclick = function () { setAt(n - 1); };
  document.getElementById("gm-info").textContent = (D.device_name ? D.device_name + " · " : "") +
    n + " events · peak " + fmt(D.peak_allocated) + " allocated";
  window.addEventListener("resize", function () { setAt(cur); });
  window.gpumemViewer = { layoutAt: layoutAt, setAt: setAt, data: D };
  setAt(n - 1);
})();
