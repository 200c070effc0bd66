// kiln's web chat page: conversations kept in this browser (localStorage), answers streamed
// from /v1/chat/completions and rendered as Markdown (marked, sanitized by DOMPurify, code
// highlighted by highlight.js). No build step: this file is served as it is.
'use strict';

const KEYS = {
  conversations: 'kiln.conversations',
  current: 'kiln.current',
  settings: 'kiln.settings',
  apiKey: 'kiln.apiKey',
};

const DEFAULT_SETTINGS = {
  system: '',
  temperature: '',
  top_p: '',
  max_tokens: '',
  reasoning_format: 'auto',
  extra: '',
};

const $ = (id) => document.getElementById(id);

// ---- storage -------------------------------------------------------------------------------

function load(key, fallback) {
  try {
    const v = localStorage.getItem(key);
    return v === null ? fallback : JSON.parse(v);
  } catch {
    return fallback;
  }
}

function save(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
  } catch (err) {
    // (The browser's storage is full or off: say so where the model's name is.)
    setModel(state.model, `cannot keep conversations in this browser: ${err.message || err}`);
  }
}

const state = {
  conversations: load(KEYS.conversations, []),
  current: load(KEYS.current, null),
  settings: { ...DEFAULT_SETTINGS, ...load(KEYS.settings, {}) },
  model: null,
  // The answer being streamed: { controller, conversation, message }.
  busy: null,
};

function persist() {
  save(KEYS.conversations, state.conversations);
  save(KEYS.current, state.current);
}

function apiKey() {
  return localStorage.getItem(KEYS.apiKey) || '';
}

function conversation(id) {
  return state.conversations.find((c) => c.id === id) || null;
}

function newId() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
}

// ---- HTTP ----------------------------------------------------------------------------------

function headers() {
  const h = { 'Content-Type': 'application/json' };
  const key = apiKey();
  if (key) h.Authorization = 'Bearer ' + key;
  return h;
}

// The server's error text from an error answer's body (OpenAI's, Anthropic's or Ollama's
// shape), else the body itself, else the status.
async function errorText(response) {
  let body = '';
  try {
    body = await response.text();
  } catch {
    // (The body could not be read: the status says what there is.)
  }
  try {
    const v = JSON.parse(body);
    const e = v.error;
    const msg = (e && (e.message || (typeof e === 'string' && e))) || v.message;
    if (msg) return `${response.status}: ${msg}`;
  } catch {
    // (Not JSON.)
  }
  return `${response.status}: ${body.trim() || response.statusText || 'error'}`;
}

// A failed fetch (no answer at all) in words.
function networkError(err) {
  return `Cannot reach the server (${err && err.message ? err.message : err}). Is kiln serve still running?`;
}

async function loadModel() {
  let r;
  try {
    r = await fetch('/v1/models', { headers: headers() });
  } catch (err) {
    setModel(null, networkError(err));
    return;
  }
  if (r.status === 401) {
    const text = await errorText(r);
    setModel(null, text);
    askKey(apiKey() ? `The server refused the key: ${text}` : 'This server needs an API key.');
    return;
  }
  if (!r.ok) {
    setModel(null, await errorText(r));
    return;
  }
  try {
    const v = await r.json();
    setModel(v.data && v.data[0] && v.data[0].id, null);
  } catch (err) {
    setModel(null, String(err));
  }
}

function setModel(id, error) {
  state.model = id || null;
  const el = $('model');
  el.textContent = error ? `kiln · ${error}` : id || 'kiln';
  el.title = error || 'The served model';
  el.classList.toggle('failed', !!error);
}

// ---- rendering -----------------------------------------------------------------------------

function markdown(text) {
  if (!window.marked || !window.DOMPurify) {
    // (The libraries failed to load: show the text as text.)
    const p = document.createElement('p');
    p.className = 'plain';
    p.textContent = text;
    return p.outerHTML;
  }
  return DOMPurify.sanitize(marked.parse(text, { gfm: true, breaks: false }));
}

