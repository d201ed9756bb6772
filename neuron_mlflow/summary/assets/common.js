/* neuron-mlflow reports: helpers shared by report.html and comparison.html (no network). */
"use strict";
var NM = (function () {
  function fmtUs(us) {  // the same rule as neuron_mlflow.summary.tables.format_us
    var a = Math.abs(us);
    if (a < 1000) return us.toFixed(1) + " us";
    if (a < 1e6) return (us / 1000).toFixed(3) + " ms";
    return (us / 1e6).toFixed(3) + " s";
  }
  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  var tip = null;
  function showTip(title, rows, clientX, clientY) {
    if (!tip) tip = document.getElementById("nm-tip");
    tip.textContent = "";
    tip.appendChild(el("div", "tip-name", title));
    rows.forEach(function (r) { tip.appendChild(el("div", "tip-row", r)); });
    tip.style.display = "block";
    var w = tip.offsetWidth, h = tip.offsetHeight;
    var x = clientX + 14, y = clientY + 14;
    if (x + w > window.innerWidth - 4) x = Math.max(4, clientX - w - 14);
    if (y + h > window.innerHeight - 4) y = Math.max(4, clientY - h - 14);
    tip.style.left = x + "px";
    tip.style.top = y + "px";
  }
  function hideTip() {
    if (!tip) tip = document.getElementById("nm-tip");
    tip.style.display = "none";
  }
  function data() { return JSON.parse(document.getElementById("nm-data").textContent); }
  function hue(id) { return (id * 137.508) % 360; }
  function hoverRows(root, selector, describe) {
    root.querySelectorAll(selector).forEach(function (row) {
      row.addEventListener("mousemove", function (e) {
        var d = describe(row);
        showTip(d[0], d[1], e.clientX, e.clientY);
      });
      row.addEventListener("mouseleave", hideTip);
    });
  }
  return { fmtUs: fmtUs, el: el, showTip: showTip, hideTip: hideTip, data: data, hue: hue,
           hoverRows: hoverRows };
})();
