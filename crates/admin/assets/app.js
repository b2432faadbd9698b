// ethersan's dashboard: plain JavaScript, no dependencies. The API token
// comes from the URL fragment (#token=…, never sent to the server) or a
// form, and is kept in this tab's sessionStorage.
'use strict';

const TOKEN_KEY = 'ethersan-api-token';
const HISTORY = 60; // seconds of history in the charts
const COLORS = { read: '#2563eb', write: '#ea580c', p50: '#059669', p99: '#b91c1c' };

const $ = (sel) => document.querySelector(sel);
const state = { token: null, targets: [], sessions: [], series: new Map(), refreshTimer: null, abort: null };

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('data-')) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) {
    if (c == null) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

// --- messages ---------------------------------------------------------
function showError(msg) {
  const box = $('#error');
  box.textContent = msg;
  box.hidden = false;
}
function clearError() { $('#error').hidden = true; $('#error').textContent = ''; }
function notice(msg) {
  const box = $('#notice');
  box.textContent = msg;
  box.hidden = false;
  clearTimeout(notice.timer);
  notice.timer = setTimeout(() => { box.hidden = true; }, 6000);
}
function setStatus(text, cls) {
  const s = $('#status');
  s.textContent = text;
  s.className = 'status ' + (cls || '');
}

// --- the token ----------------------------------------------------------
function tokenFromFragment() {
  const m = location.hash.match(/(?:^#|&)token=([^&]+)/);
  if (!m) return null;
  // Out of the address bar (and the history) at once.
  history.replaceState(null, '', location.pathname + location.search);
  return decodeURIComponent(m[1]);
}

function askToken(why) {
  state.token = null;
  sessionStorage.removeItem(TOKEN_KEY);
  if (state.abort) state.abort.abort();
  clearInterval(state.refreshTimer);
  $('#main').hidden = true;
  $('#forget-token').hidden = true;
  $('#login').hidden = false;
  setStatus('not connected', 'down');
  if (why) showError(why);
  $('#token-input').focus();
}

function connect(token) {
  state.token = token;
  sessionStorage.setItem(TOKEN_KEY, token);
  $('#login').hidden = true;
  $('#main').hidden = false;
  $('#forget-token').hidden = false;
  refresh();
  clearInterval(state.refreshTimer);
  state.refreshTimer = setInterval(refresh, 5000);
  streamStats();
}

// --- the API --------------------------------------------------------------
class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(method, path, body) {
  const headers = { Authorization: 'Bearer ' + state.token };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let r;
  try {
    r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (e) {
    throw new ApiError(0, `${method} ${path}: the server cannot be reached (${e.message})`);
  }
  if (r.status === 401) {
    askToken('The server refused the token (401): enter the one in its --api-token-file.');
    throw new ApiError(401, 'unauthorized');
  }
  const text = await r.text();
  let data = null;
  if (text) { try { data = JSON.parse(text); } catch (_) { data = null; } }
  if (!r.ok) {
    const why = data && data.error ? data.error : (text || r.statusText);
    throw new ApiError(r.status, `${method} ${path}: ${r.status} ${why}`);
  }
  return data;
}

// --- targets, LUNs, sessions ---------------------------------------------
function bytes(n) {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n : n.toFixed(n < 10 ? 2 : 1)) + ' ' + units[i];
}

async function refresh() {
  try {
    const [targets, sessions] = await Promise.all([api('GET', '/api/v1/targets'), api('GET', '/api/v1/sessions')]);
    state.targets = targets;
    state.sessions = sessions;
    renderTree();
    renderSessions();
    renderTargetChoices();
  } catch (e) {
    if (e.status !== 401) showError(e.message);
  }
}

function renderTree() {
  const tree = $('#tree');
  tree.replaceChildren();
  if (state.targets.length === 0) tree.append(el('li', { class: 'empty' }, 'no targets'));
  for (const t of state.targets) {
    const luns = el('ul');
    for (const l of t.luns) {
      const ids = [l.naa ? 'NAA ' + l.naa : null, l.serial ? 'serial ' + l.serial : null].filter(Boolean).join(' · ');
      luns.append(el('li', { class: 'lun', 'data-lun': String(l.lun) },
        el('span', { class: 'name' }, `LUN ${l.lun}`), ' ',
        `${bytes(l.size_bytes)} · ${l.backend}${l.read_only ? ' · read-only' : ''}`,
        el('div', { class: 'meta' }, `${l.block_size}-byte blocks${ids ? ' · ' + ids : ''}`)));
    }
    if (t.luns.length === 0) luns.append(el('li', { class: 'empty' }, 'no LUNs'));
    for (const s of state.sessions.filter((s) => s.target === t.name)) {
      luns.append(el('li', { class: 'session' }, s.initiator,
        el('div', { class: 'meta' }, `${s.address || '?'} · ${s.transport || '?'} · session ${s.id}`)));
    }
    const acl = t.rules.length
      ? 'allowed: ' + t.rules.join(', ')
      : 'allowed: any initiator';
    tree.append(el('li', { class: 'target', 'data-target': t.name },
      el('span', { class: 'name' }, t.name),
      t.alias ? el('div', { class: 'meta' }, 'alias ' + t.alias) : null,
      el('div', { class: 'acl' }, acl + (t.chap_user ? ` · CHAP user ${t.chap_user}` : '')),
      luns));
  }
}

function renderSessions() {
  const body = $('#sessions-table tbody');
  body.replaceChildren();
  if (state.sessions.length === 0) {
    body.append(el('tr', {}, el('td', { class: 'empty', colSpan: 7 }, 'no sessions')));
  }
  for (const s of state.sessions) {
    body.append(el('tr', {},
      el('td', {}, s.id), el('td', {}, s.target || '(discovery)'), el('td', {}, s.initiator),
      el('td', {}, s.address || ''), el('td', {}, s.transport || ''),
      el('td', {}, s.counters.reads), el('td', {}, s.counters.writes)));
  }
}

function renderTargetChoices() {
  for (const sel of [$('#lun-target'), $('#grant-target')]) {
    const keep = sel.value;
    sel.replaceChildren(...state.targets.map((t) => el('option', { value: t.name }, t.name)));
    if (state.targets.some((t) => t.name === keep)) sel.value = keep;
  }
}

// --- the statistics stream (SSE read with fetch: it carries the header) --
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function streamStats() {
  if (state.abort) state.abort.abort();
  const ctl = new AbortController();
  state.abort = ctl;
  while (state.token && !ctl.signal.aborted) {
    try {
      const r = await fetch('/api/v1/stats/stream', {
        headers: { Authorization: 'Bearer ' + state.token, Accept: 'text/event-stream' },
        signal: ctl.signal,
      });
      if (r.status === 401) { askToken('The server refused the token (401).'); return; }
      if (!r.ok) throw new Error(`GET /api/v1/stats/stream: ${r.status} ${await r.text()}`);
      setStatus('live', 'live');
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value.replace(/\r\n?/g, '\n');
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          onEvent(buf.slice(0, i));
          buf = buf.slice(i + 2);
        }
      }
      throw new Error('the statistics stream ended');
    } catch (e) {
      if (ctl.signal.aborted) return;
      setStatus('reconnecting', 'down');
      showError('Statistics: ' + e.message + ' (reconnecting)');
    }
    await sleep(2000);
  }
}

function onEvent(block) {
  let event = 'message';
  const data = [];
  for (const line of block.split('\n')) {
    if (line.startsWith(':')) continue; // keep-alive comment
    const c = line.indexOf(':');
    const field = c < 0 ? line : line.slice(0, c);
    const value = c < 0 ? '' : line.slice(c + 1).replace(/^ /, '');
    if (field === 'event') event = value;
    else if (field === 'data') data.push(value);
  }
  if (data.length === 0) return;
  if (event === 'stats') onStats(JSON.parse(data.join('\n')));
  else if (event === 'error') showError('Statistics: ' + data.join('\n'));
}

function onStats(stats) {
  if ($('#error').textContent.startsWith('Statistics:')) clearError();
  setStatus('live', 'live');
  $('#session-count').textContent = stats.sessions;
  let iops = 0, mbps = 0;
  const seen = new Set();
  for (const l of stats.luns) {
    const key = `${l.target}/${l.lun}`;
    seen.add(key);
    iops += l.read_iops + l.write_iops;
    mbps += l.read_mbps + l.write_mbps;
    let s = state.series.get(key);
    if (!s) {
      s = { read_iops: [], write_iops: [], read_mbps: [], write_mbps: [], p50: [], p99: [], card: lunCard(key, l) };
      state.series.set(key, s);
    }
    const push = (arr, v) => { arr.push(v); if (arr.length > HISTORY) arr.shift(); };
    push(s.read_iops, l.read_iops); push(s.write_iops, l.write_iops);
    push(s.read_mbps, l.read_mbps); push(s.write_mbps, l.write_mbps);
    push(s.p50, l.p50_us); push(s.p99, l.p99_us);
    updateCard(s, l);
  }
  for (const [key, s] of state.series) {
    if (!seen.has(key)) { s.card.remove(); state.series.delete(key); }
  }
  const charts = $('#charts');
  const empty = charts.querySelector('.empty');
  if (state.series.size === 0 && !empty) charts.append(el('p', { class: 'empty' }, 'no LUNs'));
  if (state.series.size > 0 && empty) empty.remove();
  $('#total-iops').textContent = Math.round(iops);
  $('#total-mbps').textContent = mbps.toFixed(1);
  // A LUN the tree does not know yet: added elsewhere (ctl, a reload).
  const known = new Set(state.targets.flatMap((t) => t.luns.map((l) => `${t.name}/${l.lun}`)));
  if ([...seen].some((k) => !known.has(k))) refresh();
}

function lunCard(key, l) {
  const fig = (cls) => el('b', { class: cls }, '0');
  const card = el('div', { class: 'lun-card', 'data-key': key },
    el('h3', {}, `${l.target} · LUN ${l.lun}`),
    el('div', { class: 'figures' },
      el('span', {}, 'IOPS ', fig('iops')), el('span', {}, 'MB/s ', fig('mbps')),
      el('span', {}, 'p50 ', fig('p50'), ' µs'), el('span', {}, 'p99 ', fig('p99'), ' µs')),
    el('div', { class: 'legend' }, 'IOPS: ', el('span', { class: 'r' }, '■ read'), ' ', el('span', { class: 'w' }, '■ write')),
    el('canvas', { class: 'chart-iops' }),
    el('div', { class: 'legend' }, 'MB/s: ', el('span', { class: 'r' }, '■ read'), ' ', el('span', { class: 'w' }, '■ write')),
    el('canvas', { class: 'chart-mbps' }),
    el('div', { class: 'legend' }, 'latency µs: ', el('span', { class: 'p50' }, '■ p50'), ' ', el('span', { class: 'p99' }, '■ p99')),
    el('canvas', { class: 'chart-lat' }));
  $('#charts').append(card);
  return card;
}

function updateCard(s, l) {
  const c = s.card;
  c.querySelector('.iops').textContent = Math.round(l.read_iops + l.write_iops);
  c.querySelector('.mbps').textContent = (l.read_mbps + l.write_mbps).toFixed(1);
  c.querySelector('.p50').textContent = l.p50_us == null ? '–' : l.p50_us;
  c.querySelector('.p99').textContent = l.p99_us == null ? '–' : l.p99_us;
  draw(c.querySelector('.chart-iops'), [[s.read_iops, COLORS.read], [s.write_iops, COLORS.write]], (v) => Math.round(v));
  draw(c.querySelector('.chart-mbps'), [[s.read_mbps, COLORS.read], [s.write_mbps, COLORS.write]], (v) => v.toFixed(1));
  draw(c.querySelector('.chart-lat'), [[s.p50, COLORS.p50], [s.p99, COLORS.p99]], (v) => Math.round(v));
}

// A line chart of the last HISTORY seconds, scaled to its largest value.
function draw(canvas, lines, fmt) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (w === 0 || h === 0) return;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
  }
  const g = canvas.getContext('2d');
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, h);
  const pad = { l: 44, r: 4, t: 4, b: 4 };
  let max = 0;
  for (const [vals] of lines) for (const v of vals) if (v != null && v > max) max = v;
  const top = max > 0 ? max * 1.1 : 1;
  const x = (i) => pad.l + (w - pad.l - pad.r) * (i / (HISTORY - 1));
  const y = (v) => h - pad.b - (h - pad.t - pad.b) * (v / top);
  g.strokeStyle = '#d9dde5';
  g.lineWidth = 1;
  g.beginPath();
  g.moveTo(pad.l, y(0) + 0.5); g.lineTo(w - pad.r, y(0) + 0.5);
  g.moveTo(pad.l, y(top / 2) + 0.5); g.lineTo(w - pad.r, y(top / 2) + 0.5);
  g.stroke();
  g.fillStyle = '#667085';
  g.font = '10px system-ui, sans-serif';
  g.textBaseline = 'middle';
  if (max > 0) g.fillText(fmt(max), 2, Math.max(y(max), 8));
  g.fillText('0', 2, y(0) - 4);
  for (const [vals, color] of lines) {
    const off = HISTORY - vals.length;
    g.strokeStyle = color;
    g.lineWidth = 1.5;
    g.beginPath();
    let pen = false;
    vals.forEach((v, i) => {
      if (v == null) { pen = false; return; }
      if (pen) g.lineTo(x(off + i), y(v)); else g.moveTo(x(off + i), y(v));
      pen = true;
    });
    g.stroke();
  }
}