async function copyText(text, button) {
  let ok = false;
  try {
    await navigator.clipboard.writeText(text);
    ok = true;
  } catch {
    // (No clipboard API outside a secure context: the old way.)
    const t = document.createElement('textarea');
    t.value = text;
    t.style.position = 'fixed';
    t.style.opacity = '0';
    document.body.appendChild(t);
    t.select();
    try {
      ok = document.execCommand('copy');
    } catch {
      ok = false;
    }
    t.remove();
  }
  const was = button.textContent;
  button.textContent = ok ? 'Copied' : 'Copy failed';
  setTimeout(() => (button.textContent = was), 1200);
}

function copyButton(text, label) {
  const b = document.createElement('button');
  b.type = 'button';
  b.className = 'copy';
  b.textContent = label;
  b.addEventListener('click', () => copyText(typeof text === 'function' ? text() : text, b));
  return b;
}

// Markdown into `el`, each code block highlighted and given a copy button.
function renderMarkdown(el, text) {
  el.innerHTML = markdown(text);
  // (A link in an answer opens beside the chat, not over it.)
  for (const a of el.querySelectorAll('a[href]')) {
    a.target = '_blank';
    a.rel = 'noopener noreferrer';
  }
  for (const code of el.querySelectorAll('pre > code')) {
    if (window.hljs) hljs.highlightElement(code);
    const pre = code.parentElement;
    pre.classList.add('code');
    pre.appendChild(copyButton(() => code.textContent, 'Copy'));
  }
}

function formatStats(s) {
  const parts = [];
  if (s.tokens != null) parts.push(`${s.tokens} tokens`);
  if (s.tps != null && isFinite(s.tps)) parts.push(`${s.tps.toFixed(1)} tokens/s`);
  if (s.stopped) parts.push('stopped');
  return parts.join(' · ');
}

function messageElement(m) {
  const el = document.createElement('div');
  el.className = `message ${m.role}` + (m.pending ? ' pending' : '');
  if (m.role === 'user') {
    const body = document.createElement('div');
    body.className = 'body plain';
    body.textContent = m.content;
    el.appendChild(body);
    return el;
  }
  if (m.reasoning) {
    const d = document.createElement('details');
    d.className = 'reasoning';
    const s = document.createElement('summary');
    s.textContent = 'Reasoning';
    const r = document.createElement('div');
    r.className = 'plain';
    r.textContent = m.reasoning;
    d.append(s, r);
    el.appendChild(d);
  }
  const body = document.createElement('div');
  body.className = 'body';
  if (m.content) renderMarkdown(body, m.content);
  el.appendChild(body);
  if (m.error) {
    const e = document.createElement('p');
    e.className = 'error';
    e.textContent = m.error;
    el.appendChild(e);
  } else if (!m.content && !m.reasoning && !m.pending) {
    const e = document.createElement('p');
    e.className = 'hint';
    e.textContent = '(The model answered nothing.)';
    el.appendChild(e);
  }
  if (m.pending && !m.content && !m.reasoning && !m.error) {
    body.innerHTML = '<span class="dots">…</span>';
  }
  const foot = document.createElement('div');
  foot.className = 'foot';
  const stats = document.createElement('span');
  stats.className = 'stats';
  if (m.stats) stats.textContent = formatStats(m.stats);
  foot.appendChild(stats);
  if (m.content && !m.pending) foot.appendChild(copyButton(m.content, 'Copy answer'));
  el.appendChild(foot);
  return el;
}

function renderMessages() {
  const box = $('messages');
  const c = conversation(state.current);
  box.replaceChildren();
  if (!c || c.messages.length === 0) {
    const p = document.createElement('p');
    p.id = 'empty';
    p.className = 'hint';
    p.textContent = 'Send a message to start a conversation. Conversations are kept in this browser.';
    box.appendChild(p);
    return;
  }
  for (const m of c.messages) box.appendChild(messageElement(m));
  box.scrollTop = box.scrollHeight;
}

