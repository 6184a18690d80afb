'use strict';
// What the overview (dashboard.js) and a job's page (job.js) share: building nodes, telling
// times, reading the API, and the writes behind the trigger, pause and resume buttons.
const TOKEN_KEY = 'shardcron-token';
const $ = (css) => document.querySelector(css);
// Where the API is, from the page: a job's page sits one level down.
const ROOT = document.body.dataset.root || '';

// The dialogs the writes open; static markup, no data in it.
document.body.insertAdjacentHTML('beforeend', `<dialog id="token-dialog">
  <form method="dialog">
    <h3>API token</h3>
    <p class="muted">Writes need the token of this node's <code>--api-token-env</code>. It is kept for this tab only.</p>
    <p class="hint" id="token-hint"></p>
    <label for="token-input">Token</label>
    <input id="token-input" type="password" autocomplete="off" required>
    <div class="buttons">
      <button id="token-save" class="primary" value="save">Save</button>
      <button value="cancel" formnovalidate>Cancel</button>
    </div>
  </form>
</dialog>

<dialog id="pause-dialog">
  <form method="dialog">
    <h3 id="pause-title">Pause</h3>
    <label for="pause-for">For (e.g. 30m, 2h, 1d; empty: until resumed)</label>
    <input id="pause-for" value="1h" autocomplete="off">
    <label for="pause-reason">Reason (optional)</label>
    <input id="pause-reason" autocomplete="off">
    <div class="buttons">
      <button id="pause-save" class="primary" value="save">Pause</button>
      <button value="cancel" formnovalidate>Cancel</button>
    </div>
  </form>
</dialog>
`);

// A DOM node; children may be strings (inserted as text, never parsed as HTML).
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === 'text') node.textContent = value;
    else if (value != null) node.setAttribute(key, value);
  }
  node.append(...children.filter((child) => child != null));
  return node;
}

// Each kind of outcome's colour in the charts, and the legend's words for it.
const COLOURS = {
  success: ['#2e9d5b', 'succeeded'],
  failure: ['#d1453b', 'failed, timed out or killed'],
  held: ['#d9a21b', 'skipped, paused, replaced or group full'],
  lost: ['#7b3fb5', 'lost or missed'],
};

function kind(run) {
  if (run.outcome === 'exited') return run.exit_code === 0 ? 'success' : 'failure';
  if (['skipped', 'paused', 'replaced', 'group_full'].includes(run.outcome)) return 'held';
  if (['lost', 'missed'].includes(run.outcome)) return 'lost';
  return 'failure';
}

// The legend of the charts' colours, into `list`.
function legend(list) {
  list.replaceChildren(...Object.values(COLOURS).map(([colour, text]) => {
    const swatch = el('span', { class: 'swatch' });
    swatch.style.background = colour;  // through the CSSOM: the policy allows no inline style
    return el('li', null, swatch, text);
  }));
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  node.append(...children);
  return node;
}

// A pool shard or job that no live node has the tags to run: said, with since when.
function unservedText(unserved) {
  return unserved.since ? `no eligible node since ${when(unserved.since)}` : 'no eligible node';
}

// ---- time ----
const pad = (n) => String(n).padStart(2, '0');
const clock = (d) => `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;

// Local time; the date too unless it is today.
function when(iso) {
  const d = new Date(iso);
  if (d.toDateString() === new Date().toDateString()) return clock(d);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${clock(d)}`;
}

function relative(iso) {
  const s = Math.round((new Date(iso) - Date.now()) / 1000);
  const a = Math.abs(s);
  if (a < 1) return 'now';
  const span = a < 60 ? `${a} s`
    : a < 3600 ? `${Math.floor(a / 60)} min`
    : a < 86400 ? `${Math.floor(a / 3600)} h ${Math.floor((a % 3600) / 60)} min`
    : `${Math.floor(a / 86400)} d ${Math.floor((a % 86400) / 3600)} h`;
  return s > 0 ? `in ${span}` : `${span} ago`;
}

// Relative times tick every second, between refreshes.
const rel = (iso) => el('span', { class: 'rel sub', 'data-at': iso, text: relative(iso) });
function tick() {
  for (const span of document.querySelectorAll('.rel')) span.textContent = relative(span.dataset.at);
}

