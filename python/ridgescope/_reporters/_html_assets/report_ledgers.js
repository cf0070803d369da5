// report_ledgers.js: the report's two ledgers beside the composition (docs/forensics.md): the
// device ledger (the driver's figure = PyTorch reserved + memory outside PyTorch by library +
// the CUDA context + the unexplained remainder) and the host's resident set in three layers.
// Exact integers are exposed as data-bytes attributes. A module of report.html (report_base.js).
  var LEDGER_MAX_ROWS = 400;

  function ledgerTable(cols, rows) {
    var t = el('table', { 'class': 'rs-table' });
    var tr = el('tr');
    cols.forEach(function (c) { tr.appendChild(el('th', null, c)); });
    t.appendChild(el('thead')).appendChild(tr);
    var body = t.appendChild(el('tbody'));
    rows.forEach(function (r) {
      var row = el('tr');
      r.forEach(function (v) {
        if (typeof v === 'number') row.appendChild(el('td', { 'class': 'rs-num', 'data-bytes': String(v) }, fmtBytes(v)));
        else row.appendChild(el('td', null, v));
      });
      body.appendChild(row);
    });
    var box = el('div', { 'class': 'rs-scroll' });
    box.appendChild(t);
    return box;
  }
  function where(r) { return 'step ' + r.step + ', ' + r.phase; }

  function deviceLedger(d) {
    var div = el('div', { id: 'rs-device-ledger' });
    div.appendChild(el('h3', null, 'Device ledger'));
    var row = d.at_peak || d.last;
    if (!d.available || !row) {
      div.appendChild(el('p', { 'class': 'rs-muted' }, d.reason || 'No driver readings.'));
    } else {
      var src = d.driver_source === 'process' ? 'NVML, this process' : 'NVML, the whole device (this process was not listed)';
      div.appendChild(el('p', { 'class': 'rs-muted' },
        (d.at_peak ? 'At the peak' : 'At the last reading') + ' (' + where(row) + ')' +
        (row.exact ? '' : '; the device\u2019s memory changed between the peak and this reading') + '.'));
      div.appendChild(ledgerTable(['', 'bytes'], [
        ['driver (' + src + ')', row.driver_bytes],
        ['= PyTorch reserved', row.reserved_bytes],
        ['+ outside PyTorch, itemised', row.outside_bytes],
        ['+ CUDA context (first reading)', row.context_bytes],
        ['+ unexplained', row.unexplained_bytes]
      ]));
    }
    if (d.itemised) {
      var groups = d.groups || [];
      if (groups.length) {
        div.appendChild(el('h4', null, 'Allocations outside PyTorch, by library (CUPTI)'));
        div.appendChild(ledgerTable(['library', 'API', 'allocations', 'at the peak', 'at most', 'at the end', 'lifetime', 'site'],
          groups.map(function (g) {
            var life = 'from step ' + g.first_step + ' ' + g.first_phase +
              (g.end_bytes ? ', live to the end' : ' to step ' + g.last_free_step + ' ' + g.last_free_phase);
            var name = g.library_name === g.library ? g.library : g.library_name + ' (' + g.library + ')';
            return [name, g.api, String(g.allocations), g.bytes_at_peak, g.max_bytes, g.end_bytes, life, g.site || ''];
          })));
      } else {
        div.appendChild(el('p', { 'class': 'rs-muted' }, 'No allocation outside PyTorch was seen while tracking.'));
      }
    } else {
      div.appendChild(el('p', { 'class': 'rs-muted', id: 'rs-not-itemised' },
        'Memory outside PyTorch is not itemised: ' + d.itemise_reason));
    }
    var rows = (d.rows || []).slice(0, LEDGER_MAX_ROWS);
    if (rows.length) {
      div.appendChild(el('h4', null, 'At every phase boundary'));
      div.appendChild(ledgerTable(['step', 'phase', 'driver', 'reserved', 'outside', 'context', 'unexplained'],
        rows.map(function (r) {
          return [String(r.step), r.phase, r.driver_bytes, r.reserved_bytes, r.outside_bytes, r.context_bytes, r.unexplained_bytes];
        })));
    }
    return div;
  }

  function hostMemory(h) {
    var div = el('div', { id: 'rs-host-memory' });
    div.appendChild(el('h3', null, 'Host memory: the resident set in three layers'));
    var m = h.max_resident;
    if (m) {
      div.appendChild(el('p', { 'class': 'rs-muted' }, 'At its highest (' + where(m) + '): ' + fmtBytes(m.resident_bytes) +
        ' resident = PyTorch ' + fmtBytes(m.pytorch_bytes) + ' + the C allocator\u2019s slack ' +
        fmtBytes(m.allocator_slack_bytes) + ' + everything else ' + fmtBytes(m.outside_bytes) + '.'));
    }
    var rows = (h.rows || []).slice(0, LEDGER_MAX_ROWS);
    div.appendChild(ledgerTable(['step', 'phase', 'resident', 'PyTorch', 'never written', 'allocator slack', 'everything else',
                           'files and libraries', 'shared memory', 'other heap', 'remainder'],
      rows.map(function (r) {
        var o = r.outside;
        return [String(r.step), r.phase, r.resident_bytes, r.pytorch_bytes, r.untouched_bytes, r.allocator_slack_bytes,
                r.outside_bytes, o.files_bytes, o.shared_memory_bytes, o.other_heap_bytes, o.remainder_bytes];
      })));
    var carried = (h.rows || []).filter(function (r) { return r.malloc_known && r.malloc_time_ns !== r.time_ns; }).length;
    if (carried) {
      div.appendChild(el('p', { 'class': 'rs-muted' }, carried + ' of ' + (h.rows || []).length + ' readings carry glibc\u2019s ' +
        'counters (the allocator slack, the other heap) from an earlier reading: they walk every free chunk, so they are ' +
        'read under a time budget (after their first ' + (h.malloc_allowance_ns / 1e6) + ' ms, ' +
        (100 * h.malloc_share) + ' % of the run).'));
    }
    if (h.readings_skipped) {
      div.appendChild(el('p', { 'class': 'rs-muted' }, 'Read at ' + h.phase_end_readings + ' of ' +
        (h.phase_end_readings + h.readings_skipped) + ' phase ends (and when tracking started and stopped): the ' +
        'readings are kept under ' + (100 * h.reading_share) + ' % of the run\u2019s time, and every new high of ' +
        'torch\u2019s live CPU bytes is read.'));
    }
    if ((h.rows || []).length > LEDGER_MAX_ROWS || h.rows_dropped) {
      div.appendChild(el('p', { 'class': 'rs-muted' }, 'The first ' + rows.length + ' of ' + h.samples + ' readings are listed.'));
    }
    return div;
  }

  function ledgers() {
    var section = document.getElementById('rs-ledgers');
    if (!section || (!R.device_ledger && !R.host_memory)) return;
    section.hidden = false;
    section.appendChild(el('h2', null, 'Memory beside the composition'));
    if (R.device_ledger) section.appendChild(deviceLedger(R.device_ledger));
    if (R.host_memory) section.appendChild(hostMemory(R.host_memory));
  }