// Replace the last message's element (the one streaming) without redrawing the others.
function renderLast() {
  const box = $('messages');
  const c = conversation(state.current);
  if (!c || !box.lastElementChild || !box.lastElementChild.classList.contains('message')) {
    renderMessages();
    return;
  }
  const near = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
  box.lastElementChild.replaceWith(messageElement(c.messages[c.messages.length - 1]));
  if (near) box.scrollTop = box.scrollHeight;
}

function renderList() {
  const ul = $('conversations');
  ul.replaceChildren();
  const sorted = [...state.conversations].sort((a, b) => b.updated - a.updated);
  for (const c of sorted) {
    const li = document.createElement('li');
    li.className = 'conversation' + (c.id === state.current ? ' current' : '');
    li.dataset.id = c.id;
    const title = document.createElement('button');
    title.type = 'button';
    title.className = 'title';
    title.textContent = c.title;
    title.title = c.title;
    title.addEventListener('click', () => select(c.id));
    const rename = document.createElement('button');
    rename.type = 'button';
    rename.className = 'rename';
    rename.title = 'Rename';
    rename.textContent = '✎';
    rename.addEventListener('click', () => startRename(li, c));
    const del = document.createElement('button');
    del.type = 'button';
    del.className = 'delete';
    del.title = 'Delete';
    del.textContent = '✕';
    del.addEventListener('click', () => remove(c.id));
    li.append(title, rename, del);
    ul.appendChild(li);
  }
}

function render() {
  renderList();
  renderMessages();
  const busy = !!state.busy;
  $('send').hidden = busy;
  $('stop').hidden = !busy;
}

// ---- conversations -------------------------------------------------------------------------

function select(id) {
  state.current = id;
  persist();
  closeSidebar();
  render();
}

function startRename(li, c) {
  const input = document.createElement('input');
  input.className = 'rename-input';
  input.value = c.title;
  input.setAttribute('aria-label', 'New name');
  li.replaceChildren(input);
  input.focus();
  input.select();
  let done = false;
  const finish = (keep) => {
    if (done) return;
    done = true;
    const t = input.value.trim();
    if (keep && t) {
      c.title = t;
      persist();
    }
    renderList();
  };
  input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter') finish(true);
    if (e.key === 'Escape') finish(false);
  });
  input.addEventListener('blur', () => finish(true));
}

function remove(id) {
  const c = conversation(id);
  if (!c || !confirm(`Delete the conversation “${c.title}”?`)) return;
  if (state.busy && state.busy.conversation === c) state.busy.controller.abort();
  state.conversations = state.conversations.filter((x) => x.id !== id);
  if (state.current === id) state.current = null;
  persist();
  render();
}

function newChat() {
  state.current = null;
  persist();
  closeSidebar();
  render();
  $('input').focus();
}

// ---- sending -------------------------------------------------------------------------------

function number(v) {
  if (v === '' || v === null || v === undefined) return undefined;
  const n = Number(v);
  return isFinite(n) ? n : undefined;
}

// The request body for conversation `c` (whose last message is the empty answer to fill).
function requestBody(c) {
  const s = state.settings;
  const messages = [];
  if (s.system.trim()) messages.push({ role: 'system', content: s.system });
  for (const m of c.messages.slice(0, -1)) {
    // (Answers that failed with nothing in them are not part of the conversation.)
    if (m.role === 'assistant' && !m.content) continue;
    messages.push({ role: m.role, content: m.content });
  }
  const body = {
    messages,
    stream: true,
    stream_options: { include_usage: true },
    reasoning_format: s.reasoning_format,
  };
  if (state.model) body.model = state.model;
  for (const k of ['temperature', 'top_p', 'max_tokens']) {
    const n = number(s[k]);
    if (n !== undefined) body[k] = n;
  }
  if (s.extra.trim()) Object.assign(body, JSON.parse(s.extra));
  return body;
}

