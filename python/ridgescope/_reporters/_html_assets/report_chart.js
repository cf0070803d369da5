// report_chart.js: the timeline (its sparse columns expanded), the chart, its tooltip, legend and zoom
// (see report_base.js).
  // ------------------------------------------------------------------ timeline data
  // Expands the sparse columns of the JSON (docs/report_schema.md, timeline): a column not
  // listed equals the last listed one before it.
  var COLS = null;
  var PHASES = [], STEP_ENDS = [];
  // Phases and step ends are columnar in the JSON; rows are easier to draw from.
  function loadSpans() {
    var P = T.phases, E = T.step_ends, i;
    if (P && P.names) {
      for (i = 0; i < P.name.length; i++) {
        PHASES.push({ phase: P.names[P.name[i]], step: P.step[i], depth: P.depth[i],
                      begin_time_ns: P.begin_time_ns[i], end_time_ns: P.end_time_ns[i] });
      }
    }
    if (E && E.step) for (i = 0; i < E.step.length; i++) STEP_ENDS.push({ step: E.step[i], time_ns: E.time_ns[i] });
  }
  function loadColumns() {
    if (!T || !T.columns) return;
    var n = T.columns, idx = T.index || null;
    var map = new Int32Array(n);
    var k = -1;
    for (var i = 0; i < n; i++) {
      if (idx ? (k + 1 < idx.length && idx[k + 1] === i) : true) k = idx ? k + 1 : i;
      map[i] = k;
    }
    COLS = { n: n, map: map };
  }
  function col(i) { return COLS.map[i]; }  // index into the listed arrays

  // Bins of columns over [t0, t1): at most `width` bins, each the max of its columns.
  function bins(t0, t1, width) {
    var w = T.column_ns, n = COLS.n;
    var i0 = Math.max(0, Math.floor(t0 / w)), i1 = Math.min(n - 1, Math.floor(Math.max(t0, t1 - 1) / w));
    var count = i1 - i0 + 1, per = Math.max(1, Math.ceil(count / width));
    var out = [];
    for (var a = i0; a <= i1; a += per) {
      var b = Math.min(i1, a + per - 1);
      var best = col(a), lo = Infinity, hi = -1, res = 0;
      for (var i = a; i <= b; i++) {
        var c = col(i);
        var mx = T.max_bytes[c];
        if (mx > hi) { hi = mx; best = c; }
        if (T.min_bytes[c] < lo) lo = T.min_bytes[c];
        if (T.reserved_bytes[c] > res) res = T.reserved_bytes[c];
      }
      out.push({ x0: Math.max(t0, a * w), x1: Math.min(t1, (b + 1) * w), max: hi, min: lo, reserved: res,
                 c: best, maxTime: T.max_time_ns[best] });
    }
    return out;
  }

  // ------------------------------------------------------------------ chart
  var FULL = { t0: 0, t1: 1 };
  var view = { t0: 0, t1: 1 };
  var geom = null;
  var chartBox = document.getElementById('rs-chart-box');
  var tooltip = document.getElementById('rs-tooltip');

  function niceStep(span, target) {
    var raw = span / Math.max(1, target);
    var p = Math.pow(10, Math.floor(Math.log10(raw)));
    var m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
  }
  function niceBytesStep(max, target) {
    var raw = max / Math.max(1, target);
    var unit = Math.pow(1024, Math.max(0, Math.floor(Math.log(Math.max(raw, 1)) / Math.log(1024))));
    var step = niceStep(raw / unit, 1);
    return (step >= 1000 ? 1024 : step) * unit;  // 1000 MiB reads better as 1 GiB
  }

  function draw() {
    clear(chartBox);
    if (!COLS) {
      chartBox.appendChild(el('p', { 'class': 'rs-note' }, 'This report has no timeline.'));
      return;
    }
    var W = Math.max(480, chartBox.clientWidth || 1000), H = 380;
    var ml = 76, mr = 16, mt = 30, mb = 30;
    var pw = W - ml - mr, ph = H - mt - mb;
    var t0 = view.t0, t1 = Math.max(view.t1, view.t0 + 1);
    var data = bins(t0, t1, Math.floor(pw));
    var cap = (R.device_capacity_bytes !== null && R.device_capacity_bytes !== undefined) ? R.device_capacity_bytes : null;
    var ymax = 1;
    data.forEach(function (d) { ymax = Math.max(ymax, d.max, d.reserved); });
    if (R.peak.time_ns >= t0 && R.peak.time_ns <= t1) ymax = Math.max(ymax, R.peak.bytes);
    if (cap !== null) ymax = Math.max(ymax, cap);
    ymax *= 1.08;
    var X = function (t) { return ml + (t - t0) / (t1 - t0) * pw; };
    var Y = function (b) { return mt + ph - b / ymax * ph; };
    geom = { W: W, H: H, ml: ml, mt: mt, pw: pw, ph: ph, t0: t0, t1: t1, X: X, Y: Y, data: data };

    var svg = sv('svg', { id: 'rs-chart', viewBox: '0 0 ' + W + ' ' + H, width: W, height: H,
                          'data-t0': String(Math.round(t0)), 'data-t1': String(Math.round(t1)),
                          'data-columns': String(data.length) });
    chartBox.appendChild(svg);
    var clip = sv('clipPath', { id: 'rs-clip' }, sv('defs', null, svg));
    sv('rect', { x: ml, y: 0, width: pw, height: mt + ph }, clip);

    // Grid and axes.
    var grid = sv('g', { 'class': 'rs-grid' }, svg), axis = sv('g', { 'class': 'rs-axis' }, svg);
    var ys = niceBytesStep(ymax, 5);
    for (var yb = 0; yb <= ymax; yb += ys) {
      sv('line', { x1: ml, x2: ml + pw, y1: Y(yb), y2: Y(yb) }, grid);
      sv('text', { x: ml - 6, y: Y(yb) + 4, 'text-anchor': 'end' }, axis).textContent = fmtBytes(Math.round(yb));
    }
    var xs = niceStep(t1 - t0, 7);
    for (var xt = Math.ceil(t0 / xs) * xs; xt <= t1; xt += xs) {
      sv('line', { x1: X(xt), x2: X(xt), y1: mt + ph, y2: mt + ph + 4 }, axis);
      sv('text', { x: X(xt), y: mt + ph + 17, 'text-anchor': 'middle' }, axis).textContent = fmtTime(xt);
    }
    sv('line', { x1: ml, x2: ml + pw, y1: mt + ph, y2: mt + ph }, axis);

    var plot = sv('g', { 'clip-path': 'url(#rs-clip)' }, svg);
    // Phase bands: a strip above the plot and a light shade behind it.
    var bandsG = sv('g', { id: 'rs-phase-bands' }, plot);
    var phases = PHASES.filter(function (p) { return p.end_time_ns >= t0 && p.begin_time_ns <= t1; });
    // Thousands of sub-pixel bands say nothing: past one per two pixels, zoom in to see them.
    var dense = [];
    if (phases.length > pw / 2) { dense.push(phases.length + ' phases'); phases = []; }
    var minWidth = 0, phaseLabels = [];
    phases.forEach(function (p) {
      var x0 = X(Math.max(t0, p.begin_time_ns)), x1 = X(Math.min(t1, p.end_time_ns));
      if (x1 - x0 < minWidth) return;
      var w = Math.max(0.75, x1 - x0);
      var g = sv('g', { 'class': 'rs-phase', 'data-phase': p.phase, 'data-step': String(p.step) }, bandsG);
      if (p.depth === 0) sv('rect', { 'class': 'rs-phase-shade', x: x0, y: mt, width: w, height: ph, fill: phaseColor(p.phase) }, g);
      var band = sv('rect', { 'class': 'rs-phase-band', x: x0, y: 4 + 7 * Math.min(p.depth, 2), width: w, height: 7,
                              fill: phaseColor(p.phase) }, g);
      sv('title', null, band).textContent = p.phase + ' (step ' + p.step + '): ' + fmtMs(p.begin_time_ns) +
        '–' + fmtMs(p.end_time_ns) + ' ms';
      if (p.depth === 0 && w > 70) phaseLabels.push([x0 + 4, p.phase]);
    });

    // Stacked areas of the columns' composition at their highest instant.
    var order = STACK_ORDER.filter(function (c) { return CATS.indexOf(c) >= 0; })
      .concat(CATS.filter(function (c) { return STACK_ORDER.indexOf(c) < 0; }));
    var under = data.map(function () { return 0; });
    var areas = sv('g', { id: 'rs-areas' }, plot);
    order.forEach(function (cat) {
      var arr = T.max_by_category[cat];
      if (!arr) return;
      var any = false;
      var top = data.map(function (d, j) { var v = arr[d.c] || 0; if (v) any = true; return under[j] + v; });
      if (!any) return;
      var path = '';
      data.forEach(function (d, j) { path += (j ? 'L' : 'M') + X(d.x0).toFixed(2) + ',' + Y(top[j]).toFixed(2) + 'L' + X(d.x1).toFixed(2) + ',' + Y(top[j]).toFixed(2); });
      for (var j = data.length - 1; j >= 0; j--) path += 'L' + X(data[j].x1).toFixed(2) + ',' + Y(under[j]).toFixed(2) + 'L' + X(data[j].x0).toFixed(2) + ',' + Y(under[j]).toFixed(2);
      sv('path', { d: path + 'Z', fill: colorOf(cat), 'class': 'rs-area', 'data-category': cat }, areas);
      under = top;
    });
    // The lowest live bytes of each column, and the reserved line.
    var lineOf = function (key) {
      var d = '';
      data.forEach(function (b, j) { d += (j ? 'L' : 'M') + X(b.x0).toFixed(2) + ',' + Y(b[key]).toFixed(2) + 'L' + X(b.x1).toFixed(2) + ',' + Y(b[key]).toFixed(2); });
      return d;
    };
    sv('path', { d: lineOf('min'), 'class': 'rs-min-line' }, plot);
    sv('path', { d: lineOf('reserved'), 'class': 'rs-reserved-line', id: 'rs-reserved-line' }, plot);
    if (cap !== null) {
      sv('line', { x1: ml, x2: ml + pw, y1: Y(cap), y2: Y(cap), 'class': 'rs-capacity-line', id: 'rs-capacity-line',
                   'data-bytes': String(cap) }, svg);
      sv('text', { x: ml + pw - 4, y: Y(cap) - 4, 'text-anchor': 'end', 'class': 'rs-capacity-label' }, svg)
        .textContent = 'capacity ' + fmtBytes(cap);
    }

    phaseLabels.forEach(function (l) {
      sv('text', { x: l[0], y: mt + 11, 'class': 'rs-phase-label' }, plot).textContent = l[1];
    });

    // Step boundaries.
    var steps = sv('g', { id: 'rs-step-lines' }, plot);
    var ends = STEP_ENDS.filter(function (s) { return s.time_ns >= t0 && s.time_ns <= t1; });
    if (ends.length > pw / 4) { dense.push(ends.length + ' step boundaries'); ends = []; }
    if (dense.length) {
      sv('text', { x: ml + 4, y: mt - 6, 'class': 'rs-step-label', id: 'rs-dense-note' }, svg).textContent =
        dense.join(' and ') + ' in view: zoom in (pick a step, or drag) to draw them';
    }
    var lastLabel = -1e9;
    ends.forEach(function (s) {
      var x = X(s.time_ns);
      sv('line', { x1: x, x2: x, y1: mt, y2: mt + ph, 'class': 'rs-step-line', 'data-step': String(s.step) }, steps);
      if (x - lastLabel > 44 && ends.length <= 400) {
        sv('text', { x: x - 3, y: mt + 10, 'text-anchor': 'end', 'class': 'rs-step-label' }, steps).textContent = 'step ' + s.step;
        lastLabel = x;
      }
    });

    // Interaction layer under the markers: hover for a column's composition, drag to zoom.
    var hit = sv('rect', { x: ml, y: mt, width: pw, height: ph, fill: 'transparent', id: 'rs-chart-hit' }, svg);

    // OOM markers.
    (R.ooms || []).forEach(function (o, i) {
      if (o.time_ns < t0 || o.time_ns > t1) return;
      var x = X(o.time_ns);
      var g = sv('g', { 'class': 'rs-oom-marker-group' }, svg);
      sv('line', { x1: x, x2: x, y1: mt, y2: mt + ph, 'class': 'rs-oom-line' }, g);
      var m = sv('path', { d: 'M' + (x - 7) + ',' + (mt - 1) + 'L' + (x + 7) + ',' + (mt - 1) + 'L' + x + ',' + (mt + 11) + 'Z',
                           'class': 'rs-oom-marker', 'data-request-bytes': String(o.request_bytes), 'data-index': String(i) }, g);
      sv('title', null, m).textContent = 'Out of memory: ' + fmtBytes(o.request_bytes) + ' requested in step ' + o.step + ', ' + o.phase;
      m.addEventListener('click', function () { var box = document.getElementById('rs-oom-' + i); if (box) box.scrollIntoView(); });
    });

    // The peak.
    var p = R.peak;
    if (p.bytes > 0 && p.time_ns >= t0 && p.time_ns <= t1) {
      var px = X(p.time_ns), py = Y(p.bytes);
      var label = sv('text', { x: px + (px > ml + pw - 160 ? -10 : 10), y: Math.max(mt + 12, py - 8),
                               'text-anchor': px > ml + pw - 160 ? 'end' : 'start', 'class': 'rs-peak-label' }, svg);
      label.textContent = 'peak ' + fmtBytes(p.bytes);
      var mk = sv('circle', { id: 'rs-peak-marker', cx: px, cy: py, r: 6, 'data-bytes': String(p.bytes),
                              'data-time-ns': String(p.time_ns) }, svg);
      mk.addEventListener('mouseenter', function (ev) { showTip(ev, peakTip()); });
      mk.addEventListener('mousemove', function (ev) { placeTip(ev); });
      mk.addEventListener('mouseleave', hideTip);
      mk.addEventListener('click', function (ev) {
        ev.stopPropagation();
        showTip(ev, peakTip());
        var card = document.getElementById('rs-peak-info');
        card.scrollIntoView({ block: 'nearest' });
      });
    }

    var cursor = sv('line', { 'class': 'rs-cursor', y1: mt, y2: mt + ph, x1: -10, x2: -10, 'pointer-events': 'none' }, svg);
    var sel = sv('rect', { 'class': 'rs-selection', x: 0, y: mt, width: 0, height: ph, visibility: 'hidden',
                           'pointer-events': 'none' }, svg);
    var dragFrom = null;
    var svgX = function (ev) {
      var r = svg.getBoundingClientRect();
      return (ev.clientX - r.left) * (W / r.width);
    };
    hit.addEventListener('mousedown', function (ev) { dragFrom = svgX(ev); ev.preventDefault(); });
    hit.addEventListener('mousemove', function (ev) {
      var x = svgX(ev);
      cursor.setAttribute('x1', x); cursor.setAttribute('x2', x);
      if (dragFrom !== null) {
        sel.setAttribute('visibility', 'visible');
        sel.setAttribute('x', Math.min(x, dragFrom)); sel.setAttribute('width', Math.abs(x - dragFrom));
      }
      var t = t0 + (x - ml) / pw * (t1 - t0);
      var d = null;
      for (var j = 0; j < data.length; j++) if (t >= data[j].x0 && t < data[j].x1) { d = data[j]; break; }
      if (d) showTip(ev, columnTip(d)); else hideTip();
    });
    hit.addEventListener('mouseleave', function () { hideTip(); cursor.setAttribute('x1', -10); cursor.setAttribute('x2', -10); });
    window.addEventListener('mouseup', function onUp(ev) {
      window.removeEventListener('mouseup', onUp);
      if (dragFrom === null) return;
      var x = svgX(ev), a = Math.min(x, dragFrom), b = Math.max(x, dragFrom);
      dragFrom = null;
      sel.setAttribute('visibility', 'hidden');
      if (b - a < 5) return;
      var ta = t0 + (Math.max(a, ml) - ml) / pw * (t1 - t0), tb = t0 + (Math.min(b, ml + pw) - ml) / pw * (t1 - t0);
      setView(ta, tb);
    });
    updateRange();
  }

  function compositionRows(byCat, getter) {
    var tbl = el('table');
    CATS.forEach(function (c) {
      var b = getter(byCat, c);
      if (!b) return;
      var tr = el('tr');
      var td = el('td');
      swatched(td, colorOf(c), c);
      tr.appendChild(td);
      tr.appendChild(el('td', { 'class': 'rs-num' }, fmtBytes(b)));
      tbl.appendChild(tr);
    });
    return tbl;
  }
  function peakTip() {
    var p = R.peak, div = el('div', { id: 'rs-peak-tip' });
    div.appendChild(el('strong', null, 'Peak ' + fmtBytes(p.bytes) + ' (' + fmtInt(p.bytes) + ' bytes)'));
    div.appendChild(el('div', null, 'step ' + p.step + ', ' + p.phase + ', at ' + fmtMs(p.time_ns) + ' ms'));
    div.appendChild(compositionRows(p.by_category, function (o, c) { return o[c] || 0; }));
    return div;
  }
  function columnTip(d) {
    var div = el('div');
    div.appendChild(el('strong', null, fmtMs(d.x0) + '–' + fmtMs(d.x1) + ' ms'));
    div.appendChild(el('div', null, 'highest ' + fmtBytes(d.max) + ', lowest ' + fmtBytes(d.min) + ', reserved ' + fmtBytes(d.reserved)));
    div.appendChild(compositionRows(null, function (_, c) { var a = T.max_by_category[c]; return a ? a[d.c] : 0; }));
    return div;
  }
  function showTip(ev, content) {
    clear(tooltip);
    tooltip.appendChild(content);
    tooltip.hidden = false;
    placeTip(ev);
  }
  function placeTip(ev) {
    var x = ev.clientX + 14, y = ev.clientY + 14;
    var w = tooltip.offsetWidth, h = tooltip.offsetHeight;
    if (x + w > window.innerWidth - 4) x = ev.clientX - w - 14;
    if (y + h > window.innerHeight - 4) y = ev.clientY - h - 14;
    tooltip.style.left = Math.max(4, x) + 'px';
    tooltip.style.top = Math.max(4, y) + 'px';
  }
  function hideTip() { tooltip.hidden = true; }

  function legend() {
    var box = document.getElementById('rs-legend');
    if (!T) return;
    var order = STACK_ORDER.filter(function (c) { return CATS.indexOf(c) >= 0; })
      .concat(CATS.filter(function (c) { return STACK_ORDER.indexOf(c) < 0; }));
    order.forEach(function (c) {
      var arr = T.max_by_category[c] || [];
      if (!arr.some(function (v) { return v > 0; })) return;
      var item = el('span', { 'data-category': c });
      swatched(item, colorOf(c), c);
      box.appendChild(item);
    });
    var lines = [['#24292f', 'reserved'], ['#ffffff', 'lowest in column (dashed)']];
    if (R.device_capacity_bytes !== null && R.device_capacity_bytes !== undefined) lines.push(['#cf222e', 'capacity']);
    lines.forEach(function (l) {
      var item = el('span');
      var sw = el('span', { 'class': 'rs-line-swatch' });
      sw.style.borderColor = l[0] === '#ffffff' ? '#8c959f' : l[0];
      item.appendChild(sw);
      item.appendChild(document.createTextNode(l[1]));
      box.appendChild(item);
    });
    Object.keys(PHASE_COLORS).forEach(function (ph) {
      if (!PHASES.some(function (p) { return p.phase === ph; })) return;
      var item = el('span');
      swatched(item, PHASE_COLORS[ph], 'phase ' + ph).style.opacity = '0.85';
      box.appendChild(item);
    });
  }

  // ------------------------------------------------------------------ zoom
  function updateRange() {
    var r = document.getElementById('rs-range');
    r.setAttribute('data-t0', String(Math.round(view.t0)));
    r.setAttribute('data-t1', String(Math.round(view.t1)));
    r.textContent = 'showing ' + fmtMs(view.t0) + '–' + fmtMs(view.t1) + ' ms';
    document.getElementById('rs-t0').value = (view.t0 / 1e6).toFixed(4);
    document.getElementById('rs-t1').value = (view.t1 / 1e6).toFixed(4);
  }
  function setView(t0, t1) {
    t0 = Math.max(FULL.t0, Math.min(t0, FULL.t1));
    t1 = Math.max(FULL.t0, Math.min(t1, FULL.t1));
    if (!(t1 > t0)) return;
    view = { t0: t0, t1: t1 };
    draw();
  }
  function stepRange(step) {
    for (var i = 0; i < R.steps.length; i++) {
      var s = R.steps[i];
      if (s.step === step) return [s.begin_time_ns || 0, s.end_time_ns || FULL.t1];
    }
    return null;
  }
  function zoomToStep(step) {
    var r = stepRange(step);
    if (!r) return;
    var pad = Math.max(1, (r[1] - r[0]) * 0.02);
    document.getElementById('rs-step-select').value = String(step);
    setView(r[0] - pad, r[1] + pad);
  }
  function controls() {
    var select = document.getElementById('rs-step-select');
    R.steps.forEach(function (s) {
      select.appendChild(el('option', { value: String(s.step) }, 'step ' + s.step + ' (peak ' + fmtBytes(s.peak_bytes) + ')'));
    });
    select.addEventListener('change', function () {
      if (select.value === '') setView(FULL.t0, FULL.t1); else zoomToStep(Number(select.value));
    });
    document.getElementById('rs-apply').addEventListener('click', function () {
      var a = parseFloat(document.getElementById('rs-t0').value), b = parseFloat(document.getElementById('rs-t1').value);
      if (isFinite(a) && isFinite(b)) setView(a * 1e6, b * 1e6);
    });
    document.getElementById('rs-reset').addEventListener('click', function () {
      select.value = '';
      setView(FULL.t0, FULL.t1);
    });
    var pending = null;
    window.addEventListener('resize', function () {
      if (pending) clearTimeout(pending);
      pending = setTimeout(draw, 120);
    });
  }

