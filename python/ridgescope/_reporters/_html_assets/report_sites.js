// report_sites.js: the allocation sites at the peak and the flame graph of the peak by stack
// (see report_base.js).
  // ------------------------------------------------------------------ allocation sites
  // The peak by site (peak.by_site) and an icicle of the peak by stack (peak.stacks), drawn from
  // the report's frames (docs/sites.md). Kept apart from the rest of the page: own sections,
  // own functions, own state.
  var FRAMES = R.frames || [];
  // Texts and the library flag come with each frame, decided once in the core (docs/sites.md).
  function frameLabel(i) {
    var f = FRAMES[i];
    return f ? f.text : '(no site recorded)';
  }
  function frameTitle(i) {
    var f = FRAMES[i];
    if (!f) return '(no site recorded)';
    return f.location + ' (' + f.kind + (f.library ? ', library code' : '') + ')';
  }
  // Library frames (torch's, the standard library's, the interpreter's and libc's native ones)
  // are folded away unless the page's checkbox shows them; a stack's site always stays.
  var showLibrary = !!(R.html_view && R.html_view.library_frames);
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
      swatched(td, colorOf(s.category), s.category);
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
      var all = s.frames || [];
      var kept = showLibrary ? all : all.filter(function (f, j) { return j === s.site || !(FRAMES[f] || {}).library; });
      var path = kept.slice().reverse();
      var keys = path.map(function (f) { return 'f' + f; });
      var labels = path.map(function (f) { return frameLabel(f); });
      var titles = path.map(function (f) { return frameTitle(f); });
      if (!path.length && all.length) {  // nothing but library code
        keys = ['library'];
        labels = ['(library frames only)'];
        titles = ['(' + all.length + ' library frame(s), folded: tick "show library frames")'];
      } else if (!path.length) {
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
      (stacksMode() === 'site' ? 'Recorded with the default stacks="site": one frame per allocation; rs.track(..., stacks="python") records whole stacks.' : '') +
      (!showLibrary && FOLDED ? ' ' + FOLDED + ' library frame(s) of these stacks are folded away.' : '');
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
  // How many frames of the peak's stacks are library code (what folding hides).
  var FOLDED = 0;
  (R.peak.stacks || []).forEach(function (s) {
    (s.frames || []).forEach(function (f, j) { if (j !== s.site && (FRAMES[f] || {}).library) FOLDED += 1; });
  });
  function flameGraph() {
    if (!document.getElementById('rs-flame-box')) return;
    FLAME = flameTree();
    var reset = document.getElementById('rs-flame-reset');
    if (reset) reset.addEventListener('click', function () { flameView = null; drawFlame(); });
    var toggle = document.getElementById('rs-flame-library');
    if (toggle) {
      toggle.checked = showLibrary;
      toggle.addEventListener('change', function () {
        showLibrary = toggle.checked;
        flameView = null;
        FLAME = flameTree();
        drawFlame();
      });
    }
    drawFlame();
    var pending = null;
    window.addEventListener('resize', function () {
      if (pending) clearTimeout(pending);
      pending = setTimeout(drawFlame, 120);
    });
  }

