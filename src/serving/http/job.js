'use strict';
// A job's page: what it is and where it runs, its backfill's progress, its next fire times, its
// history as a table and as a timeline, each run's output on demand, and the trigger, pause and
// resume buttons.
const REFRESH_MS = 5000;
const DAY_MS = 24 * 3600 * 1000;
const name = decodeURIComponent(location.pathname.replace(/\/+$/, '').split('/').pop());
const path = `api/v1/jobs/${encodeURIComponent(name)}`;

// When the command started: its end less its duration. A run that was not run has none.
const startedAt = (run) => new Date(run.finished_at).getTime() - run.duration_ms;
const ran = (run) => run.attempts > 0;
const lateness = (run) => (ran(run) ? Math.max(0, startedAt(run) - new Date(run.scheduled_at).getTime()) : null);

let timer = 0;
let runs = [];
const opened = new Set();  // ticks whose output is shown

function fact(label, ...value) {
  return el('tr', null, el('th', { text: label }), el('td', null, ...value));
}

// The job's backfill, going or the last one: done of total, and its state.
function backfillFact(shown) {
  const b = shown.backfill;
  const state = shown.over ? (b.cancelled ? 'cancelled' : 'done') : (b.cancelled ? 'cancelling' : 'going');
  const running = b.in_flight.map((f) => `${f.tick} on ${f.node}`).join(', ');
  return fact('Backfill', el('progress', { id: 'backfill-progress', max: String(b.total), value: String(b.done) }),
    ` ${b.done}/${b.total} done · `, el('span', { class: shown.over ? 'muted' : 'warn', text: state }),
    ` · ${b.from} to ${b.to}`, running ? ` · running ${running}` : null);
}

// The job's notification record: whether it fails, what waits, the last event told.
function notificationFact(told) {
  const last = told.last;
  const lastText = last
    ? [el('span', { class: last.result === 'delivered' ? 'ok' : 'bad', text: `${last.event} ${last.result}` }),
      ` · tick ${when(last.scheduled_at)} · to ${last.notifier} ${when(last.at)}`]
    : [el('span', { class: 'muted', text: 'nothing told yet' })];
  return fact('Notified', ...lastText,
    told.pending ? el('span', { class: 'warn', text: ` · ${told.pending} waiting` }) : null,
    told.failing ? el('span', { class: 'bad', text: ' · failing' }) : null);
}

function renderJob(job, fleet, backfill) {
  document.title = `shardcron — ${job.name}`;
  $('#job-name').textContent = job.name;
  $('#cluster').textContent = `— ${fleet.cluster}`;
  const shard = fleet.shards.find((s) => s.shard === job.shard && (s.pool || null) === (job.pool || null));
  const leader = job.fan_out === 'all' ? 'every eligible node'
    : shard && shard.leader ? shard.leader
    : job.no_eligible_node ? unservedText(job.no_eligible_node) : 'none';
  const p = job.paused;
  const last = job.last_run;
  const rows = [
    fact('Schedule', el('code', { text: job.schedule })),
    fact('Time zone', job.timezone),
    fact('Shard', job.pool ? `${job.shard} of pool ${job.pool}` : String(job.shard)),
    fact('Leader', el('code', { text: leader })),
    fact('Paused', p ? el('span', { class: 'warn', text: p.until ? `until ${when(p.until)}` : 'until resumed' })
      : el('span', { class: 'muted', text: 'no' }), p && p.reason ? ` “${p.reason}”` : null),
    fact('Last run', ...(last ? [el('span', { class: outcome(last)[1], text: outcome(last)[0] }), ` · ${when(last.finished_at)} on ${last.node}`]
      : [el('span', { class: 'muted', text: 'never' })])),
  ];
  if (job.group) rows.push(fact('Group', el('code', { text: job.group })));
  const blackouts = job.blackouts_now || [];
  if (blackouts.length) {
    rows.push(fact('Blackout', el('span', { class: 'warn', text: `in ${blackouts.join(', ')} now` }), ': its ticks are recorded skipped'));
  }
  if (job.notification) rows.push(notificationFact(job.notification));
  if (backfill) rows.push(backfillFact(backfill));
  $('#facts tbody').replaceChildren(...rows);
  const chips = [[p ? 'paused' : 'active', p ? 'warn' : '']];
  if (job.no_eligible_node) chips.push([unservedText(job.no_eligible_node), 'bad']);
  if (blackouts.length) chips.push([`blackout ${blackouts.join(', ')}`, 'warn']);
  $('#summary').replaceChildren(...chips.map(([text, cls]) => el('li', { class: cls || null, text })));
  $('[data-action="resume"]').classList.toggle('primary', !!p);
}


