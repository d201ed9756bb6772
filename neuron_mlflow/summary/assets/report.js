/* neuron-mlflow report.html: the window's timeline on a canvas (wheel zoom, drag pan, hover,
   click to select an operator and highlight all its calls). Reads the JSON in #nm-data. */
"use strict";
(function () {
  var DATA = NM.data();
  var T = DATA.timeline;
  var selected = -1;  // selected name id (an operator name), -1 for none
  var api = { drawn: {}, view: null, select: null, locate: null, ready: false };
  window.nmReport = api;

  function selectRows(name) {
    document.querySelectorAll(".op-row").forEach(function (row) {
      row.classList.toggle("selected", row.getAttribute("data-name") === name);
    });
  }
  NM.hoverRows(document, ".op-row", function (row) {
    return [row.getAttribute("data-name"), [row.getAttribute("data-detail")]];
  });

  if (!T || !T.events || !T.events.dur_us.length) {
    document.querySelectorAll(".op-row").forEach(function (row) {
      row.addEventListener("click", function () { selectRows(row.getAttribute("data-name")); });
    });
    api.ready = true;
    return;
  }

  var ev = T.events, n = ev.dur_us.length, names = T.names, shorts = T.short;
  var ROW = 16, LANE_PAD = 6, LABEL_W = 210, AXIS_H = 22, MAX_DEPTH = 40;  // LABEL_W: see resize
  var nameIds = {};
  names.forEach(function (name, i) { nameIds[name] = i; });

  // Rows: per lane and depth, bars sorted by start, with a running max of their ends.
  var laneDepth = T.lanes.map(function () { return 0; });
  var rows = {};
  for (var i = 0; i < n; i++) {
    var d = Math.min(ev.depth[i], MAX_DEPTH), key = ev.lane[i] * 64 + d;
    if (d > laneDepth[ev.lane[i]]) laneDepth[ev.lane[i]] = d;
    (rows[key] = rows[key] || []).push(i);
  }
  Object.keys(rows).forEach(function (key) {
    var idx = rows[key];
    idx.sort(function (a, b) { return ev.start_us[a] - ev.start_us[b]; });
    var reach = new Float64Array(idx.length), m = -Infinity;
    for (var k = 0; k < idx.length; k++) {
      m = Math.max(m, ev.start_us[idx[k]] + ev.dur_us[idx[k]]);
      reach[k] = m;
    }
    rows[key] = { idx: idx, reach: reach };
  });
  var laneTop = [], height = AXIS_H;
  T.lanes.forEach(function (lane, l) {
    laneTop.push(height);
    height += (laneDepth[l] + 1) * ROW + 2 * LANE_PAD;
  });

  var canvas = document.getElementById("nm-canvas"), ctx = canvas.getContext("2d");
  var rangeEl = document.getElementById("nm-range"), selEl = document.getElementById("nm-selection");
  var span = Math.max(T.span_us, 1e-3), t0 = 0, t1 = span, width = 800;

  function resize() {
    width = Math.max(400, canvas.parentElement.clientWidth);
    LABEL_W = Math.round(Math.min(210, Math.max(120, width * 0.2)));
    var ratio = window.devicePixelRatio || 1;
    canvas.width = width * ratio;
    canvas.height = height * ratio;
    canvas.style.width = width + "px";
    canvas.style.height = height + "px";
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    draw();
  }
  function scale() { return (width - LABEL_W) / (t1 - t0); }
  function xOf(t) { return LABEL_W + (t - t0) * scale(); }
  function tOf(x) { return t0 + (x - LABEL_W) / scale(); }
  function firstReaching(row, t) {  // first k whose running end reaches t
    var lo = 0, hi = row.reach.length;
    while (lo < hi) { var mid = (lo + hi) >> 1; if (row.reach[mid] < t) lo = mid + 1; else hi = mid; }
    return lo;
  }
  function colorOf(i, faded) {
    var id = ev.kind[i] === 1 && ev.launcher[i] >= 0 ? ev.launcher[i] : ev.name[i];
    var light = ev.kind[i] === 1 ? 62 : 70;
    return "hsla(" + NM.hue(id) + "," + (ev.kind[i] === 1 ? 55 : 60) + "%," + light + "%," +
      (faded ? 0.25 : 1) + ")";
  }
  function isSelected(i) {
    return selected >= 0 && (ev.name[i] === selected || ev.launcher[i] === selected);
  }
  function draw() {
    ctx.clearRect(0, 0, width, height);
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    var sc = scale();
    T.steps.forEach(function (step, s) {  // profiled steps: shaded and numbered
      var x0 = Math.max(LABEL_W, xOf(step.start_us)), x1 = Math.min(width, xOf(step.start_us + step.wall_us));
      if (x1 <= x0) return;
      ctx.fillStyle = s % 2 ? "rgba(33,103,209,0.05)" : "rgba(33,103,209,0.10)";
      ctx.fillRect(x0, 0, x1 - x0, height);
      ctx.fillStyle = "#2167d1";
      ctx.fillText("step " + step.step, x0 + 4, AXIS_H / 2);
    });
    var drawn = {}, outline = [];
    T.lanes.forEach(function (lane, l) {
      var top = laneTop[l], count = 0;
      ctx.fillStyle = l % 2 ? "#fafbfc" : "#ffffff";
      ctx.fillRect(0, top, LABEL_W, (laneDepth[l] + 1) * ROW + 2 * LANE_PAD);
      ctx.strokeStyle = "#d9dee5";
      ctx.beginPath(); ctx.moveTo(0, top + 0.5); ctx.lineTo(width, top + 0.5); ctx.stroke();
      for (var d = 0; d <= laneDepth[l]; d++) {
        var row = rows[l * 64 + d];
        if (!row) continue;
        var y = top + LANE_PAD + d * ROW, lastPx = -1;
        for (var k = firstReaching(row, t0); k < row.idx.length; k++) {
          var i = row.idx[k], s0 = ev.start_us[i];
          if (s0 > t1) break;
          var x = xOf(s0), w = ev.dur_us[i] * sc;
          if (x < LABEL_W) { w -= LABEL_W - x; x = LABEL_W; }
          if (w <= 0 && x + 1 < LABEL_W) continue;
          var px = Math.floor(x);
          if (w < 1 && px === lastPx) continue;  // sub-pixel bars: one per pixel
          lastPx = px;
          var sel = isSelected(i);
          ctx.fillStyle = colorOf(i, selected >= 0 && !sel);
          ctx.fillRect(x, y, Math.max(w, 1), ROW - 2);
          if (sel) outline.push([x, y, Math.max(w, 1)]);
          if (w > 40) {
            ctx.save(); ctx.beginPath(); ctx.rect(x, y, w, ROW - 2); ctx.clip();
            ctx.fillStyle = "#1d2330"; ctx.fillText(shorts[ev.name[i]], x + 3, y + (ROW - 2) / 2);
            ctx.restore();
          }
          count++;
        }
      }
      ctx.fillStyle = "#1d2330";
      ctx.save(); ctx.beginPath(); ctx.rect(0, top, LABEL_W - 6, ROW * 2); ctx.clip();
      ctx.fillText(lane.name, 6, top + LANE_PAD + ROW / 2);
      ctx.restore();
      drawn[lane.name] = count;
    });
    ctx.strokeStyle = "#c62828"; ctx.lineWidth = 1.5;
    outline.forEach(function (o) { ctx.strokeRect(o[0], o[1] - 0.5, o[2], ROW - 1); });
    ctx.lineWidth = 1;
    ctx.strokeStyle = "#9aa4b1";
    ctx.beginPath(); ctx.moveTo(LABEL_W + 0.5, 0); ctx.lineTo(LABEL_W + 0.5, height); ctx.stroke();
    api.drawn = drawn;
    api.view = { t0: t0, t1: t1 };
    rangeEl.textContent = NM.fmtUs(t0) + " \u2013 " + NM.fmtUs(t1) + " (" + NM.fmtUs(t1 - t0) +
      " of " + NM.fmtUs(span) + ")";
  }

  function hit(x, y) {  // the bar under (x, y) in canvas pixels, or -1
    if (x < LABEL_W) return -1;
    for (var l = T.lanes.length - 1; l >= 0; l--) {
      if (y < laneTop[l]) continue;
      var d = Math.floor((y - laneTop[l] - LANE_PAD) / ROW), row = rows[l * 64 + d];
      if (d < 0 || !row) return -1;
      var t = tOf(x), slack = 2 / scale(), best = -1, bestGap = Infinity;
      for (var k = firstReaching(row, t - slack); k < row.idx.length; k++) {
        var i = row.idx[k], s0 = ev.start_us[i];
        if (s0 > t + slack) break;
        var e0 = s0 + ev.dur_us[i], gap = t < s0 ? s0 - t : t > e0 ? t - e0 : 0;
        if (gap <= slack && gap < bestGap) { best = i; bestGap = gap; }
      }
      return best;
    }
    return -1;
  }
  function describe(i) {
    var lines = [T.lanes[ev.lane[i]].name + (ev.kind[i] === 1 ? " (device)" : ""),
      "duration " + NM.fmtUs(ev.dur_us[i]) + ", starts at " + NM.fmtUs(ev.start_us[i])];
    if (ev.kind[i] === 0) lines.push("self time " + NM.fmtUs(ev.self_us[i]));
    if (ev.shape[i] >= 0) lines.push("input shapes: " + T.shapes[ev.shape[i]]);
    if (ev.launcher[i] >= 0) lines.push("launched by " + names[ev.launcher[i]]);
    lines.push("click: select all calls");
    return lines;
  }
  function select(id) {
    selected = id === selected ? -1 : id;
    selectRows(selected >= 0 ? names[selected] : null);
    if (selected < 0) { selEl.textContent = ""; draw(); return; }
    var calls = 0, total = 0, dev = 0, devTotal = 0;
    for (var i = 0; i < n; i++) {
      if (ev.kind[i] === 0 && ev.name[i] === selected) { calls++; total += ev.dur_us[i]; }
      else if (isSelected(i)) { dev++; devTotal += ev.dur_us[i]; }
    }
    selEl.textContent = "Selected " + names[selected] + ": " + calls + " call(s) shown, " +
      NM.fmtUs(total) + (dev ? "; " + dev + " device event(s), " + NM.fmtUs(devTotal) : "");
    draw();
  }

  var drag = null;
  canvas.addEventListener("wheel", function (e) {
    e.preventDefault();
    var rect = canvas.getBoundingClientRect(), x = e.clientX - rect.left;
    if (Math.abs(e.deltaX) > Math.abs(e.deltaY)) {
      var dt = e.deltaX / scale(); t0 += dt; t1 += dt;
    } else {
      var tm = tOf(Math.max(x, LABEL_W)), f = Math.exp(e.deltaY * 0.0015);
      var nt0 = tm - (tm - t0) * f, nt1 = tm + (t1 - tm) * f;
      if (nt1 - nt0 >= 1e-3 && nt1 - nt0 <= span * 4) { t0 = nt0; t1 = nt1; }
    }
    draw();
  }, { passive: false });
  canvas.addEventListener("mousedown", function (e) {
    drag = { x: e.clientX, t0: t0, t1: t1, moved: false };
    canvas.classList.add("dragging");
  });
  window.addEventListener("mouseup", function (e) {
    if (!drag) return;
    canvas.classList.remove("dragging");
    if (!drag.moved) {
      var rect = canvas.getBoundingClientRect(), i = hit(e.clientX - rect.left, e.clientY - rect.top);
      if (i >= 0) select(ev.kind[i] === 1 && ev.launcher[i] >= 0 ? ev.launcher[i] : ev.name[i]);
      else if (selected >= 0) select(selected);
    }
    drag = null;
  });
  canvas.addEventListener("mousemove", function (e) {
    var rect = canvas.getBoundingClientRect(), x = e.clientX - rect.left, y = e.clientY - rect.top;
    if (drag) {
      if (Math.abs(e.clientX - drag.x) > 3) drag.moved = true;
      var dt = (e.clientX - drag.x) / ((width - LABEL_W) / (drag.t1 - drag.t0));
      t0 = drag.t0 - dt; t1 = drag.t1 - dt;
      NM.hideTip();
      draw();
      return;
    }
    var i = hit(x, y);
    if (i >= 0) NM.showTip(names[ev.name[i]], describe(i), e.clientX, e.clientY);
    else NM.hideTip();
  });
  canvas.addEventListener("mouseleave", NM.hideTip);
  document.getElementById("nm-reset").addEventListener("click", function () {
    t0 = 0; t1 = span; draw();
  });
  document.querySelectorAll(".op-row").forEach(function (row) {
    row.addEventListener("click", function () {
      var id = nameIds[row.getAttribute("data-name")];
      if (id !== undefined) select(id); else selectRows(row.getAttribute("data-name"));
    });
  });
  api.select = function (name) { if (nameIds[name] !== undefined) select(nameIds[name]); };
  api.locate = function (name) {  // the canvas position (CSS px) of the longest drawn bar of name
    var id = nameIds[name];
    for (var i = 0; i < n; i++) {
      if (ev.name[i] !== id) continue;
      var x0 = Math.max(xOf(ev.start_us[i]), LABEL_W), x1 = Math.min(xOf(ev.start_us[i] + ev.dur_us[i]), width);
      if (x1 - x0 < 2) continue;
      return { x: (x0 + x1) / 2, y: laneTop[ev.lane[i]] + LANE_PAD + Math.min(ev.depth[i], MAX_DEPTH) * ROW + ROW / 2 };
    }
    return null;
  };
  if (window.ResizeObserver) new ResizeObserver(resize).observe(canvas.parentElement);
  resize();
  api.ready = true;
})();
