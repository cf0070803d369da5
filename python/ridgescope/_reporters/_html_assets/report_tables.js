// report_tables.js: the tables of steps and phases, blocks, modules and labels (see report_base.js).
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
        swatched(name, phaseColor(p.phase), p.phase + (p.index ? ' #' + p.index : '') + (p.complete ? '' : ' (incomplete)'));
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
      swatched(td, colorOf(b.category), b.category + (b.inferred ? ' (inferred)' : ''));
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
      swatched(td, colorOf(l.category), l.category);
      cell(tr, fmtBytes(l.bytes), true, { title: fmtInt(l.bytes) + ' bytes' });
      cell(tr, l.blocks, true);
      tb.appendChild(tr);
    });
  }