function renderNext(plan) {
  $('#next tbody').replaceChildren(...plan.map((fire) => el('tr', null,
    el('td', null, el('code', { text: fire.at })),
    el('td', null, el('code', { text: fire.at_utc }), rel(fire.at_utc)),
    el('td', { class: fire.note ? 'warn' : 'muted', text: fire.note || '—' }))));
}

// The last 24 h, or less when the history kept starts later: one mark per run at its tick.
// A run is a bar from its start to its end, a thin line before it from its tick when it started
// late; a tick that did not run (skipped, lost, ...) is a block on the lower band.
function renderTimeline() {
  const chart = $('#timeline');
  const width = Math.max(320, chart.clientWidth || chart.parentNode.clientWidth);
  const height = 130;
  const margin = 12;
  const end = Date.now();
  const oldest = Math.min(...runs.map((run) => new Date(run.scheduled_at).getTime()), end - 30000);
  const start = Math.max(end - DAY_MS, oldest - (end - oldest) * 0.05);
  const x = (t) => margin + ((t - start) / (end - start)) * (width - 2 * margin);
  chart.setAttribute('viewBox', `0 0 ${width} ${height}`);
  chart.setAttribute('width', width);
  chart.setAttribute('height', height);
  const parts = [svg('line', { x1: margin, x2: width - margin, y1: 104, y2: 104, class: 'axis' })];
  const span = end - start;
  const step = [10e3, 30e3, 60e3, 300e3, 900e3, 3600e3, 3 * 3600e3, 6 * 3600e3].find((s) => span / s <= 8) || 6 * 3600e3;
  for (let t = Math.ceil(start / step) * step; t <= end; t += step) {
    const d = new Date(t);
    parts.push(svg('line', { x1: x(t), x2: x(t), y1: 14, y2: 104, class: 'grid' }),
      svg('text', { x: x(t), y: 120, class: 'label' }, step < 60e3 ? clock(d) : `${pad(d.getHours())}:${pad(d.getMinutes())}`));
  }
  for (const run of runs) {
    const tick = new Date(run.scheduled_at).getTime();
    if (tick < start) continue;
    const [colour] = COLOURS[kind(run)];
    const title = svg('title', {}, `${when(run.scheduled_at)} ${run.trigger} · ${outcome(run)[0]} · ${run.node}`
      + (ran(run) ? ` · ${duration(run.duration_ms)}, ${duration(lateness(run))} late` : ''));
    const common = { class: 'mark', fill: colour, 'data-outcome': run.outcome, 'data-tick': run.scheduled_at };
    if (ran(run)) {
      const from = x(startedAt(run));
      const to = Math.max(from + 2, x(new Date(run.finished_at).getTime()));
      if (lateness(run) > 0) parts.push(svg('line', { x1: x(tick), x2: from, y1: 45, y2: 45, class: 'late' }));
      parts.push(svg('rect', { ...common, x: from, y: 30, width: to - from, height: 30 }, title));
    } else {
      parts.push(svg('rect', { ...common, x: x(tick) - 1.5, y: 72, width: 3, height: 24 }, title));
    }
  }
  chart.replaceChildren(...parts);
  $('#timeline-span').textContent = `${when(new Date(start).toISOString())} – now`;
}

