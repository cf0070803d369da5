// report_main.js: draws the page, last of its modules (see report_base.js).
  // ------------------------------------------------------------------ start
  header();
  glance();
  ooms();
  warnings();
  ledgers();
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
