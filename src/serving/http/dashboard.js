'use strict';
// The overview: nodes, shards, groups and a page of jobs, refreshed every few seconds.
const REFRESH_MS = 3000;
// Jobs are read a page at a time, filtered by the node: a fleet may run 100,000 of them.
const PER_PAGE = 100;
const FILTER_DELAY_MS = 250;

let status = null;  // the last status read: nodes and shards, no jobs
let jobsPage = null; // the last page of jobs read
let pageNo = 1;
let timer = 0;
let filterTimer = 0;
let seq = 0;        // the number of the newest read; older answers are dropped

// ---- rendering ----
function render() {
  const { cluster, shard_count: shardCount, nodes, shards } = status;
  document.title = `shardcron — ${cluster}`;
  $('#cluster').textContent = `— ${cluster}`;

  const leaderless = shards.filter((s) => s.leader == null && !s.no_eligible_node).length;
  const unserved = shards.filter((s) => s.no_eligible_node).length;
  const total = jobsPage ? jobsPage.total : 0;
  const paused = jobsPage ? jobsPage.paused : 0;
  const drifting = nodes.filter((n) => n.drift).length;
  const chips = [
    [`${nodes.length} node${nodes.length === 1 ? '' : 's'}`, nodes.length ? '' : 'bad'],
    [`${shardCount} shards`, ''],
    [`${leaderless} without leader`, leaderless ? 'bad' : ''],
    [`${total} jobs`, ''],
    [`${paused} paused`, paused ? 'warn' : ''],
  ];
  if (drifting) chips.push([`${drifting} with config drift`, 'bad']);
  if (unserved) chips.push([`${unserved} without an eligible node`, 'bad']);
  const groups = status.groups || [];
  const full = groups.filter((g) => g.running >= g.limit).length;
  if (full) chips.push([`${full} group${full === 1 ? '' : 's'} full`, 'warn']);
  $('#summary').replaceChildren(...chips.map(([text, cls]) => el('li', { class: cls || null, text })));

  $('#nodes tbody').replaceChildren(...nodes.map((n) => el('tr', null,
    el('td', null, el('code', { text: n.id })),
    el('td', { 'data-label': 'version', text: n.version }),
    n.drift
      ? el('td', { 'data-label': 'config', title: `node ${n.digest} ≠ cluster ${status.digest}` },
        el('span', { class: 'bad', text: 'differs' }))
      : el('td', { 'data-label': 'config', class: 'muted', text: 'same' }),
    el('td', { 'data-label': 'leads', class: 'num', text: String(n.leads) }),
    el('td', { 'data-label': 'started' }, when(n.started_at), rel(n.started_at)),
    el('td', { 'data-label': 'tags', class: 'tags' },
      ...((n.tags || []).length
        ? n.tags.flatMap((t, i) => (i ? [', ', el('code', { text: t })] : [el('code', { text: t })]))
        : [el('span', { class: 'muted', text: '—' })])))));

  $('#shards tbody').replaceChildren(...shards.map((s) => el('tr', null,
    el('td', { class: 'num', text: String(s.shard) }),
    s.leader == null
      ? el('td', { class: 'none' }, el('span', { class: 'bad', text: s.no_eligible_node ? unservedText(s.no_eligible_node) : 'none' }))
      : el('td', null, el('code', { text: s.leader })),
    el('td', { class: 'num', text: s.term == null ? '—' : String(s.term) }),
    el('td', { class: 'num', text: String(s.standby) }),
    el('td', { 'data-label': 'pool' }, s.pool ? el('code', { text: s.pool }) : el('span', { class: 'muted', text: '—' })))));

  $('#groups-section').hidden = !groups.length;
  $('#groups tbody').replaceChildren(...groups.map((g) => el('tr', { 'data-group': g.name },
    el('td', null, el('code', { text: g.name }),
      el('span', { class: 'sub', text: g.wait ? `waits ${g.wait}` : 'waits until the next tick' })),
    el('td', { 'data-label': 'running', class: g.running >= g.limit ? 'num warn' : 'num', text: String(g.running) }),
    el('td', { 'data-label': 'limit', class: 'num', text: String(g.limit) }),
    el('td', { 'data-label': 'waiting', class: g.waiting ? 'num warn' : 'num', text: String(g.waiting) }),
    el('td', { 'data-label': 'holders', class: 'tags' },
      ...(g.holders.length
        ? g.holders.flatMap((h, i) => {
          const holder = el('code', { text: `${h.job}@${h.node}`, title: `tick ${when(h.tick)}, since ${when(h.since)}` });
          return i ? [', ', holder] : [holder];
        })
        : [el('span', { class: 'muted', text: '—' })])))));

  renderJobs();
}