async function send(text) {
  if (state.busy || !text.trim()) return;
  let c = conversation(state.current);
  if (!c) {
    const now = Date.now();
    c = { id: newId(), title: text.trim().slice(0, 48), created: now, updated: now, messages: [] };
    state.conversations.push(c);
    state.current = c.id;
  }
  c.messages.push({ role: 'user', content: text });
  const answer = { role: 'assistant', content: '', reasoning: '', pending: true };
  c.messages.push(answer);
  c.updated = Date.now();
  persist();
  const controller = new AbortController();
  state.busy = { controller, conversation: c, message: answer };
  render();
  try {
    await stream(c, answer, controller);
  } finally {
    answer.pending = false;
    state.busy = null;
    c.updated = Date.now();
    persist();
    render();
  }
}

// Stream the answer into `answer`, redrawing it as tokens arrive.
async function stream(c, answer, controller) {
  const started = performance.now();
  let first = null;
  let deltas = 0;
  let usage = null;
  let scheduled = false;
  const redraw = () => {
    if (scheduled) return;
    scheduled = true;
    requestAnimationFrame(() => {
      scheduled = false;
      if (state.current === c.id) renderLast();
    });
  };
  const finishStats = (stopped) => {
    const end = performance.now();
    const tokens = usage ? usage.completion_tokens : deltas;
    // Tokens per second of the generation: from the first token to the last (the first one's
    // time is the prompt's); where they all came at once, over the whole request.
    const secs = first === null ? 0 : (end - first) / 1000;
    let tps = null;
    if (tokens > 1 && secs > 0.005) tps = (tokens - 1) / secs;
    else if (tokens > 0 && end > started) tps = tokens / ((end - started) / 1000);
    answer.stats = { tokens, tps, stopped, ms: Math.round(end - started) };
  };

  let body;
  try {
    body = JSON.stringify(requestBody(c));
  } catch (err) {
    answer.error = `The request fields in Settings are not valid JSON: ${err.message}`;
    return;
  }
  let r;
  try {
    r = await fetch('/v1/chat/completions', {
      method: 'POST',
      headers: headers(),
      body,
      signal: controller.signal,
    });
  } catch (err) {
    answer.error = controller.signal.aborted ? null : networkError(err);
    if (controller.signal.aborted) finishStats(true);
    return;
  }
  if (!r.ok) {
    answer.error = await errorText(r);
    if (r.status === 401) askKey(`The server refused the request: ${answer.error}`);
    return;
  }
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  let done = false;
  const onEvent = (data) => {
    if (data === '[DONE]') {
      done = true;
      return;
    }
    let v;
    try {
      v = JSON.parse(data);
    } catch {
      return;
    }
    if (v.error) {
      answer.error = v.error.message || JSON.stringify(v.error);
      return;
    }
    if (v.usage) usage = v.usage;
    const choice = v.choices && v.choices[0];
    const delta = choice && choice.delta;
    if (!delta) return;
    const piece = (delta.content || '') + (delta.reasoning_content || '');
    if (delta.content) answer.content += delta.content;
    if (delta.reasoning_content) answer.reasoning += delta.reasoning_content;
    if (piece) {
      if (first === null) first = performance.now();
      deltas += 1;
      redraw();
    }
  };
  try {
    for (;;) {
      const { value, done: end } = await reader.read();
      if (end) break;
      buffer += decoder.decode(value, { stream: true });
      let i;
      while ((i = buffer.indexOf('\n')) >= 0) {
        const line = buffer.slice(0, i).replace(/\r$/, '');
        buffer = buffer.slice(i + 1);
        if (line.startsWith('data:')) onEvent(line.slice(5).trim());
      }
    }
    if (!done && !answer.error) {
      answer.error = 'The answer ended early: the server closed the connection.';
    }
    finishStats(false);
  } catch (err) {
    if (controller.signal.aborted) {
      finishStats(true);
    } else {
      answer.error = `The answer was cut off: ${networkError(err)}`;
      finishStats(false);
    }
  }
}