function duration(ms) {
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  const s = Math.round(ms / 1000);
  return s < 3600 ? `${Math.floor(s / 60)}m ${s % 60}s` : `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}


function outcome(run) {
  if (run.outcome === 'exited') {
    return run.exit_code === 0 ? ['success', 'ok'] : [`failed (exit ${run.exit_code ?? '?'})`, 'bad'];
  }
  const quiet = ['replaced', 'skipped', 'paused', 'group_full'].includes(run.outcome);
  const why = run.blackout ? ` (blackout ${run.blackout})` : '';
  return [run.outcome.replace('_', ' ') + why, quiet ? 'warn' : 'bad'];
}

// ---- reading ----
// Reads send the stored token when there is one: a node may want one for reads too.
function readHeaders() {
  const headers = { Accept: 'application/json' };
  const stored = sessionStorage.getItem(TOKEN_KEY);
  if (stored) headers.Authorization = `Bearer ${stored}`;
  return headers;
}

class NeedsToken extends Error {}

async function read(path) {
  const res = await fetch(ROOT + path, { cache: 'no-store', headers: readHeaders() });
  const data = await res.json().catch(() => null);
  if (res.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    throw new NeedsToken(data && data.error ? data.error : 'this node needs a token for reads');
  }
  if (!res.ok || !data) {
    throw new Error(data && data.error ? `${data.error} (HTTP ${res.status})` : `HTTP ${res.status} ${res.statusText}`);
  }
  return data;
}

// ---- writing ----
function say(text, bad) {
  const message = $('#message');
  message.textContent = text;
  message.classList.toggle('bad', !!bad);
}

// Opens a dialog; resolves with what `read` makes of its fields on save, null on cancel or Esc.
function ask(dialog, read) {
  dialog.returnValue = '';
  dialog.showModal();
  return new Promise((resolve) => dialog.addEventListener('close',
    () => resolve(dialog.returnValue === 'save' ? read() : null), { once: true }));
}

async function token(hint) {
  const stored = sessionStorage.getItem(TOKEN_KEY);
  if (stored) return stored;
  $('#token-hint').textContent = hint || '';
  $('#token-input').value = '';
  const given = await ask($('#token-dialog'), () => $('#token-input').value.trim());
  $('#token-input').value = '';
  if (given) sessionStorage.setItem(TOKEN_KEY, given);
  return given;
}

function askPause(name) {
  $('#pause-title').textContent = `Pause ${name}`;
  $('#pause-for').value = '1h';
  $('#pause-reason').value = '';
  return ask($('#pause-dialog'), () => {
    const body = {};
    const length = $('#pause-for').value.trim();
    const reason = $('#pause-reason').value.trim();
    if (length) body.for = length;
    if (reason) body.reason = reason;
    return body;
  });
}

function done(action, name, data) {
  if (action === 'trigger') return `triggered ${name} on ${data.node} (fence ${data.fence})`;
  if (action === 'pause') {
    const until = data.paused && data.paused.until;
    return `paused ${name} ${until ? `until ${when(until)}` : 'until resumed'}`;
  }
  return data.resumed ? `resumed ${name}` : `${name} was not paused`;
}

// Asks for what `action` needs (a token, a pause's length), posts it, says how it went, and
// calls `after` once it was done.
async function act(name, action, button, after) {
  const body = action === 'pause' ? await askPause(name) : {};
  if (!body) return;
  button.disabled = true;
  try {
    let hint = '';
    for (;;) {
      const bearer = await token(hint);
      if (!bearer) return;
      const res = await fetch(`${ROOT}api/v1/jobs/${encodeURIComponent(name)}/${action}`, {
        method: 'POST',
        headers: { Authorization: `Bearer ${bearer}`, 'Content-Type': 'application/json', Accept: 'application/json' },
        body: JSON.stringify(body),
      });
      const data = await res.json().catch(() => ({}));
      if (res.status === 401) {
        sessionStorage.removeItem(TOKEN_KEY);
        hint = data.error || 'wrong token';
        continue;
      }
      if (res.status === 403) return say(data.error || 'writes are disabled on this node', true);
      if (!res.ok) return say(`${action} ${name} failed: ${data.error || res.statusText} (HTTP ${res.status})`, true);
      say(done(action, name, data));
      after();
      return;
    }
  } catch (err) {
    say(`${action} ${name} failed: ${err.message}`, true);
  } finally {
    button.disabled = false;
  }
}