// --- forms ----------------------------------------------------------------
async function submitting(form, work) {
  const button = form.querySelector('button');
  button.disabled = true;
  try {
    clearError();
    await work();
  } catch (e) {
    if (e.status !== 401) showError(e.message);
  } finally {
    button.disabled = false;
  }
}

function setup() {
  $('#token-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const t = $('#token-input').value.trim();
    $('#token-input').value = '';
    clearError();
    if (t) connect(t);
  });
  $('#forget-token').addEventListener('click', () => askToken(null));
  $('#lun-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    submitting(ev.target, async () => {
      const target = $('#lun-target').value;
      const body = { spec: $('#lun-spec').value.trim() };
      const n = $('#lun-number').value.trim();
      if (n !== '') body.lun = Number(n);
      const lun = await api('POST', `/api/v1/targets/${encodeURIComponent(target)}/luns`, body);
      notice(`LUN ${lun.lun} (${bytes(lun.size_bytes)}, ${lun.backend}) added to ${target}`);
      $('#lun-spec').value = '';
      $('#lun-number').value = '';
      await refresh();
    });
  });
  $('#grant-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    submitting(ev.target, async () => {
      const target = $('#grant-target').value;
      const entry = $('#grant-entry').value.trim();
      const r = await api('POST', `/api/v1/targets/${encodeURIComponent(target)}/acl`, { entry });
      notice(r && r.warning ? r.warning : `${entry} may now log in to ${target}`);
      $('#grant-entry').value = '';
      await refresh();
    });
  });
  const token = tokenFromFragment() || sessionStorage.getItem(TOKEN_KEY);
  if (token) connect(token); else askToken(null);
}

setup();
