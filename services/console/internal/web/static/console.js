// The console's live parts, as one small module with no dependencies:
// the agents table, chat replies, the bus topic viewer and an instance's
// logs, each read from the console's own Server-Sent Event streams.
// Everything that came from an agent, a bus payload or a log is put into
// the page with textContent only; the one innerHTML below takes a fragment
// the console rendered with html/template, which escaped it.

const csrf = document.querySelector('meta[name="csrf-token"]')?.content ?? '';

function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

function traceNode(id, url) {
  if (!id) return document.createTextNode('—');
  if (url && /^https?:\/\//.test(url)) {
    const a = el('a', 'trace', id);
    a.href = url;
    a.rel = 'noreferrer';
    return a;
  }
  return el('code', 'trace', id);
}

function banner(container, text) {
  container.replaceChildren();
  if (!text) return;
  const b = el('div', 'banner down');
  b.setAttribute('role', 'alert');
  b.textContent = text;
  container.append(b);
}

async function post(url, body) {
  const resp = await fetch(url, {
    method: 'POST',
    headers: { 'Accept': 'application/json', 'X-CSRF-Token': csrf, 'Content-Type': 'application/x-www-form-urlencoded' },
    body: body ?? new URLSearchParams({ csrf }),
    credentials: 'same-origin',
  });
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new Error(data?.error?.message ?? `${resp.status} ${resp.statusText}`);
  return data;
}

// ---- agents ----
function liveAgents() {
  const box = document.getElementById('agents');
  if (!box) return;
  const select = document.getElementById('agent_id');
  const src = new EventSource(box.dataset.live);
  src.addEventListener('agents', (e) => {
    const d = JSON.parse(e.data);
    // Replacing the table would drop the focus of a keyboard user on one of
    // its links to the top of the page: it moves to the same link in the
    // new table (the agent may be gone; then it stays on the section).
    const focused = box.contains(document.activeElement) ? document.activeElement.getAttribute('href') : null;
    box.innerHTML = d.html; // rendered and escaped by the console's template
    if (focused !== null) {
      const again = [...box.querySelectorAll('a[href]')].find((a) => a.getAttribute('href') === focused);
      (again ?? document.getElementById('agents-h')).focus();
    }
    box.dataset.count = String(d.count);
    if (select) {
      const keep = select.value;
      const known = new Set([...select.options].map((o) => o.value));
      for (const id of d.ids) {
        if (!known.has(id)) select.append(new Option(id, id));
      }
      if (keep) select.value = keep;
    }
  });
}

// ---- chat ----
function chat() {
  const form = document.getElementById('chat-form');
  if (!form) return;
  const log = document.getElementById('chat-log');
  const status = document.getElementById('chat-status');
  const traceBox = document.getElementById('chat-trace');
  const cancel = document.getElementById('cancel-chat');
  const send = document.getElementById('send');
  let current = null;
  let reply = null; // the text item consecutive text chunks grow

  const labels = {
    thinking: 'Thinking', text: 'Reply', tool_use: 'Tool call', tool_result: 'Tool result',
    tool_state: 'Tool state', file: 'File', usage: 'Usage', session: 'Session', done: 'Done',
    error: 'Error', cancelled: 'Cancelled', failed: 'Failed',
  };
  function show(ev) {
    if (ev.kind === 'text' && reply) {
      reply.querySelector('.text').textContent += ev.text;
      return;
    }
    const li = el('li', `ev ${ev.kind}`);
    li.append(el('span', 'kind', labels[ev.kind] ?? ev.kind));
    if (ev.name) li.append(el('code', '', ev.name), document.createTextNode(' '));
    if (ev.kind === 'tool_result' && ev.is_error) li.append(el('strong', '', 'FAILED '));
    li.append(el('span', 'text', ev.text ?? ''));
    log.append(li);
    reply = ev.kind === 'text' ? li : null;
  }

  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    if (current) current.close();
    log.replaceChildren();
    reply = null;
    status.textContent = 'Sending…';
    send.disabled = true;
    let started;
    try {
      started = await post('/chats', new URLSearchParams(new FormData(form)));
    } catch (err) {
      status.textContent = `Not sent: ${err.message}`;
      send.disabled = false;
      return;
    }
    traceBox.replaceChildren(traceNode(started.trace_id, started.trace_url));
    status.textContent = 'Streaming the reply…';
    log.dataset.state = 'streaming';
    cancel.disabled = false;
    cancel.onclick = async () => {
      cancel.disabled = true;
      try { await post(started.cancel); status.textContent = 'Cancelling…'; } catch (err) { status.textContent = `Cancel failed: ${err.message}`; }
    };
    const src = new EventSource(started.events);
    current = src;
    src.addEventListener('event', (m) => show(JSON.parse(m.data)));
    src.addEventListener('end', () => {
      src.close();
      current = null;
      const last = log.lastElementChild?.classList[1] ?? '';
      status.textContent = last === 'failed' ? 'The reply failed.' : 'The reply has ended.';
      log.dataset.state = 'ended';
      cancel.disabled = true;
      send.disabled = false;
    });
    src.onerror = () => { if (src.readyState === EventSource.CLOSED) { status.textContent = 'The stream was lost.'; send.disabled = false; } };
  });
}

