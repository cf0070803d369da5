// report.js: draws a ridgescope report (docs/report_schema.md) embedded as JSON in the page.
// Self-contained: no library, no network. Exact integers the tests compare are exposed as
// data-* attributes (data-bytes, data-t0, data-t1).
(function () {
  'use strict';
  var SVG = 'http://www.w3.org/2000/svg';
  var R = JSON.parse(document.getElementById('rs-data').textContent);
  var T = R.timeline || null;
  var CATS = R.categories;
  var COLORS = {
    unknown: '#9ea7b3', parameter: '#4e79a7', buffer: '#76b7b2', gradient: '#f28e2b',
    optimizer_state: '#e15759', activation: '#59a14f', input: '#edc948', temporary: '#b07aa1',
    workspace: '#ff9da7', comm_buffer: '#9c755f'
  };
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

  // ------------------------------------------------------------------ formatting
  var UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  function fmtBytes(n) {
    if (n < 1024) return n + ' B';
    var v = n, u = 0;
    while (v >= 1024 && u < UNITS.length - 1) { v /= 1024; u++; }
    return (v < 10 ? v.toFixed(2) : v < 100 ? v.toFixed(1) : v.toFixed(0)) + ' ' + UNITS[u];
  }
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

  // ------------------------------------------------------------------ header and cards
  function header() {
    var run = R.run || {};
    var bits = ['device ' + R.device];
    if (R.device_capacity_bytes !== null && R.device_capacity_bytes !== undefined)
      bits.push('capacity ' + fmtBytes(R.device_capacity_bytes));
    bits.push(fmtInt(R.trace.events) + ' events');
    bits.push(fmtTime(R.trace.duration_ns));
    if (run.torch_version) bits.push('torch ' + run.torch_version);
    if (run.ridgescope_version) bits.push('ridgescope ' + run.ridgescope_version);
    document.getElementById('rs-subtitle').textContent = R.trace.path + ' — ' + bits.join(' · ');
    document.getElementById('rs-footer').textContent =
      'Report schema ' + R.schema_version + '. Bytes are exact integers; the chart keeps each ' +
      'column\u2019s lowest and highest live bytes, so no peak is hidden by downsampling.';

    var p = R.peak;
    var card = document.getElementById('rs-peak-info');
    card.setAttribute('data-bytes', String(p.bytes));
    card.appendChild(el('h3', null, 'Peak live bytes'));
    var big = el('div', { 'class': 'rs-big', id: 'rs-peak-value', 'data-bytes': String(p.bytes) },
                 fmtBytes(p.bytes));
    card.appendChild(big);
    card.appendChild(el('div', { 'class': 'rs-muted', id: 'rs-peak-exact' }, fmtInt(p.bytes) + ' bytes'));
    var dl = el('dl', { 'class': 'rs-kv' });
    kv(dl, 'when', 'step ' + p.step + ', ' + (p.phase_stack.length ? p.phase_stack.join(' › ') : 'idle') +
       ', at ' + fmtMs(p.time_ns) + ' ms');
    kv(dl, 'reserved', fmtBytes(p.reserved_bytes));
    card.appendChild(dl);
    var t = el('table', { id: 'rs-peak-composition', 'class': 'rs-table' });
    var any = false;
    CATS.forEach(function (c) {
      var b = p.by_category[c] || 0;
      if (!b) return;
      any = true;
      var tr = el('tr', { 'data-category': c, 'data-bytes': String(b) });
      var td = el('td');
      var sw = el('span', { 'class': 'rs-swatch' });
      sw.style.background = colorOf(c);
      td.appendChild(sw);
      td.appendChild(document.createTextNode(c + (p.inferred_by_category[c] ? ' (partly inferred)' : '')));
      tr.appendChild(td);
      tr.appendChild(el('td', { 'class': 'rs-num' }, fmtBytes(b)));
      tr.appendChild(el('td', { 'class': 'rs-num' }, p.bytes ? (100 * b / p.bytes).toFixed(1) + '%' : ''));
      t.appendChild(tr);
    });
    if (any) card.appendChild(t);

    var m = R.model || {};
    var mc = document.getElementById('rs-model');
    mc.appendChild(el('h3', null, 'Model' + (m['class'] ? ': ' + m['class'] : '')));
    dl = el('dl', { 'class': 'rs-kv' });
    if (m.parameters !== null && m.parameters !== undefined)
      kv(dl, 'parameters', fmtInt(m.parameters) + (m.parameter_tensors !== null ? ' in ' + m.parameter_tensors + ' tensors' : ''));
    if (m.trainable_parameters !== null && m.trainable_parameters !== undefined)
      kv(dl, 'trainable', fmtInt(m.trainable_parameters));
    kv(dl, 'parameter bytes', fmtBytes(m.parameter_bytes || 0));
    if (m.buffer_bytes) kv(dl, 'buffer bytes', fmtBytes(m.buffer_bytes));
    var dtypes = m.dtypes ? Object.keys(m.dtypes).map(function (k) { return k + ' ×' + m.dtypes[k]; }) : [];
    if (dtypes.length) kv(dl, 'dtypes', dtypes.join(', '));
    var pb = m.persistent_bytes_per_trainable_parameter || {};
    if (pb.expected !== null && pb.expected !== undefined) kv(dl, 'persistent B/param expected', pb.expected.toFixed(2));
    if (pb.measured !== null && pb.measured !== undefined)
      kv(dl, 'persistent B/param measured', pb.measured.toFixed(2) + (pb.measured_at ? ' (end of step ' + pb.measured_at.step + ')' : ''));
    mc.appendChild(dl);
    // every model the run held (an EMA copy, a frozen reference or teacher): docs/report_schema.md
    var models = m.models || [];
    if (models.length > 1) {
      var mt = el('table', { id: 'rs-models', 'class': 'rs-table' });
      var head = el('tr');
      ['model', 'class', 'parameters', 'bytes at the peak', ''].forEach(function (h) { head.appendChild(el('th', null, h)); });
      mt.appendChild(head);
      models.forEach(function (x) {
        var tr = el('tr', { 'data-model': x.name, 'data-bytes': String(x.at_peak.parameter_bytes + x.at_peak.buffer_bytes) });
        tr.appendChild(el('td', null, x.name));
        tr.appendChild(el('td', null, x['class'] || ''));
        tr.appendChild(el('td', { 'class': 'rs-num' }, fmtInt(x.parameters)));
        tr.appendChild(el('td', { 'class': 'rs-num' }, fmtBytes(x.at_peak.parameter_bytes + x.at_peak.buffer_bytes)));
        var notes = [x.trainable ? 'trainable' : 'frozen'];
        if (x.copy_of) notes.push('a copy of ' + x.copy_of + "'s parameters");
        if (x.created_at) notes.push('made at ' + x.created_at);
        tr.appendChild(el('td', { 'class': 'rs-muted' }, notes.join(', ')));
        mt.appendChild(tr);
      });
      mc.appendChild(mt);
    }

    var o = R.optimizer || {};
    var oc = document.getElementById('rs-optimizer');
    oc.appendChild(el('h3', null, 'Optimizer' + (o.type ? ': ' + o.type : '')));
    dl = el('dl', { 'class': 'rs-kv' });
    kv(dl, 'state bytes', fmtBytes(o.state_bytes || 0));
    if (o.states_per_parameter !== null && o.states_per_parameter !== undefined) kv(dl, 'states per parameter', o.states_per_parameter);
    if (o.state_keys && o.state_keys.length) kv(dl, 'state', o.state_keys.join(', '));
    kv(dl, 'optimizer steps', o.steps || 0);
    var hp = o.hyperparameters || {};
    var hk = Object.keys(hp).filter(function (k) { return typeof hp[k] !== 'boolean'; });
    if (hk.length) kv(dl, 'hyperparameters', hk.map(function (k) { return k + '=' + JSON.stringify(hp[k]); }).join(', '));
    oc.appendChild(dl);
  }

  function ooms() {
    if (!R.ooms || !R.ooms.length) return;
    var sec = document.getElementById('rs-ooms');
    sec.hidden = false;
    sec.appendChild(el('h2', null, 'Out of memory'));
    R.ooms.forEach(function (o, i) {
      var box = el('div', { 'class': 'rs-oom', id: 'rs-oom-' + i, 'data-request-bytes': String(o.request_bytes) });
      box.appendChild(el('h3', null, 'Failed to allocate ' + fmtBytes(o.request_bytes) + ' in step ' + o.step +
                         ', ' + o.phase + ' (at ' + fmtMs(o.time_ns) + ' ms)'));
      box.appendChild(el('div', null, 'live ' + fmtBytes(o.live_bytes) + ', reserved ' + fmtBytes(o.reserved_bytes) +
                         (o.device_free_bytes ? ', device free ' + fmtBytes(o.device_free_bytes) : '')));
      var v = o.verdict || {};
      if (v.summary) box.appendChild(el('p', { 'class': 'rs-verdict', 'data-kind': v.kind }, v.summary));
      if (v.evidence && v.evidence.length) {
        var ul = el('ul');
        v.evidence.forEach(function (x) { ul.appendChild(el('li', null, x)); });
        box.appendChild(el('strong', null, 'Evidence'));
        box.appendChild(ul);
      }
      if (v.remedies && v.remedies.length) {
        var ol = el('ol', { 'class': 'rs-remedies' });
        v.remedies.forEach(function (x) {
          var li = el('li', null, x.action);
          if (x.trade_off) li.appendChild(el('div', { 'class': 'rs-muted' }, 'Trade-off: ' + x.trade_off));
          ol.appendChild(li);
        });
        box.appendChild(el('strong', null, 'Remedies'));
        box.appendChild(ol);
      }
      sec.appendChild(box);
    });
  }

  function warnings() {
    var snap = R.snapshot;  // a report read from a torch memory snapshot: say what was inferred
    var items = (R.warnings || []).map(function (w) { return [w.kind, w.message]; });
    if (snap) {
      var inferred = Object.keys(snap.inferred || {}).filter(function (k) { return snap.inferred[k]; });
      items.unshift(['snapshot', 'Read from a torch memory snapshot written by ' + snap.producer +
        '; inferred: ' + (inferred.length ? inferred.join(', ').replace(/_/g, ' ') : 'nothing') + '.']);
      (snap.notes || []).forEach(function (n) { items.push(['snapshot_note', n]); });
    }
    if (!items.length) return;
    var sec = document.getElementById('rs-warnings');
    sec.hidden = false;
    sec.appendChild(el('h2', null, snap ? 'Provenance and warnings' : 'Warnings'));
    items.forEach(function (w) {
      sec.appendChild(el('div', { 'class': 'rs-warning', 'data-kind': w[0] }, w[1]));
    });
  }

  // ------------------------------------------------------------------ tables
  function tableHead(table, cols) {
    var tr = el('tr');
    cols.forEach(function (c) {
      var num = c.charAt(0) === '#';
      tr.appendChild(el('th', num ? { 'class': 'rs-num' } : null, num ? c.slice(1) : c));
    });
    var thead = el('thead');
    thead.appendChild(tr);
    table.appendChild(thead);
    var tbody = el('tbody');
    table.appendChild(tbody);
    return tbody;
  }
  function cell(tr, text, num, attrs) {
    var a = attrs || {};
    if (num) a['class'] = 'rs-num';
    var td = el('td', a, text);
    tr.appendChild(td);
    return td;
  }
  var MAX_ROWS = 2000;
  function note(tbody, span, text) {
    var tr = el('tr');
    tr.appendChild(el('td', { colspan: String(span), 'class': 'rs-note' }, text));
    tbody.appendChild(tr);
  }

  function stepsTable() {
    var table = document.getElementById('rs-table-steps');
    var tb = tableHead(table, ['step / phase', '#start ms', '#end ms', '#start', '#peak', '#end', 'composition at the peak']);
    var rows = 0, total = 0;
    R.steps.forEach(function (s) { total += 1 + s.phases.length; });
    if (!R.steps.length) note(tb, 7, 'The trace has no steps.');
    for (var i = 0; i < R.steps.length && rows < MAX_ROWS; i++) {
      var s = R.steps[i];
      var tr = el('tr', { 'class': 'rs-step-row', 'data-step': String(s.step), 'data-peak-bytes': String(s.peak_bytes) });
      if (s.step === R.peak.step && s.peak_bytes === R.peak.bytes) tr.className += ' rs-peak-row';
      cell(tr, 'step ' + s.step + (s.complete ? '' : ' (incomplete)'));
      cell(tr, fmtMs(s.begin_time_ns || 0), true);
      cell(tr, fmtMs(s.end_time_ns || 0), true);
      cell(tr, fmtBytes(s.start_bytes), true);
      cell(tr, fmtBytes(s.peak_bytes), true, { 'data-bytes': String(s.peak_bytes) });
      cell(tr, fmtBytes(s.end_bytes), true);
      tr.appendChild(el('td')).appendChild(composition(s.peak_by_category, s.peak_bytes));
      (function (step) { tr.addEventListener('click', function () { zoomToStep(step); }); })(s.step);
      tb.appendChild(tr);
      rows++;
      for (var j = 0; j < s.phases.length && rows < MAX_ROWS; j++) {
        var p = s.phases[j];
        var pr = el('tr', { 'class': 'rs-phase-row', 'data-step': String(p.step), 'data-phase': p.phase,
                            'data-peak-bytes': String(p.peak_bytes) });
        var name = el('td');
        name.style.paddingLeft = (18 + 14 * p.depth) + 'px';
        var sw = el('span', { 'class': 'rs-swatch' });
        sw.style.background = phaseColor(p.phase);
        name.appendChild(sw);
        name.appendChild(document.createTextNode(p.phase + (p.index ? ' #' + p.index : '') + (p.complete ? '' : ' (incomplete)')));
        pr.appendChild(name);
        cell(pr, fmtMs(p.begin_time_ns), true);
        cell(pr, fmtMs(p.end_time_ns), true);
        cell(pr, fmtBytes(p.start_bytes), true);
        cell(pr, fmtBytes(p.peak_bytes), true, { 'data-bytes': String(p.peak_bytes) });
        cell(pr, fmtBytes(p.end_bytes), true);
        pr.appendChild(el('td')).appendChild(composition(p.peak_by_category, p.peak_bytes));
        tb.appendChild(pr);
        rows++;
      }
    }
    if (rows < total) note(tb, 7, 'Showing the first ' + rows + ' of ' + total + ' rows; the JSON report has them all.');
    var shown = R.html_steps;
    if (shown && shown.total > R.steps.length)
      note(tb, 7, 'This page lists ' + R.steps.length + ' of the run\u2019s ' + shown.total + ' steps: the first, ' +
           'the last, those with the highest peaks and those around the run\u2019s peak. The chart shows every ' +
           'step; `ridgescope report --format json` lists them all.');
  }

  function blocksTable() {
    var table = document.getElementById('rs-table-blocks');
    var tb = tableHead(table, ['#bytes', 'category', 'label', 'module', 'site', 'allocated in', '#step', '#address']);
    var blocks = R.peak.top_blocks || [];
    if (!blocks.length) note(tb, 8, 'Nothing was live at the peak.');
    blocks.forEach(function (b) {
      var tr = el('tr', { 'data-bytes': String(b.bytes), 'data-category': b.category });
      cell(tr, fmtBytes(b.bytes), true, { title: fmtInt(b.bytes) + ' bytes' });
      var td = cell(tr, '');
      var sw = el('span', { 'class': 'rs-swatch' });
      sw.style.background = colorOf(b.category);
      td.appendChild(sw);
      td.appendChild(document.createTextNode(b.category + (b.inferred ? ' (inferred)' : '')));
      cell(tr, b.label);
      cell(tr, b.module || '—');
      cell(tr, b.site || '—', false, { 'class': 'rs-site' });
      cell(tr, b.phase_allocated);
      cell(tr, b.step_allocated, true);
      cell(tr, '0x' + Number(b.address).toString(16), true);
      tb.appendChild(tr);
    });
  }

  // Activation bytes at the peak grouped by the module that saved them: the labels
  // "activation saved in <module>" (docs/categories.md), other activation labels as they are.
  function modulesTable() {
    var table = document.getElementById('rs-table-modules');
    var tb = tableHead(table, ['module', '#bytes', '#blocks', '#share of activations']);
    var prefix = 'activation saved in ';
    var rows = (R.peak.by_label || []).filter(function (l) { return l.category === 'activation'; });
    var total = R.peak.by_category.activation || 0;
    if (!rows.length) note(tb, 4, 'No activation bytes were live at the peak.');
    rows.forEach(function (l) {
      var name = l.label.indexOf(prefix) === 0 ? l.label.slice(prefix.length) : l.label;
      var tr = el('tr', { 'data-bytes': String(l.bytes), 'data-module': name });
      cell(tr, name);
      cell(tr, fmtBytes(l.bytes), true, { title: fmtInt(l.bytes) + ' bytes' });
      cell(tr, l.blocks, true);
      cell(tr, total ? (100 * l.bytes / total).toFixed(1) + '%' : '', true);
      tb.appendChild(tr);
    });
    if (rows.length && (R.peak.by_label || []).length >= 1)
      note(tb, 4, 'Labels are grouped as recorded; the JSON report lists up to its top_labels limit.');
  }

  function labelsTable() {
    var table = document.getElementById('rs-table-labels');
    var tb = tableHead(table, ['label', 'category', '#bytes', '#blocks']);
    var rows = R.peak.by_label || [];
    if (!rows.length) note(tb, 4, 'Nothing was live at the peak.');
    rows.forEach(function (l) {
      var tr = el('tr', { 'data-bytes': String(l.bytes), 'data-category': l.category });
      cell(tr, l.label);
      var td = cell(tr, '');
      var sw = el('span', { 'class': 'rs-swatch' });
      sw.style.background = colorOf(l.category);
      td.appendChild(sw);
      td.appendChild(document.createTextNode(l.category));
      cell(tr, fmtBytes(l.bytes), true, { title: fmtInt(l.bytes) + ' bytes' });
      cell(tr, l.blocks, true);
      tb.appendChild(tr);
    });
  }

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
      var sw = el('span', { 'class': 'rs-swatch' });
      sw.style.background = colorOf(c);
      td.appendChild(sw);
      td.appendChild(document.createTextNode(c));
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
      var sw = el('span', { 'class': 'rs-swatch' });
      sw.style.background = colorOf(c);
      item.appendChild(sw);
      item.appendChild(document.createTextNode(c));
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
      var sw = el('span', { 'class': 'rs-swatch' });
      sw.style.background = PHASE_COLORS[ph];
      sw.style.opacity = '0.85';
      item.appendChild(sw);
      item.appendChild(document.createTextNode('phase ' + ph));
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

  // ------------------------------------------------------------------ allocation sites
  // The peak by site (peak.by_site) and an icicle of the peak by stack (peak.stacks), drawn from
  // the report's frames (docs/sites.md). Kept apart from the rest of the page: own sections,
  // own functions, own state.
  var FRAMES = R.frames || [];
  function frameLabel(i) {
    var f = FRAMES[i];
    if (!f) return '(no site recorded)';
    var file = (f.file || '').split('/').pop();
    if (f.kind === 'python' || f.kind === 'native')
      return (file || '?') + (f.line ? ':' + f.line : '') + (f['function'] ? ' in ' + f['function'] : '');
    if (f.kind === 'autograd') return f['function'] + (f.module ? ' of ' + f.module : '');
    return '(' + (f['function'] || 'no site') + ')';
  }
  function frameTitle(i) {
    var f = FRAMES[i];
    if (!f) return '(no site recorded)';
    if (f.kind === 'python' || f.kind === 'native')
      return (f.file || '?') + (f.line ? ':' + f.line : '') + (f['function'] ? ' in ' + f['function'] : '') + ' (' + f.kind + ')';
    return frameLabel(i) + ' (' + f.kind + ')';
  }
  function dominantCategory(byCat) {
    var best = 'unknown', bytes = -1;
    CATS.forEach(function (c) { var b = byCat[c] || 0; if (b > bytes) { bytes = b; best = c; } });
    return best;
  }

  function sitesTable() {
    var table = document.getElementById('rs-table-sites');
    if (!table) return;
    var tb = tableHead(table, ['site', 'category', '#bytes', '#blocks', '#share of the peak']);
    var rows = R.peak.by_site || [];
    if (!rows.length) note(tb, 5, 'No site was recorded (a trace from before sites, or stacks=None).');
    rows.forEach(function (s) {
      var tr = el('tr', { 'data-bytes': String(s.bytes), 'data-category': s.category, 'data-site': s.site });
      cell(tr, s.site, false, { title: s.frame !== null && s.frame !== undefined ? frameTitle(s.frame) : s.site });
      var td = cell(tr, '');
      var sw = el('span', { 'class': 'rs-swatch' });
      sw.style.background = colorOf(s.category);
      td.appendChild(sw);
      td.appendChild(document.createTextNode(s.category));
      cell(tr, fmtBytes(s.bytes), true, { title: fmtInt(s.bytes) + ' bytes' });
      cell(tr, s.blocks, true);
      cell(tr, R.peak.bytes ? (100 * s.bytes / R.peak.bytes).toFixed(1) + '%' : '', true);
      tb.appendChild(tr);
    });
  }

  // The icicle: the peak at the top, outermost frames below it, each frame as wide as the bytes
  // live under it and coloured by the category that holds most of them.
  var FLAME = null, flameView = null;
  function flameTree() {
    var root = { key: 'root', label: 'peak', bytes: 0, blocks: 0, byCat: {}, children: {}, depth: 0 };
    function add(node, s) {
      node.bytes += s.bytes;
      node.blocks += s.blocks;
      Object.keys(s.by_category || {}).forEach(function (c) { node.byCat[c] = (node.byCat[c] || 0) + s.by_category[c]; });
    }
    (R.peak.stacks || []).forEach(function (s, k) {
      add(root, s);
      var path = (s.frames || []).slice().reverse();
      var keys = path.map(function (f) { return 'f' + f; });
      var labels = path.map(function (f) { return frameLabel(f); });
      var titles = path.map(function (f) { return frameTitle(f); });
      if (!path.length) {
        var merged = R.peak.stacks_merged && k === R.peak.stacks.length - 1;
        keys = [merged ? 'merged' : 'none'];
        labels = [merged ? '(' + R.peak.stacks_merged + ' smaller stacks)' : '(no site recorded)'];
        titles = labels;
      }
      var node = root;
      keys.forEach(function (key, d) {
        var child = node.children[key];
        if (!child) child = node.children[key] = { key: key, label: labels[d], title: titles[d], bytes: 0, blocks: 0,
                                                    byCat: {}, children: {}, depth: d + 1, parent: node };
        add(child, s);
        node = child;
      });
    });
    return root;
  }
  function flameDepth(node) {
    var d = 0;
    Object.keys(node.children).forEach(function (k) { d = Math.max(d, flameDepth(node.children[k])); });
    return d + 1;
  }
  function drawFlame() {
    var box = document.getElementById('rs-flame-box');
    if (!box || !FLAME) return;
    clear(box);
    var W = Math.max(320, box.clientWidth || 1000), ROW = 18;
    var top = flameView || FLAME;
    var depth = flameDepth(top);
    var below = 0;  // the bytes of every child of the frame on top, drawn or too narrow to draw
    Object.keys(top.children).forEach(function (k) { below += top.children[k].bytes; });
    var svg = sv('svg', { id: 'rs-flame', width: W, height: depth * ROW + 2, viewBox: '0 0 ' + W + ' ' + (depth * ROW + 2),
                          'data-total-bytes': String(top.bytes), 'data-children-bytes': String(below) });
    box.appendChild(svg);
    function rect(node, x, w, level) {
      var cat = dominantCategory(node.byCat);
      var g = sv('g', { 'class': 'rs-flame-node', 'data-bytes': String(node.bytes), 'data-depth': String(level),
                        'data-category': cat, 'data-label': node.parent ? node.label : 'peak' }, svg);
      if (node === top) g.setAttribute('id', 'rs-flame-root');
      var r = sv('rect', { x: x.toFixed(2), y: level * ROW, width: Math.max(0.5, w - 0.5).toFixed(2), height: ROW - 1,
                           fill: node === top && !node.parent ? '#d0d7de' : colorOf(cat), rx: 1 }, g);
      var label = node === top && !node.parent ? 'peak ' + fmtBytes(node.bytes) : node.label;
      if (w > 36) {
        var t = sv('text', { x: (x + 3).toFixed(2), y: level * ROW + 13, 'class': 'rs-flame-label' }, g);
        var max = Math.floor((w - 6) / 6.2);
        t.textContent = label.length > max ? label.slice(0, Math.max(1, max - 1)) + '…' : label;
      }
      g.addEventListener('mouseenter', function (ev) { showTip(ev, flameTip(node)); });
      g.addEventListener('mousemove', function (ev) { placeTip(ev); });
      g.addEventListener('mouseleave', hideTip);
      g.addEventListener('click', function () { flameView = node === top ? (node.parent || null) : node; hideTip(); drawFlame(); });
      void r;
    }
    function layout(node, x, w, level) {
      rect(node, x, w, level);
      var kids = Object.keys(node.children).map(function (k) { return node.children[k]; });
      kids.sort(function (a, b) { return b.bytes - a.bytes || (a.label < b.label ? -1 : 1); });
      var cx = x;
      kids.forEach(function (c) {
        var cw = node.bytes > 0 ? w * c.bytes / node.bytes : 0;
        if (cw >= 0.5) layout(c, cx, cw, level + 1);
        cx += cw;
      });
    }
    layout(top, 0, W, 0);
    var info = document.getElementById('rs-flame-info');
    if (info) info.textContent = (flameView ? 'Showing ' + top.label + ' (' + fmtBytes(top.bytes) + '); click it to go up. ' : '') +
      (stacksMode() === 'site' ? 'Recorded with the default stacks="site": one frame per allocation; rs.track(..., stacks="python") records whole stacks.' : '');
  }
  function stacksMode() {
    var m = (R.metadata || {}).sites;
    try { return m ? JSON.parse(m).mode : null; } catch (e) { return null; }
  }
  function flameTip(node) {
    var div = el('div');
    div.appendChild(el('strong', null, node.parent ? node.title || node.label : 'The peak'));
    div.appendChild(el('div', null, fmtBytes(node.bytes) + ' (' + fmtInt(node.bytes) + ' bytes) in ' + fmtInt(node.blocks) +
      ' block(s), ' + (FLAME.bytes ? (100 * node.bytes / FLAME.bytes).toFixed(1) : '0') + '% of the peak'));
    div.appendChild(compositionRows(node.byCat, function (o, c) { return o[c] || 0; }));
    return div;
  }
  function flameGraph() {
    if (!document.getElementById('rs-flame-box')) return;
    FLAME = flameTree();
    var reset = document.getElementById('rs-flame-reset');
    if (reset) reset.addEventListener('click', function () { flameView = null; drawFlame(); });
    drawFlame();
    var pending = null;
    window.addEventListener('resize', function () {
      if (pending) clearTimeout(pending);
      pending = setTimeout(drawFlame, 120);
    });
  }

  // ------------------------------------------------------------------ start
  header();
  ooms();
  warnings();
  stepsTable();
  blocksTable();
  modulesTable();
  labelsTable();
  loadColumns();
  if (T) loadSpans();
  if (T) FULL = { t0: 0, t1: Math.max(1, T.columns * T.column_ns, T.end_time_ns) };
  if (T) FULL.t1 = Math.max(1, Math.min(FULL.t1, T.end_time_ns + 1));
  view = { t0: FULL.t0, t1: FULL.t1 };
  legend();
  controls();
  draw();
  sitesTable();
  flameGraph();
  document.body.setAttribute('data-ready', '1');
})();