function stop() {
  if (state.busy) state.busy.controller.abort();
}

// ---- dialogs -------------------------------------------------------------------------------

function openSettings() {
  const s = state.settings;
  $('set-system').value = s.system;
  $('set-temperature').value = s.temperature;
  $('set-top-p').value = s.top_p;
  $('set-max-tokens').value = s.max_tokens;
  $('set-reasoning').value = s.reasoning_format;
  $('set-extra').value = s.extra;
  $('settings-error').hidden = true;
  $('key-state').textContent = apiKey() ? 'set' : 'none';
  $('settings').showModal();
}

function saveSettings(e) {
  e.preventDefault();
  const extra = $('set-extra').value;
  if (extra.trim()) {
    let v;
    try {
      v = JSON.parse(extra);
    } catch (err) {
      v = err;
    }
    if (!v || typeof v !== 'object' || Array.isArray(v) || v instanceof Error) {
      const why = v instanceof Error ? v.message : 'not an object';
      $('settings-error').textContent = `Other request fields: not a JSON object (${why}).`;
      $('settings-error').hidden = false;
      return;
    }
  }
  state.settings = {
    system: $('set-system').value,
    temperature: $('set-temperature').value,
    top_p: $('set-top-p').value,
    max_tokens: $('set-max-tokens').value,
    reasoning_format: $('set-reasoning').value,
    extra,
  };
  save(KEYS.settings, state.settings);
  $('settings').close();
}

function askKey(reason) {
  const d = $('key-dialog');
  $('key-reason').textContent = reason;
  $('key-input').value = apiKey();
  if (!d.open) d.showModal();
  $('key-input').focus();
}

function saveKey(e) {
  e.preventDefault();
  const key = $('key-input').value.trim();
  if (key) localStorage.setItem(KEYS.apiKey, key);
  else localStorage.removeItem(KEYS.apiKey);
  $('key-dialog').close();
  loadModel();
}

// ---- phone layout --------------------------------------------------------------------------

function openSidebar() {
  document.body.classList.add('sidebar-open');
  $('scrim').hidden = false;
}

function closeSidebar() {
  document.body.classList.remove('sidebar-open');
  $('scrim').hidden = true;
}

// ---- start ---------------------------------------------------------------------------------

function start() {
  if (window.marked) marked.setOptions({ gfm: true });
  if (state.current && !conversation(state.current)) state.current = null;
  // An answer that was streaming when the page went away is kept as it was.
  for (const c of state.conversations) {
    for (const m of c.messages) {
      if (m.pending) {
        m.pending = false;
        if (!m.content && !m.error) m.error = 'The page was closed before the answer finished.';
      }
    }
  }
  $('composer').addEventListener('submit', (e) => {
    e.preventDefault();
    const input = $('input');
    const text = input.value;
    if (!text.trim() || state.busy) return;
    input.value = '';
    send(text);
  });
  $('input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $('composer').requestSubmit();
    }
  });
  $('stop').addEventListener('click', stop);
  $('new-chat').addEventListener('click', newChat);
  $('menu').addEventListener('click', () =>
    document.body.classList.contains('sidebar-open') ? closeSidebar() : openSidebar());
  $('scrim').addEventListener('click', closeSidebar);
  $('settings-open').addEventListener('click', openSettings);
  $('settings-form').addEventListener('submit', saveSettings);
  $('settings-cancel').addEventListener('click', () => $('settings').close());
  $('key-change').addEventListener('click', () => {
    $('settings').close();
    askKey('The key this page sends to the server (empty: none).');
  });
  $('key-form').addEventListener('submit', saveKey);
  $('key-cancel').addEventListener('click', () => $('key-dialog').close());
  render();
  loadModel();
}

document.addEventListener('DOMContentLoaded', start);
