// report_base.js: the single-run page (report.html) draws a ridgescope report (docs/report_schema.md) embedded as JSON in the page.
// Self-contained: no library, no network. Exact integers the tests compare are exposed as
// data-* attributes (data-bytes, data-t0, data-t1).
// The page's script is common.js and these modules, in this order, inside one function
// (_html.py, REPORT_SCRIPTS): report_base.js (the data, colours, formatting, DOM helpers),
// report_cards.js (header, OOMs, warnings), report_tables.js, report_chart.js (the timeline,
// its chart and zoom), report_sites.js (allocation sites and the flame graph), report_ledgers.js (the device ledger
// and the host's layers), report_main.js.
  var SVG = 'http://www.w3.org/2000/svg';
  var R = JSON.parse(document.getElementById('rs-data').textContent);
  var T = R.timeline || null;
  var CATS = R.categories;
  var SPARE = ['#8cd17d', '#b6992d', '#499894', '#d37295', '#fabfd2', '#79706e'];
  var PHASE_COLORS = {
    forward: '#59a14f', backward: '#f28e2b', recompute: '#b07aa1', optimizer_step: '#e15759',
    zero_grad: '#bab0ac'
  };
  // Bottom to top in the stack: what persists first, transient things on top.
  var STACK_ORDER = ['parameter', 'buffer', 'optimizer_state', 'gradient', 'input', 'activation',
                     'temporary', 'workspace', 'comm_buffer', 'unknown'];

  function colorOf(cat) {
    if (COLORS[cat]) return COLORS[cat];
    var i = CATS.indexOf(cat);
    return SPARE[(i < 0 ? 0 : i) % SPARE.length];
  }
  function phaseColor(name) { return PHASE_COLORS[name] || '#4e79a7'; }

  // ------------------------------------------------------------------ formatting (fmtBytes: common.js)
  function fmtInt(n) { return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ','); }
  function fmtMs(ns) {
    var ms = ns / 1e6;
    if (ms >= 100) return ms.toFixed(1);
    if (ms >= 1) return ms.toFixed(3);
    return ms.toFixed(4);
  }
  function fmtTime(ns) {
    if (ns >= 1e9) return (ns / 1e9).toFixed(ns >= 1e11 ? 0 : 2) + ' s';
    if (ns >= 1e6) return (ns / 1e6).toFixed(ns >= 1e8 ? 0 : ns >= 1e7 ? 1 : 2) + ' ms';
    if (ns >= 1e3) return (ns / 1e3).toFixed(1) + ' µs';
    return ns + ' ns';
  }

  // ------------------------------------------------------------------ DOM helpers
  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    if (attrs) for (var k in attrs) if (attrs[k] !== undefined && attrs[k] !== null) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function sv(tag, attrs, parent) {
    var e = document.createElementNS(SVG, tag);
    if (attrs) for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  // A colour swatch and its text, appended to `parent` (legends, category and phase cells).
  function swatched(parent, color, text) {
    var sw = el('span', { 'class': 'rs-swatch' });
    sw.style.background = color;
    parent.appendChild(sw);
    parent.appendChild(document.createTextNode(text));
    return sw;
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
  function kv(dl, key, value) {
    dl.appendChild(el('dt', null, key));
    dl.appendChild(el('dd', null, value));
  }
  // A by-category object as a small stacked bar plus the largest parts in words.
  function composition(byCat, total) {
    var span = el('span');
    var bar = el('span', { 'class': 'rs-comp' });
    var parts = [];
    STACK_ORDER.concat(CATS.filter(function (c) { return STACK_ORDER.indexOf(c) < 0; })).forEach(function (c) {
      var b = byCat[c] || 0;
      if (!b) return;
      parts.push([b, c]);
      var s = el('span', { title: c + ': ' + fmtBytes(b) });
      s.style.width = (total > 0 ? (100 * b / total) : 0).toFixed(2) + '%';
      s.style.background = colorOf(c);
      bar.appendChild(s);
    });
    parts.sort(function (a, b) { return b[0] - a[0]; });
    span.appendChild(bar);
    span.appendChild(document.createTextNode(parts.slice(0, 3).map(function (p) {
      return p[1] + ' ' + fmtBytes(p[0]);
    }).join(', ')));
    return span;
  }

