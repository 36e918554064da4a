// dash.js — the dashboard's script (served as /static/dash.js; built into shoal-control).
//
// Every interval it fetches /v1/stats (only the samples after the last one it holds, with
// ?since=), keeps the window's series in memory, rebuilds the pools and namespaces tables, and
// updates the three charts in place (one line per namespace). Latest figures are in the DOM for
// tests and scripts: tr[data-ns=NAME] > td[data-field=F][data-value=V], and each chart's canvas
// carries data-seq (the last sample drawn) and data-points (figures drawn).
'use strict';

(function () {
  const METRICS = [
    { key: 'ops_per_sec', canvas: 'chart-ops', fmt: fmtOps },
    { key: 'hit_ratio', canvas: 'chart-ratio', fmt: fmtRatio },
    { key: 'memory_bytes', canvas: 'chart-memory', fmt: fmtBytes },
  ];
  const COLORS = ['#0969da', '#cf222e', '#1a7f37', '#8250df', '#bf8700', '#0a7ea4', '#e16f24',
                  '#6e7781', '#bf3989', '#116329'];
  const state = { seq: 0, times: [], ns: {}, cap: 601, interval: 1000, charts: {}, colors: {}, fails: 0 };

  function fmtOps(v) { return v == null ? '–' : v >= 100 ? v.toFixed(0) : v.toFixed(1); }
  function fmtRatio(v) { return v == null ? '–' : (100 * v).toFixed(1) + '%'; }
  function fmtBytes(v) {
    if (v == null) return '–';
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (i ? v.toFixed(1) : v.toFixed(0)) + ' ' + u[i];
  }
  function fmtTime(ms) { return new Date(ms).toTimeString().slice(0, 8); }

  function cell(tr, text, cls, field, value) {
    const td = document.createElement('td');
    td.textContent = text;
    if (cls) td.className = cls;
    if (field) {
      td.dataset.field = field;
      td.dataset.value = value == null ? '' : String(value);
    }
    tr.appendChild(td);
    return td;
  }

  function renderPools(pools) {
    const body = document.querySelector('#pools-table tbody');
    const rows = [];
    for (const name of Object.keys(pools).sort()) {
      const p = pools[name];
      for (const n of p.nodes) {
        const tr = document.createElement('tr');
        tr.dataset.pool = name;
        tr.dataset.node = n.node;
        tr.dataset.health = n.health;
        cell(tr, name + (p.gutter ? ' (gutter)' : ''));
        cell(tr, n.node);
        cell(tr, n.admin || '–');
        const h = cell(tr, n.health + (n.error ? ': ' + n.error : ''), 'health-' + n.health,
                       'health', n.health);
        h.title = n.error || '';
        cell(tr, String(n.slots), 'num', 'slots', n.slots);
        const ranges = n.ranges.map(r => r[0] === r[1] ? String(r[0]) : r[0] + '–' + r[1]);
        cell(tr, ranges.join(', ') || 'none', 'ranges', 'ranges',
             n.ranges.map(r => r[0] + '-' + r[1]).join(','));
        cell(tr, n.memory_bytes == null ? '–' : fmtBytes(n.memory_bytes) +
             (n.memory_limit ? ' / ' + fmtBytes(n.memory_limit) : ''), 'num', 'memory_bytes',
             n.memory_bytes);
        cell(tr, n.items == null ? '–' : String(n.items), 'num', 'items', n.items);
        cell(tr, n.topology_version == null ? '–' : String(n.topology_version), 'num',
             'topology_version', n.topology_version);
        rows.push(tr);
      }
    }
    body.replaceChildren(...rows);
  }

  // Add a reply's samples to what is held; a reply that does not follow on starts afresh.
  function merge(st) {
    state.interval = st.interval_ms;
    state.cap = Math.floor(st.window_s * 1000 / st.interval_ms) + 1;
    if (st.seq < state.seq || st.first_seq > state.seq + 1) {
      state.times = [];
      state.ns = {};
    }
    const added = st.times.length;
    const before = state.times.length;
    state.times.push(...st.times);
    for (const [name, s] of Object.entries(st.namespaces)) {
      let h = state.ns[name];
      if (!h) {
        h = state.ns[name] = { ops_per_sec: [], hit_ratio: [], memory_bytes: [] };
        for (const m of METRICS) h[m.key] = new Array(before).fill(null);
      }
      h.pool = s.pool;
      h.quota = s.quota_bytes;
      h.items = s.items;
      h.latest = s.latest;
      for (const m of METRICS) h[m.key].push(...s[m.key]);
    }
    for (const [name, h] of Object.entries(state.ns)) {
      if (!(name in st.namespaces)) {
        for (const m of METRICS) h[m.key].push(...new Array(added).fill(null));
        h.latest = { ops_per_sec: null, hit_ratio: null, memory_bytes: null };
      }
    }
    const over = state.times.length - state.cap;
    if (over > 0) {
      state.times.splice(0, over);
      for (const h of Object.values(state.ns)) for (const m of METRICS) h[m.key].splice(0, over);
    }
    for (const [name, h] of Object.entries(state.ns))
      if (METRICS.every(m => h[m.key].every(v => v == null))) delete state.ns[name];
    state.seq = st.seq;
  }

  function renderNamespaces() {
    const body = document.querySelector('#ns-table tbody');
    const rows = [];
    for (const name of Object.keys(state.ns).sort()) {
      const h = state.ns[name];
      const tr = document.createElement('tr');
      tr.dataset.ns = name;
      cell(tr, name);
      cell(tr, h.pool || '–');
      cell(tr, fmtOps(h.latest.ops_per_sec), 'num', 'ops_per_sec', h.latest.ops_per_sec);
      cell(tr, fmtRatio(h.latest.hit_ratio), 'num', 'hit_ratio', h.latest.hit_ratio);
      cell(tr, fmtBytes(h.latest.memory_bytes), 'num', 'memory_bytes', h.latest.memory_bytes);
      cell(tr, h.quota ? fmtBytes(h.quota) : 'none', 'num', 'quota_bytes', h.quota);
      cell(tr, h.items == null ? '–' : String(h.items), 'num', 'items', h.items);
      rows.push(tr);
    }
    body.replaceChildren(...rows);
  }

  // each namespace keeps the colour it first got, in the order they were first seen
  function color(name) {
    if (!(name in state.colors))
      state.colors[name] = COLORS[Object.keys(state.colors).length % COLORS.length];
    return state.colors[name];
  }

  function renderCharts() {
    if (typeof Chart === 'undefined') {
      document.getElementById('charts-missing').hidden = false;
      return;
    }
    const labels = state.times.map(fmtTime);
    const names = Object.keys(state.ns).sort();
    for (const m of METRICS) {
      const canvas = document.getElementById(m.canvas);
      let chart = state.charts[m.key];
      if (!chart) {
        chart = state.charts[m.key] = new Chart(canvas, {
          type: 'line',
          data: { labels: [], datasets: [] },
          options: {
            animation: false,
            maintainAspectRatio: false,
            spanGaps: false,
            elements: { point: { radius: 0 }, line: { borderWidth: 1.5 } },
            scales: {
              x: { ticks: { maxTicksLimit: 6, maxRotation: 0 } },
              y: { beginAtZero: true, ticks: { callback: v => m.fmt(v) },
                   max: m.key === 'hit_ratio' ? 1 : undefined },
            },
            plugins: { legend: { labels: { boxWidth: 12 } },
                       tooltip: { callbacks: { label: c => c.dataset.label + ': ' + m.fmt(c.parsed.y) } } },
          },
        });
      }
      // in place: the same chart and dataset objects, their arrays replaced
      chart.data.labels = labels;
      const keep = [];
      let points = 0;
      for (const name of names) {
        let ds = chart.data.datasets.find(d => d.label === name);
        if (!ds) ds = { label: name, borderColor: color(name), backgroundColor: color(name), data: [] };
        ds.data = state.ns[name][m.key].slice();
        points += ds.data.filter(v => v != null).length;
        keep.push(ds);
      }
      chart.data.datasets = keep;
      chart.update('none');
      canvas.dataset.seq = String(state.seq);
      canvas.dataset.points = String(points);
    }
  }

  async function tick() {
    const status = document.getElementById('status');
    try {
      const url = '/v1/stats' + (state.seq ? '?since=' + state.seq : '');
      const r = await fetch(url, { cache: 'no-store' });
      if (!r.ok) throw new Error('HTTP ' + r.status);
      const st = await r.json();
      merge(st);
      document.getElementById('version').textContent = String(st.version);
      renderPools(st.pools);
      renderNamespaces();
      renderCharts();
      state.fails = 0;
      status.className = '';
      status.textContent = 'sample ' + st.seq + (state.times.length ?
        ' at ' + fmtTime(state.times[state.times.length - 1]) : '') +
        ' · every ' + (st.interval_ms / 1000) + ' s';
      document.body.dataset.seq = String(st.seq);
    } catch (e) {
      state.fails++;
      status.className = 'stale';
      status.textContent = 'cannot reach shoal-control (' + e.message + '); figures are stale';
    }
    setTimeout(tick, Math.max(1000, state.interval));
  }

  tick();
})();
