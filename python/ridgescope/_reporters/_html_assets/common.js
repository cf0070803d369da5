// common.js: what both HTML pages (report.html, ranks.html) draw the same way: the category
// colours and the byte formatting. _html.py puts it first in each page's script, inside the one
// function that holds the page (no globals), before the page's own modules.
  var COLORS = {
    unknown: '#9ea7b3', parameter: '#4e79a7', buffer: '#76b7b2', gradient: '#f28e2b',
    optimizer_state: '#e15759', activation: '#59a14f', input: '#edc948', temporary: '#b07aa1',
    workspace: '#ff9da7', comm_buffer: '#9c755f'
  };

  // Bytes as a person reads them: the rule of csrc/core/util/format_bytes.h (C++, the one
  // definition; Python calls it as _C.format_bytes), written again for the pages, to the digit:
  // below 1024 the integer and " B"; else the value in the largest unit it reaches (up to PiB)
  // with 2 decimals below 10, 1 below 100, none above, rounded as C's printf rounds (the exact
  // value, ties to even; toFixed would round ties up). tests/python/test_format_bytes.py checks
  // that this and C++ print the same for a table of values. A negative count: its magnitude
  // with a minus sign.
  var BYTE_UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  function fmtBytes(n) {
    n = Math.round(Number(n));
    if (n < 0) return '-' + fmtBytes(-n);
    if (n < 1024) return String(n) + ' B';
    var v = n, u = 0;
    while (v >= 1024 && u < BYTE_UNITS.length - 1) { v /= 1024; u++; }
    var digits = v < 10 ? 2 : v < 100 ? 1 : 0;
    // v is n / 1024^u exactly; round n * 10^digits / 1024^u to an integer, ties to even.
    var scaled = BigInt(n) * BigInt(Math.pow(10, digits)), unit = BigInt(1) << BigInt(10 * u);
    var q = scaled / unit, twice = (scaled % unit) * BigInt(2);
    if (twice > unit || (twice === unit && q % BigInt(2) === BigInt(1))) q += BigInt(1);
    var s = q.toString();
    if (digits) {
      while (s.length <= digits) s = '0' + s;
      s = s.slice(0, s.length - digits) + '.' + s.slice(s.length - digits);
    }
    return s + ' ' + BYTE_UNITS[u];
  }