// Job rows are kept and updated in place, so a button found by a click (or a WebDriver test)
// stays in the page across refreshes.
const rows = new Map();  // job name -> { tr, key }
const LABELS = ['Job', 'Schedule', 'Next run', 'Last run', 'Paused', ''];
const CLASSES = ['name', 'schedule', 'next', 'last-run', 'paused', 'actions'];

function newRow(name) {
  const tr = el('tr', { 'data-job': name });
  CLASSES.forEach((cls, i) => tr.append(el('td', { class: cls, 'data-label': LABELS[i] })));
  tr.cells[5].append(el('div', null,
    el('button', { type: 'button', 'data-action': 'trigger', title: 'run it now', text: 'Trigger' }),
    el('button', { type: 'button', 'data-action': 'pause', text: 'Pause' }),
    el('button', { type: 'button', 'data-action': 'resume', text: 'Resume' })));
  return tr;
}

function fillRow(tr, job) {
  // One wrapper per cell: on phones the cell is a grid of its label and this.
  const set = (i, ...nodes) => tr.cells[i].replaceChildren(el('div', null, ...nodes));
  const where = [job.pool ? `pool ${job.pool} · shard ${job.shard}` : `shard ${job.shard}`];
  if (job.fan_out === 'all') where.push('every eligible node');
  if (job.group) where.push(`group ${job.group}`);
  set(0, el('a', { href: `jobs/${encodeURIComponent(job.name)}`, text: job.name }),
    el('span', { class: 'sub', text: where.join(' · ') }),
    ...(job.no_eligible_node ? [el('span', { class: 'bad', text: unservedText(job.no_eligible_node) })] : []));
  set(1, el('code', { text: job.schedule }), el('span', { class: 'sub', text: job.timezone }));
  set(2, ...(job.next ? [when(job.next), rel(job.next)] : [el('span', { class: 'muted', text: '—' })]));

  // A fanned-out job: the newest run of any node's instance, with how many nodes ran it.
  const instances = job.instances || [];
  const newest = (key) => instances.map((i) => i[key]).filter(Boolean)
    .sort((a, b) => (a.fence < b.fence ? 1 : -1))[0];
  const run = instances.length ? newest('last_run') : job.last_run;
  const claim = instances.length ? null : job.last_claim;
  const last = [];
  if (instances.length) last.push(el('span', { class: 'sub', text: `on ${instances.map((i) => i.node).join(', ')}` }));
  if (claim && (!run || claim.fence > run.fence)) {
    last.push(el('span', { class: 'warn', text: `running on ${claim.node}` }),
      el('span', { class: 'sub', text: `since ${when(claim.scheduled_at)}` }));
  }
  if (run) {
    const [text, cls] = outcome(run);
    const details = [when(run.finished_at), duration(run.duration_ms), run.node];
    if (run.attempts > 1) details.push(`${run.attempts} attempts`);
    last.push(el('span', null, el('span', { class: cls, text }), ` · ${run.trigger}`),
      el('span', { class: 'sub', text: details.join(' · ') }));
  } else if (!last.length) {
    last.push(el('span', { class: 'muted', text: 'never' }));
  }
  set(3, ...last);

  const p = job.paused;
  tr.classList.toggle('is-paused', !!p);
  if (p) {
    set(4, el('span', { class: 'warn', text: 'paused' }),
      p.until ? ` until ${when(p.until)}` : ' until resumed',
      el('span', { class: 'sub', text: p.reason ? `“${p.reason}”` : `since ${when(p.since)}` }));
  } else {
    set(4, el('span', { class: 'muted', text: '—' }));
  }
  tr.querySelector('[data-action="resume"]').classList.toggle('primary', !!p);
}

function renderJobs() {
  const tbody = $('#jobs tbody');
  const shown = jobsPage ? jobsPage.jobs : [];
  const query = $('#job-filter').value.trim();
  const names = new Set();
  let previous = null;
  for (const job of shown) {
    let row = rows.get(job.name);
    if (!row) rows.set(job.name, row = { tr: newRow(job.name), key: '' });
    const key = JSON.stringify(job);
    if (key !== row.key) fillRow(row.tr, job);
    row.key = key;
    names.add(job.name);
    const wanted = previous ? previous.nextSibling : tbody.firstChild;
    if (wanted !== row.tr) tbody.insertBefore(row.tr, wanted);  // moves only rows out of place
    previous = row.tr;
  }
  for (const [name, row] of rows) {
    if (!names.has(name)) { row.tr.remove(); rows.delete(name); }
  }

  const matched = jobsPage ? jobsPage.matched : 0;
  const total = jobsPage ? jobsPage.total : 0;
  const pages = Math.max(1, Math.ceil(matched / PER_PAGE));
  $('#job-count').textContent = jobsPage ? (query ? `${matched} of ${total} match` : `${total} jobs`) : '';
  $('.pager').hidden = !jobsPage || pages < 2;
  $('#page-info').textContent = `page ${Math.min(pageNo, pages)} of ${pages}`;
  $('#page-prev').disabled = pageNo <= 1;
  $('#page-next').disabled = pageNo >= pages;
  const empty = $('#jobs-empty');
  empty.hidden = !jobsPage || shown.length > 0;
  empty.textContent = query ? 'No job matches the filter.' : 'No jobs.';
}