// ---- bus ----
function bus() {
  const body = document.getElementById('bus-messages');
  if (!body) return;
  const form = document.getElementById('watch-form');
  const input = document.getElementById('pattern');
  const status = document.getElementById('watch-status');
  const stop = document.getElementById('stop-watch');
  const bannerBox = document.getElementById('bus-banner');
  let src = null;

  function watch(pattern) {
    if (src) src.close();
    body.replaceChildren();
    banner(bannerBox, '');
    status.textContent = `Connecting to ${pattern}…`;
    status.dataset.state = 'connecting';
    src = new EventSource(`/live/bus?pattern=${encodeURIComponent(pattern)}`);
    stop.disabled = false;
    src.addEventListener('subscribed', () => {
      status.textContent = `Watching ${pattern}.`;
      status.dataset.state = 'watching';
    });
    src.addEventListener('message', (e) => {
      const m = JSON.parse(e.data);
      const tr = el('tr');
      const payload = el('td');
      payload.append(el('pre', 'payload', m.payload));
      const trace = el('td');
      trace.append(traceNode(m.trace_id, m.trace_url));
      tr.append(el('td', '', m.received), el('td', '', m.topic), payload, trace, el('td', '', m.ack));
      body.prepend(tr);
      while (body.rows.length > 500) body.deleteRow(-1);
    });
    src.addEventListener('dropped', (e) => {
      status.textContent = `Watching ${pattern}; ${JSON.parse(e.data).count} messages dropped (the page read too slowly).`;
    });
    src.addEventListener('failure', (e) => {
      const d = JSON.parse(e.data);
      banner(bannerBox, d.banner);
      status.textContent = 'Not watching.';
      status.dataset.state = 'failed';
      src.close();
      stop.disabled = true;
    });
  }
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const pattern = input.value.trim();
    if (!pattern) return;
    history.replaceState(null, '', `/bus?pattern=${encodeURIComponent(pattern)}`);
    watch(pattern);
  });
  stop.addEventListener('click', () => {
    if (src) src.close();
    src = null;
    status.textContent = 'Not watching.';
    status.dataset.state = 'stopped';
    stop.disabled = true;
  });
  if (body.dataset.pattern) watch(body.dataset.pattern);

  const pub = document.getElementById('publish-form');
  const result = document.getElementById('publish-result');
  pub?.addEventListener('submit', async (e) => {
    e.preventDefault();
    result.textContent = 'Publishing…';
    try {
      const d = await post('/bus/publish', new URLSearchParams(new FormData(pub)));
      const r = d.result;
      result.replaceChildren();
      const p = el('p', '', `Published: ${r.success ? 'routed' : 'NOT ROUTED (no subscriber matched)'}${r.stopPropagation ? ', propagation stopped' : ''}. Trace: `);
      p.append(traceNode(r.trace_id, d.trace_url));
      const table = el('table');
      table.append(el('caption', '', 'Acks'));
      const head = el('tr');
      head.append(el('th', '', 'Subscriber'), el('th', '', 'Processed'), el('th', '', 'Message'));
      table.append(head);
      for (const a of r.acks ?? []) {
        const tr = el('tr');
        tr.append(el('td', '', a.client_id), el('td', '', a.processed ? 'YES' : 'NO'), el('td', '', a.message ?? ''));
        table.append(tr);
      }
      result.append(p, table);
    } catch (err) {
      result.replaceChildren();
      banner(result, `Not published: ${err.message}`);
    }
  });
}

// ---- an instance's logs ----
function logs() {
  const list = document.getElementById('logs');
  if (!list) return;
  const state = document.getElementById('logs-state');
  const bannerBox = document.getElementById('logs-banner');
  const src = new EventSource(list.dataset.live);
  // The server resumes after Last-Event-ID when the EventSource
  // reconnects; the ids shown are kept too, so that no line is shown twice.
  const shown = new Set();
  src.addEventListener('line', (e) => {
    if (e.lastEventId) {
      if (shown.has(e.lastEventId)) return;
      shown.add(e.lastEventId);
    }
    const l = JSON.parse(e.data);
    const li = el('li', l.stream);
    li.append(el('span', 'kind', l.stream), el('span', 'time', `${l.time} `), el('span', 'text', l.text));
    list.append(li);
    list.scrollTop = list.scrollHeight;
  });
  src.addEventListener('status', (e) => {
    const s = JSON.parse(e.data);
    document.getElementById('status').textContent = s.status;
    document.getElementById('progress').textContent = String(s.progress);
    document.getElementById('finished').textContent = s.finished;
    // A turn waiting for a person's decision on an escalated permission
    // request: the banner links to the review (an http(s) URL only).
    const approval = document.getElementById('approval-banner');
    if (approval) {
      const waiting = s.status === 'awaiting_approval';
      approval.hidden = !waiting;
      if (waiting && /^https?:\/\//.test(s.review_url ?? '')) document.getElementById('approval-review').href = s.review_url;
    }
  });
  src.addEventListener('end', (e) => {
    state.textContent = `(${JSON.parse(e.data).message})`;
    list.dataset.state = 'ended';
    src.close();
  });
  src.addEventListener('failure', (e) => {
    banner(bannerBox, JSON.parse(e.data).banner);
    state.textContent = '(not following)';
    src.close();
  });
}

liveAgents();
chat();
bus();
logs();
