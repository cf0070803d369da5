// report_cards.js: the header, the peak and model cards, the OOMs and the warnings (see report_base.js).
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
    var conf = R.snapshot && R.snapshot.confidence;  // a snapshot's inference: how sure
    var any = false;
    CATS.forEach(function (c) {
      var b = p.by_category[c] || 0;
      if (!b) return;
      any = true;
      var tr = el('tr', { 'data-category': c, 'data-bytes': String(b) });
      var td = el('td');
      swatched(td, colorOf(c), c + (p.inferred_by_category[c] ? ' (partly inferred)' : ''));
      tr.appendChild(td);
      tr.appendChild(el('td', { 'class': 'rs-num' }, fmtBytes(b)));
      tr.appendChild(el('td', { 'class': 'rs-num' }, p.bytes ? (100 * b / p.bytes).toFixed(1) + '%' : ''));
      if (conf) {
        var weak = conf.peak_by_evidence.weak[c] || 0;
        tr.appendChild(el('td', { 'class': 'rs-num rs-weak', 'data-weak-bytes': String(weak),
                                  title: 'decided by size or lifetime alone (the weaker rules)' },
                          weak ? fmtBytes(weak) + ' weak' : ''));
      }
      t.appendChild(tr);
    });
    if (any) card.appendChild(t);
    if (conf) snapshotConfidence(card, conf, p.bytes);

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

  // How a snapshot's peak was decided (snapshot.confidence, snapshot.reasons; docs/snapshot.md):
  // the share per kind of evidence, then the rules, largest first.
  function snapshotConfidence(card, conf, total) {
    var parts = Object.keys(conf.peak_bytes_by_evidence).filter(function (k) { return conf.peak_bytes_by_evidence[k]; })
      .map(function (k) { return (100 * conf.peak_bytes_by_evidence[k] / total).toFixed(1) + '% ' + conf.evidence_text[k]; });
    card.appendChild(el('p', { 'class': 'rs-muted', id: 'rs-peak-confidence',
                               'data-weak-share': String(conf.weak_share_of_peak) },
                        'Decided: ' + parts.join(', ') + ' (size or lifetime alone are the weaker rules).'));
    var rows = (R.snapshot.reasons || []).filter(function (r) { return r.peak_bytes > 0; }).slice(0, 12);
    if (!rows.length) return;
    var t = el('table', { id: 'rs-peak-reasons', 'class': 'rs-table' });
    var head = el('tr');
    ['category', 'bytes', 'evidence', 'why'].forEach(function (h) { head.appendChild(el('th', null, h)); });
    t.appendChild(head);
    rows.forEach(function (r) {
      var tr = el('tr', { 'data-rule': r.rule, 'data-evidence': r.evidence, 'data-bytes': String(r.peak_bytes) });
      var td = el('td');
      swatched(td, colorOf(r.category), r.category);
      tr.appendChild(td);
      tr.appendChild(el('td', { 'class': 'rs-num' }, fmtBytes(r.peak_bytes)));
      tr.appendChild(el('td', null, r.evidence));
      tr.appendChild(el('td', null, r.reason + ' [' + r.rule + ']'));
      t.appendChild(tr);
    });
    card.appendChild(t);
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