// ---- the fleet strip ----
const ACTIVITY_EVERY_MS = 10000;  // nodes publish their counts every 10 s
let activityRead = 0;
let activity = null;

// The last hour's runs per minute, a bar per minute stacked by kind of outcome.
function renderStrip() {
  if (!activity) return;
  const chart = $('#strip');
  const width = Math.max(320, chart.clientWidth || chart.parentNode.clientWidth);
  const height = 90;
  const margin = 12;
  const base = 66;
  const minutes = activity.minutes;
  const most = Math.max(1, ...minutes.map((m) => m.success + m.failure + m.held + m.lost));
  const slot = (width - 2 * margin) / minutes.length;
  chart.setAttribute('viewBox', `0 0 ${width} ${height}`);
  chart.setAttribute('width', width);
  chart.setAttribute('height', height);
  const parts = [svg('line', { x1: margin, x2: width - margin, y1: base, y2: base, class: 'axis' })];
  minutes.forEach((minute, index) => {
    let top = base;
    for (const kind of ['success', 'failure', 'held', 'lost']) {
      const count = minute[kind];
      if (!count) continue;
      const tall = (count / most) * (base - 8);
      top -= tall;
      parts.push(svg('rect', {
        class: 'bar', 'data-kind': kind, 'data-count': count, 'data-minute': minute.at,
        x: margin + index * slot + 0.5, y: top, width: Math.max(1, slot - 1), height: tall, fill: COLOURS[kind][0],
      }, svg('title', {}, `${when(minute.at)}: ${count} ${COLOURS[kind][1]}`)));
    }
  });
  for (const [x, anchor, text] of [[margin, 'start', '60 min ago'], [width / 2, 'middle', '30 min ago'], [width - margin, 'end', 'now']]) {
    parts.push(svg('text', { x, y: 82, class: 'label', 'text-anchor': anchor }, text));
  }
  chart.replaceChildren(...parts);
}

async function refreshStrip() {
  if (Date.now() - activityRead < ACTIVITY_EVERY_MS) return;
  activityRead = Date.now();
  activity = await read('api/v1/activity');
  renderStrip();
}

async function refresh() {
  clearTimeout(timer);
  timer = 0;
  const mine = ++seq;
  const filter = $('#job-filter').value.trim();
  const query = new URLSearchParams({ filter, page: String(pageNo), per_page: String(PER_PAGE) });
  try {
    const [fleet, page] = await Promise.all([read('api/v1/status?jobs=false'), read(`api/v1/jobs?${query}`)]);
    if (mine !== seq) return;
    const pages = Math.max(1, Math.ceil(page.matched / PER_PAGE));
    if (pageNo > pages) {  // the list shrank under this page: show its last one
      pageNo = pages;
      timer = setTimeout(refresh, 0);
      return;
    }
    status = fleet;
    jobsPage = page;
    render();
    await refreshStrip();
    $('#error').textContent = '';
    $('#updated').textContent = `updated ${clock(new Date())}`;
  } catch (err) {
    if (mine !== seq) return;
    if (err instanceof NeedsToken) {
      const given = await token(err.message);
      if (given) { timer = setTimeout(refresh, 0); return; }
    }
    $('#error').textContent = `refresh failed: ${err.message}`;
  } finally {
    if (mine === seq && !timer) timer = setTimeout(refresh, REFRESH_MS);
  }
}

$('#jobs tbody').addEventListener('click', (event) => {
  const button = event.target.closest('button[data-action]');
  if (button) act(button.closest('tr').dataset.job, button.dataset.action, button, refresh);
});
$('#job-filter').addEventListener('input', () => {
  clearTimeout(filterTimer);
  filterTimer = setTimeout(() => { pageNo = 1; refresh(); }, FILTER_DELAY_MS);
});
$('#page-prev').addEventListener('click', () => { if (pageNo > 1) { pageNo -= 1; refresh(); } });
$('#page-next').addEventListener('click', () => { pageNo += 1; refresh(); });
legend($('#strip-legend'));
window.addEventListener('resize', renderStrip);
setInterval(tick, 1000);
refresh();
