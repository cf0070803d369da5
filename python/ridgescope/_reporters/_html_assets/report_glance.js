// report_glance.js: the run at a glance (docs/long-runs.md): one bar per step (or per bucket of
// steps on a long run: the step with the highest peak of the bucket), stacked by the peak's
// categories, the median as a line, the steps that stand out marked above their bars and the
// windows whose events the trace kept marked below; then the categories that grow and the
// standouts as tables. Reads R.at_a_glance (docs/report_schema.md); see report_base.js.
  function glance() {
    var G = R.at_a_glance, section = document.getElementById('rs-glance');
    if (!G || !G.rows || !G.rows.length || (G.keep_steps === null && G.steps <= 20)) return;
    section.hidden = false;
    var C = {};
    G.columns.forEach(function (name, i) { C[name] = i; });
    var cats = STACK_ORDER.filter(function (c) { return C['peak.' + c] !== undefined; });
    var info = document.getElementById('rs-glance-info');
    var kept = 0;
    G.windows.forEach(function (w) { kept += w.last_step - w.first_step + 1; });
    info.textContent = fmtInt(G.steps) + ' steps summarised; the events of ' + fmtInt(kept) + ' kept (' +
      (G.keep_steps === null ? 'every step' : 'keep_steps ' + G.keep_steps) + '). Median peak ' +
      fmtBytes(G.median_peak_bytes) + ', highest ' + fmtBytes(G.max_peak_bytes) + ' in step ' + G.max_peak_step + '.';
    var rows = G.rows, W = 1000, H = 220, left = 64, bottom = 30, top = 14;
    var n = rows.length, width = Math.min(n, 600), per = Math.ceil(n / width);
    var bars = [];
    for (var a = 0; a < n; a += per) {
      var best = a;
      for (var i = a; i < Math.min(n, a + per); i++) if (rows[i][C.peak_bytes] > rows[best][C.peak_bytes]) best = i;
      bars.push({ row: rows[best], first: rows[a][C.step], last: rows[Math.min(n, a + per) - 1][C.step] });
    }
    var maxBytes = Math.max(1, G.max_peak_bytes);
    var firstStep = rows[0][C.step], lastStep = rows[n - 1][C.step], span = Math.max(1, lastStep - firstStep + 1);
    var box = document.getElementById('rs-glance-box');
    var svg = sv('svg', { viewBox: '0 0 ' + W + ' ' + H, 'data-steps': String(G.steps),
                          'data-max-peak': String(G.max_peak_bytes), 'data-bars': String(bars.length) }, null);
    var x = function (step) { return left + (W - left - 8) * (step - firstStep) / span; };
    var y = function (bytes) { return top + (H - top - bottom) * (1 - bytes / maxBytes); };
    var bw = Math.max(1, (W - left - 8) / bars.length);
    bars.forEach(function (b) {
      var r = b.row, base = H - bottom, x0 = x(b.first);
      var g = sv('g', { 'class': 'rs-glance-bar', 'data-step': String(r[C.step]), 'data-bytes': String(r[C.peak_bytes]) }, svg);
      cats.forEach(function (c) {
        var v = r[C['peak.' + c]];
        if (!v) return;
        var h = (H - top - bottom) * v / maxBytes;
        sv('rect', { x: x0, y: base - h, width: Math.max(1, bw - (bw > 3 ? 1 : 0)), height: h, fill: colorOf(c) }, g);
        base -= h;
      });
      var t = sv('title', null, g);
      t.textContent = 'step ' + r[C.step] + (b.first !== b.last ? ' (highest of steps ' + b.first + '-' + b.last + ')' : '') +
        ': peak ' + fmtBytes(r[C.peak_bytes]) + cats.map(function (c) {
          return r[C['peak.' + c]] ? '\n  ' + c + ' ' + fmtBytes(r[C['peak.' + c]]) : '';
        }).join('');
    });
    var ym = y(G.median_peak_bytes);
    sv('line', { x1: left, x2: W - 8, y1: ym, y2: ym, stroke: '#333', 'stroke-dasharray': '4 3', 'stroke-width': 1 }, svg);
    var lm = sv('text', { x: left + 4, y: ym - 3, 'font-size': 11, fill: '#333' }, svg);
    lm.textContent = 'median ' + fmtBytes(G.median_peak_bytes);
    G.standouts.forEach(function (s) {
      var m = sv('circle', { cx: x(s.step) + bw / 2, cy: Math.max(top - 6, y(s.peak_bytes) - 5), r: 3,
                             fill: s.reasons.indexOf('oom') >= 0 ? '#d62728' : '#333', 'class': 'rs-glance-standout',
                             'data-step': String(s.step) }, svg);
      var t = sv('title', null, m);
      t.textContent = 'step ' + s.step + ': ' + s.reasons.join(', ');
    });
    G.windows.forEach(function (w) {
      var r = sv('rect', { x: x(w.first_step), y: H - bottom + 3, width: Math.max(2, x(w.last_step + 1) - x(w.first_step)),
                           height: 5, fill: '#4e79a7', 'class': 'rs-glance-window' }, svg);
      var t = sv('title', null, r);
      t.textContent = 'events kept: steps ' + w.first_step + '-' + w.last_step + ' (' + w.reasons.join(', ') + ')';
    });
    [0, 0.5, 1].forEach(function (f) {
      var ty = sv('text', { x: left - 6, y: y(maxBytes * f) + 4, 'font-size': 11, 'text-anchor': 'end', fill: '#555' }, svg);
      ty.textContent = fmtBytes(maxBytes * f);
    });
    [firstStep, Math.round((firstStep + lastStep) / 2), lastStep].forEach(function (s, k) {
      var tx = sv('text', { x: x(s) + (k === 2 ? bw : 0), y: H - 6, 'font-size': 11,
                            'text-anchor': ['start', 'middle', 'end'][k], fill: '#555' }, svg);
      tx.textContent = 'step ' + s;
    });
    box.appendChild(svg);
    var legend = document.getElementById('rs-glance-legend');
    cats.forEach(function (c) { swatched(legend, colorOf(c), c + ' '); });
    var table = document.getElementById('rs-table-glance');
    var head = el('tr');
    ['step', 'peak', 'over the median', 'why'].forEach(function (h) { head.appendChild(el('th', null, h)); });
    table.appendChild(head);
    var marks = {};
    G.marks.forEach(function (m) { marks[m[0]] = m[1]; });
    G.standouts.forEach(function (s) {
      var tr = el('tr', { 'data-step': String(s.step) });
      tr.appendChild(el('td', null, s.step));
      tr.appendChild(el('td', { 'data-bytes': String(s.peak_bytes) }, fmtBytes(s.peak_bytes)));
      tr.appendChild(el('td', null, (100 * s.over_median).toFixed(0) + '%'));
      tr.appendChild(el('td', null, s.reasons.join(', ') + (marks[s.step] ? ' (' + marks[s.step] + ')' : '')));
      table.appendChild(tr);
    });
    var grow = document.getElementById('rs-glance-growing');
    G.growing_categories.forEach(function (c) {
      grow.appendChild(el('div', null, c.category + ' grows from ' + fmtBytes(c.first_bytes) + ' to ' +
        fmtBytes(c.last_bytes) + ' at the step peaks (about ' + fmtBytes(c.growth_per_step_bytes) + ' per step)'));
    });
  }
