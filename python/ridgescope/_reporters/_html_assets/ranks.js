// ranks.js: the merged multi-rank page (docs/distributed.md). Reads the merged report's `ranks`
// section (docs/report_schema.md) from the embedded JSON and draws, with plain DOM and SVG:
// the highest peak, two ranks side by side (chosen with the selectors or by clicking a row),
// the phases where ranks diverge, and a sortable table of every rank's peak.
// Its script is common.js (colours, byte formatting) and this, inside one function (_html.py).
  var D = JSON.parse(document.getElementById('rs-data').textContent);
  var S = D.ranks;
  var CATS = D.categories || Object.keys(COLORS);
  var rows = S.table;
  var good = rows.filter(function (r) { return r.status !== 'unreadable'; });

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    if (attrs) for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function svg(tag, attrs) {
    var e = document.createElementNS('http://www.w3.org/2000/svg', tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    return e;
  }
  function byRank(rank) {
    for (var i = 0; i < good.length; i++) if (good[i].rank === rank) return good[i];
    return null;
  }
  function compositionBar(r) {
    var bar = el('div', {'class': 'rs-bar', title: 'composition at the peak'});
    CATS.forEach(function (c) {
      var v = r.by_category[c] || 0;
      if (!v || !r.peak_bytes) return;
      var s = el('span', {title: c + ' ' + fmtBytes(v)});
      s.style.width = (100 * v / r.peak_bytes) + '%';
      s.style.background = COLORS[c] || '#888';
      bar.appendChild(s);
    });
    return bar;
  }

  function renderHeader() {
    var parts = [S.merged + ' of ' + S.traces + ' trace(s) merged'];
    if (S.world_size !== null) parts.push('world size ' + S.world_size);
    if (S.hosts.length) parts.push(S.hosts.length + ' host(s)');
    if (S.backends.length) parts.push('backend ' + S.backends.join(', '));
    document.getElementById('rs-subtitle').textContent = parts.join(' · ');
    var box = document.getElementById('rs-ranks-highest');
    box.appendChild(el('h3', null, 'Highest peak'));
    var hi = S.highest;
    if (!hi) { box.appendChild(el('div', null, 'No rank could be read.')); return; }
    box.appendChild(el('div', {'class': 'rs-big'}, 'rank ' + hi.rank + ': ' + fmtBytes(hi.peak_bytes)));
    box.appendChild(el('div', null, 'in step ' + hi.step + ', ' + hi.phase + '; ' +
      fmtBytes(hi.over_lowest_bytes) + ' (' + (100 * hi.over_lowest_fraction).toFixed(1) +
      '%) over the lowest, rank ' + hi.lowest_rank + ' (' + fmtBytes(hi.lowest_peak_bytes) +
      '); median ' + fmtBytes(hi.median_peak_bytes)));
  }

  function renderProblems() {
    var box = document.getElementById('rs-ranks-problems');
    box.appendChild(el('h3', null, 'Traces'));
    var list = S.problems.map(function (p) { return p.message; });
    if (S.missing_rank_count) list.unshift('missing ranks: ' + S.missing_ranks.join(', ') +
      (S.missing_rank_count > S.missing_ranks.length ? ' and ' + (S.missing_rank_count - S.missing_ranks.length) + ' more' : ''));
    if (!list.length) { box.appendChild(el('div', null, 'Every trace was read completely.')); return; }
    var ul = el('ul');
    list.forEach(function (m) { ul.appendChild(el('li', null, m)); });
    box.appendChild(ul);
  }

  // One rank's panel: a live-bytes chart on a scale shared by both panels, its composition at
  // the peak, and its phases' peaks next to the other rank's.
  function panel(r, other, scale) {
    var p = el('div', {'class': 'rs-rank-panel', 'data-rank': String(r.rank)});
    p.appendChild(el('h3', null, 'rank ' + r.rank + (r.host ? ' · ' + r.host : '') +
      (r.status === 'truncated' ? ' · truncated trace' : '')));
    p.appendChild(el('div', null, 'peak ' + fmtBytes(r.peak_bytes) + ' in step ' + r.step + ', ' +
      r.phase + '; reserved ' + fmtBytes(r.reserved_bytes)));
    var series = (S.timelines.ranks[String(r.rank)] || {}).max_bytes || [];
    var W = 400, H = 90, g = svg('svg', {viewBox: '0 0 ' + W + ' ' + H, role: 'img'});
    if (series.length) {
      var pts = series.map(function (v, i) {
        return (i * W / Math.max(1, series.length - 1)).toFixed(1) + ',' + (H - 4 - (H - 8) * v / scale).toFixed(1);
      });
      g.appendChild(svg('polyline', {points: pts.join(' '), fill: 'none', stroke: '#0969da', 'stroke-width': 1.5}));
      g.appendChild(svg('line', {x1: 0, x2: W, y1: H - 4 - (H - 8) * r.peak_bytes / scale,
        y2: H - 4 - (H - 8) * r.peak_bytes / scale, stroke: '#cf222e', 'stroke-dasharray': '3 3'}));
    }
    p.appendChild(g);
    p.appendChild(compositionBar(r));
    var t = el('table', {'class': 'rs-ranks'});
    var head = el('tr');
    head.appendChild(el('th', null, 'phase'));
    head.appendChild(el('th', {'class': 'rs-num'}, 'peak'));
    if (other) head.appendChild(el('th', {'class': 'rs-num'}, 'vs rank ' + other.rank));
    t.appendChild(head);
    var mine = S.phases[String(r.rank)] || {}, theirs = other ? (S.phases[String(other.rank)] || {}) : {};
    Object.keys(mine).forEach(function (k) {
      var tr = el('tr');
      tr.appendChild(el('td', null, k));
      tr.appendChild(el('td', {'class': 'rs-num'}, fmtBytes(mine[k])));
      if (other) tr.appendChild(el('td', {'class': 'rs-num'}, k in theirs ?
        ((mine[k] >= theirs[k] ? '+' : '-') + fmtBytes(Math.abs(mine[k] - theirs[k]))) : 'absent'));
      t.appendChild(tr);
    });
    p.appendChild(t);
    return p;
  }

  var selA = document.getElementById('rs-rank-a'), selB = document.getElementById('rs-rank-b');
  function renderCompare() {
    var a = byRank(Number(selA.value)), b = byRank(Number(selB.value));
    var box = document.getElementById('rs-ranks-panels');
    box.textContent = '';
    if (!a) return;
    var scale = Math.max(1, a.peak_bytes, b ? b.peak_bytes : 0);
    box.appendChild(panel(a, b && b !== a ? b : null, scale));
    if (b && b !== a) box.appendChild(panel(b, a, scale));
    var trs = document.querySelectorAll('#rs-ranks-table tr[data-rank]');
    for (var i = 0; i < trs.length; i++) {
      var rk = Number(trs[i].getAttribute('data-rank'));
      trs[i].classList.toggle('rs-selected', rk === a.rank || (b && rk === b.rank));
    }
  }
  function renderSelectors() {
    good.forEach(function (r) {
      selA.appendChild(el('option', {value: String(r.rank)}, 'rank ' + r.rank));
      selB.appendChild(el('option', {value: String(r.rank)}, 'rank ' + r.rank));
    });
    if (S.highest) {
      selA.value = String(S.highest.rank);
      selB.value = String(S.highest.lowest_rank);
    }
    selA.addEventListener('change', renderCompare);
    selB.addEventListener('change', renderCompare);
  }

  function renderDivergent() {
    var box = document.getElementById('rs-ranks-divergent-body');
    if (!S.divergent_phases.length) { box.textContent = 'No phase differs by 1% or more between ranks.'; return; }
    var t = el('table', {'class': 'rs-ranks'});
    var head = el('tr');
    ['phase', 'lowest', 'rank', 'highest', 'rank', 'spread'].forEach(function (h, i) {
      head.appendChild(el('th', {'class': i === 0 ? '' : 'rs-num'}, h));
    });
    t.appendChild(head);
    S.divergent_phases.forEach(function (p) {
      var tr = el('tr');
      tr.appendChild(el('td', null, p.phase + (p.on_every_rank ? '' : ' (on ' + p.ranks + ' ranks)')));
      tr.appendChild(el('td', {'class': 'rs-num'}, fmtBytes(p.min_bytes)));
      tr.appendChild(el('td', {'class': 'rs-num'}, String(p.min_rank)));
      tr.appendChild(el('td', {'class': 'rs-num'}, fmtBytes(p.max_bytes)));
      tr.appendChild(el('td', {'class': 'rs-num'}, String(p.max_rank)));
      tr.appendChild(el('td', {'class': 'rs-num'}, '+' + fmtBytes(p.spread_bytes) + ' (' + (100 * p.spread_fraction).toFixed(1) + '%)'));
      t.appendChild(tr);
    });
    box.appendChild(t);
  }

  var COLUMNS = [
    ['rank', 'rank', true], ['host', 'host', false], ['peak', 'peak_bytes', true],
    ['reserved', 'reserved_bytes', true], ['step', 'step', true], ['phase', 'phase', false],
    ['unknown', 'unknown_fraction', true], ['composition at the peak', null, false], ['trace', 'status', false]
  ];
  var sortKey = 'rank', sortDown = false;
  function renderTable() {
    var box = document.getElementById('rs-ranks-table');
    box.textContent = '';
    var t = el('table', {'class': 'rs-ranks'});
    var head = el('tr');
    COLUMNS.forEach(function (c) {
      var th = el('th', {'class': c[2] ? 'rs-num' : ''}, c[0] + (sortKey === c[1] ? (sortDown ? ' ▼' : ' ▲') : ''));
      if (c[1]) th.addEventListener('click', function () {
        sortDown = sortKey === c[1] ? !sortDown : c[2];
        sortKey = c[1];
        renderTable();
        renderCompare();
      });
      head.appendChild(th);
    });
    t.appendChild(head);
    var sorted = rows.slice().sort(function (x, y) {
      var a = x[sortKey], b = y[sortKey];
      if (a === undefined || a === null) a = -1;
      if (b === undefined || b === null) b = -1;
      var c = a < b ? -1 : a > b ? 1 : x.rank - y.rank;
      return sortDown ? -c : c;
    });
    sorted.forEach(function (r) {
      var tr = el('tr', {'data-rank': String(r.rank), 'class': r.status === 'ok' ? '' : 'rs-bad'});
      var bad = r.status === 'unreadable';
      tr.appendChild(el('td', {'class': 'rs-num'}, String(r.rank)));
      tr.appendChild(el('td', null, r.host || ''));
      tr.appendChild(el('td', {'class': 'rs-num'}, bad ? '' : fmtBytes(r.peak_bytes)));
      tr.appendChild(el('td', {'class': 'rs-num'}, bad ? '' : fmtBytes(r.reserved_bytes)));
      tr.appendChild(el('td', {'class': 'rs-num'}, bad ? '' : String(r.step)));
      tr.appendChild(el('td', null, bad ? '' : r.phase));
      tr.appendChild(el('td', {'class': 'rs-num'}, bad ? '' : (100 * r.unknown_fraction).toFixed(1) + '%'));
      var td = el('td');
      if (!bad) td.appendChild(compositionBar(r));
      tr.appendChild(td);
      tr.appendChild(el('td', {title: r.problem || ''}, r.status));
      if (!bad) tr.addEventListener('click', function () {
        selB.value = selA.value;
        selA.value = String(r.rank);
        renderCompare();
      });
      t.appendChild(tr);
    });
    box.appendChild(t);
  }

  renderHeader();
  renderProblems();
  renderSelectors();
  renderDivergent();
  renderTable();
  renderCompare();
  document.body.setAttribute('data-ready', '1');