function renderHistory() {
  const tbody = $('#history tbody');
  const rows = [];
  for (const run of runs) {
    const [text, cls] = outcome(run);
    const late = lateness(run);
    const button = el('button', { type: 'button', 'data-output': run.scheduled_at, text: opened.has(run.scheduled_at) ? 'hide' : 'show' });
    rows.push(el('tr', { 'data-tick': run.scheduled_at },
      el('td', { 'data-label': 'tick' }, when(run.scheduled_at)),
      el('td', { 'data-label': 'trigger', text: run.trigger }),
      el('td', { 'data-label': 'node' }, el('code', { text: run.node })),
      el('td', { 'data-label': 'fence', class: 'num', text: String(run.fence) }),
      el('td', { 'data-label': 'outcome' }, el('span', { class: cls, text })),
      el('td', { 'data-label': 'exit', class: 'num', text: run.exit_code == null ? '—' : String(run.exit_code) }),
      el('td', { 'data-label': 'duration', class: 'num', text: ran(run) ? duration(run.duration_ms) : '—' }),
      el('td', { 'data-label': 'lateness', class: 'num', text: late == null ? '—' : duration(late) }),
      el('td', { 'data-label': 'attempts', class: 'num', text: String(run.attempts) }),
      el('td', { 'data-label': 'output' }, ran(run) ? button : el('span', { class: 'muted', text: '—' }))));
    const shown = opened.has(run.scheduled_at) && outputs.get(run.scheduled_at);
    if (shown) rows.push(el('tr', { class: 'output' }, el('td', { colspan: 10 }, shown)));
  }
  tbody.replaceChildren(...rows);
  $('#history-empty').hidden = runs.length > 0;
  $('#history-count').textContent = `${runs.length} run${runs.length === 1 ? '' : 's'} kept`;
}

const outputs = new Map();  // tick -> the node showing its output

async function showOutput(tick) {
  if (opened.has(tick)) { opened.delete(tick); renderHistory(); return; }
  const run = await read(`${path}/runs/${encodeURIComponent(tick)}`);
  const streams = [];
  if (!run.stdout && !run.stderr) streams.push(el('p', { class: 'muted', text: run.stdout == null ? 'no output kept' : 'printed nothing' }));
  for (const stream of ['stdout', 'stderr']) {
    if (!run[stream]) continue;
    streams.push(el('p', { class: 'sub', text: run[`${stream}_truncated`] ? `${stream}, its last bytes` : stream }),
      el('pre', { 'data-stream': stream, text: run[stream] }));
  }
  outputs.set(tick, el('div', null, ...streams));
  opened.add(tick);
  renderHistory();
}

async function refresh() {
  clearTimeout(timer);
  try {
    const [job, fleet, history, plan, backfill] = await Promise.all([
      read(path),
      read('api/v1/status?jobs=false'),
      read(`${path}/history?count=1000`).catch(() => []),
      read(`api/v1/plan?job=${encodeURIComponent(name)}&for=36500d&limit=5`),
      read(`${path}/backfill`).catch(() => null),  // 404: the job never had one
    ]);
    runs = history;
    renderJob(job, fleet, backfill);
    renderNext(plan.fires);
    renderTimeline();
    renderHistory();
    $('#error').textContent = '';
    $('#updated').textContent = `updated ${clock(new Date())}`;
  } catch (err) {
    if (err instanceof NeedsToken && await token(err.message)) { timer = setTimeout(refresh, 0); return; }
    $('#error').textContent = `refresh failed: ${err.message}`;
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

legend($('#legend'));
$('#actions').addEventListener('click', (event) => {
  const button = event.target.closest('button[data-action]');
  if (button) act(name, button.dataset.action, button, refresh);
});
$('#history tbody').addEventListener('click', (event) => {
  const button = event.target.closest('button[data-output]');
  if (button) showOutput(button.dataset.output).catch((err) => say(`cannot read the run's output: ${err.message}`, true));
});
window.addEventListener('resize', renderTimeline);
setInterval(tick, 1000);
refresh();
