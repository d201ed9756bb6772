/* neuron-mlflow comparison.html: hover tells run, value and change; the wheel over the
   per-operator chart zooms its value axis (small operators become visible); drag pans it. */
"use strict";
(function () {
  var DATA = NM.data();
  var api = { view: null, ready: false };
  window.nmComparison = api;
  NM.hoverRows(document, ".cmp-bar", function (bar) {
    return [bar.getAttribute("data-title"), [bar.getAttribute("data-detail")]];
  });
  var chart = document.getElementById("nm-op-chart"), rangeEl = document.getElementById("nm-range");
  if (!chart) { api.ready = true; return; }
  var full = DATA.op_max || 1, hi = full, lo = 0, perOp = true;
  var bars = chart.querySelectorAll(".cmp-bar[data-value]");
  var scaleButton = document.getElementById("nm-scale");
  function draw() {  // per operator: each group against its largest run; shared: one axis
    var zoom = (hi - lo) / full;
    bars.forEach(function (bar) {
      var v = parseFloat(bar.getAttribute("data-value"));
      var frac = perOp ? v / (parseFloat(bar.getAttribute("data-group-max")) * zoom || 1)
                       : (v - lo) / (hi - lo);
      var fill = bar.querySelector(".fill");
      fill.style.width = (100 * Math.max(0, Math.min(1, frac))) + "%";
      fill.classList.toggle("clipped", frac > 1);
    });
    api.view = { lo: lo, hi: hi, perOp: perOp };
    scaleButton.textContent = perOp ? "Scale: per operator" : "Scale: shared axis";
    rangeEl.textContent = (perOp ? "each operator against its largest run, zoom x" +
      (1 / zoom).toFixed(2) : "axis " + NM.fmtUs(lo) + " \u2013 " + NM.fmtUs(hi)) +
      " (wheel: zoom, drag: pan)";
  }
  scaleButton.addEventListener("click", function () { perOp = !perOp; lo = 0; hi = full; draw(); });
  chart.addEventListener("wheel", function (e) {
    e.preventDefault();
    var f = Math.exp(e.deltaY * 0.0015), nhi = lo + (hi - lo) * f;
    if (nhi - lo > full * 1e-6 && nhi <= full * 4) hi = nhi;
    draw();
  }, { passive: false });
  var drag = null;
  chart.addEventListener("mousedown", function (e) { drag = { x: e.clientX, lo: lo, hi: hi }; });
  window.addEventListener("mouseup", function () { drag = null; });
  chart.addEventListener("mousemove", function (e) {
    if (!drag) return;
    var width = chart.querySelector(".track").clientWidth || 400;
    var dv = (e.clientX - drag.x) / width * (drag.hi - drag.lo);
    lo = Math.max(0, drag.lo - dv); hi = lo + (drag.hi - drag.lo);
    draw();
  });
  document.getElementById("nm-reset").addEventListener("click", function () { lo = 0; hi = full; draw(); });
  draw();
  api.ready = true;
})();
