// The chat page's script (no build step; served by `pagoda serve` with the page).
//
// - Models: those of GET /v1/models whose `capabilities` include "completion" (embedding
//   models are left out; a server that does not say what a model does has all its models
//   offered), the server's default first.
// - Answers stream from POST /v1/chat/completions and are rendered as Markdown by marked,
//   then sanitised by DOMPurify. Raw HTML in the model's text is shown as text, never
//   parsed; the page's Content-Security-Policy (set by the server) runs no inline script
//   and loads nothing from elsewhere, should anything get past both.
// - Stop (or Esc) aborts the request; the server sees the connection close and stops
//   generating.
// - Temperature and max tokens, when set, go with each request; empty means the model's
//   default.
// - Conversations and settings are kept in localStorage under STORE_KEY.
"use strict";

const STORE_KEY = "pagoda.chat.v1";
const $ = id => document.getElementById(id);
const log = $("log");
const modelSelect = $("model");
const input = $("input");
const stats = $("stats");
const sendButton = $("send");
const stopButton = $("stop");
const list = $("conversations");
const temperatureInput = $("temperature");
const maxTokensInput = $("max-tokens");

// { conversations: [{ id, title, model, updated, messages: [{ role, content, stopped? }] }],
//   current: id or null (a new chat not yet sent), settings: { temperature, max_tokens } }
let state = loadState();
// The AbortController of the request being streamed, or null.
let inFlight = null;

function loadState() {
  try {
    const s = JSON.parse(localStorage.getItem(STORE_KEY));
    if (s && Array.isArray(s.conversations)) {
      return { conversations: s.conversations, current: s.current || null, settings: s.settings || {} };
    }
  } catch (e) {
    // An unreadable entry (another version, hand-edited) starts afresh.
  }
  return { conversations: [], current: null, settings: {} };
}

function saveState() {
  try {
    localStorage.setItem(STORE_KEY, JSON.stringify(state));
  } catch (e) {
    stats.textContent = "cannot keep the conversation in this browser: " + e.message;
  }
}

function currentConversation() {
  return state.conversations.find(c => c.id === state.current) || null;
}

// ---- Markdown ----

const escapeHtml = s => s.replace(/[&<>"']/g, c => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

// Raw HTML in the model's text is shown as the text it is (marked passes it through by default).
marked.use({ gfm: true, renderer: { html(token) { return escapeHtml(typeof token === "string" ? token : token.text); } } });
DOMPurify.addHook("afterSanitizeAttributes", node => {
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});
// No forms or controls a model could dress up as the page's own; no styles.
const PURIFY = { FORBID_TAGS: ["style", "form", "textarea", "button", "select"], FORBID_ATTR: ["style"] };

function renderMarkdown(el, text, done) {
  el.innerHTML = DOMPurify.sanitize(marked.parse(text), PURIFY);
  if (done) {
    for (const pre of el.querySelectorAll("pre")) addCopyButton(pre);
  }
}

function addCopyButton(pre) {
  if (!navigator.clipboard) return;  // only in secure contexts (localhost, https)
  const b = document.createElement("button");
  b.type = "button";
  b.className = "copy";
  b.textContent = "copy";
  b.addEventListener("click", () => {
    const code = pre.querySelector("code") || pre;
    navigator.clipboard.writeText(code.textContent).then(() => { b.textContent = "copied"; });
  });
  pre.appendChild(b);
}

// ---- The conversation on screen ----

function addMessage(role, text, stopped) {
  const div = document.createElement("div");
  div.className = "msg " + role + (stopped ? " stopped" : "");
  if (role === "assistant") renderMarkdown(div, text, true);
  else div.textContent = text;
  log.appendChild(div);
  log.scrollTop = log.scrollHeight;
  return div;
}

function showConversation() {
  log.textContent = "";
  stats.textContent = "";
  const conv = currentConversation();
  if (conv) {
    for (const m of conv.messages) addMessage(m.role, m.content, m.stopped);
    selectModel(conv.model);
  }
  showList();
}

function showList() {
  list.textContent = "";
  const sorted = [...state.conversations].sort((a, b) => b.updated - a.updated);
  for (const conv of sorted) {
    const li = document.createElement("li");
    li.dataset.id = conv.id;
    if (conv.id === state.current) li.className = "current";
    const open = document.createElement("button");
    open.type = "button";
    open.className = "open";
    open.textContent = open.title = conv.title;
    open.addEventListener("click", () => { stop(); state.current = conv.id; saveState(); showConversation(); });
    const del = document.createElement("button");
    del.type = "button";
    del.className = "delete";
    del.textContent = "×";
    del.title = "delete this conversation";
    del.addEventListener("click", () => deleteConversation(conv.id));
    li.append(open, del);
    list.appendChild(li);
  }
}

function newChat() {
  stop();
  state.current = null;
  saveState();
  showConversation();
  input.focus();
}

function deleteConversation(id) {
  if (id === state.current) stop();
  state.conversations = state.conversations.filter(c => c.id !== id);
  if (state.current === id) state.current = null;
  saveState();
  showConversation();
}

// ---- Models and settings ----

function selectModel(name) {
  if (name && [...modelSelect.options].some(o => o.value === name)) modelSelect.value = name;
}

async function loadModels() {
  try {
    const r = await fetch("/v1/models");
    const body = await r.json();
    if (!r.ok) throw new Error((body.error && body.error.message) || r.statusText);
    const chat = (body.data || []).filter(m => !Array.isArray(m.capabilities) || m.capabilities.includes("completion"));
    for (const m of chat) {
      const o = document.createElement("option");
      o.value = o.textContent = m.id;
      modelSelect.appendChild(o);
    }
    const conv = currentConversation();
    selectModel(conv && conv.model);
  } catch (e) {
    addMessage("error", "cannot list models: " + e.message);
  }
}

function showSettings() {
  temperatureInput.value = state.settings.temperature ?? "";
  maxTokensInput.value = state.settings.max_tokens ?? "";
}

function keepSettings() {
  state.settings = { temperature: temperatureInput.value.trim(), max_tokens: maxTokensInput.value.trim() };
  saveState();
}

// The settings the user set, as request fields.
function requestSettings() {
  const fields = {};
  const t = temperatureInput.value.trim();
  if (t !== "") fields.temperature = Number(t);
  const m = maxTokensInput.value.trim();
  if (m !== "") fields.max_tokens = Number(m);
  return fields;
}

// ---- Sending and streaming ----

// Reads an SSE body and calls onData with each event's data.
async function readEvents(response, onData) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event.split("\n").filter(l => l.startsWith("data:"))
        .map(l => l.slice(5).replace(/^ /, "")).join("\n");
      if (data) onData(data);
    }
  }
}

function busy(on) {
  sendButton.disabled = on;
  stopButton.hidden = !on;
  sendButton.hidden = on;
}

function stop() {
  if (inFlight) inFlight.abort();
}

async function send(text) {
  let conv = currentConversation();
  if (!conv) {
    conv = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 8), title: text.slice(0, 60),
             model: modelSelect.value, updated: Date.now(), messages: [] };
    state.conversations.push(conv);
    state.current = conv.id;
  }
  conv.model = modelSelect.value;
  conv.messages.push({ role: "user", content: text });
  conv.updated = Date.now();
  saveState();
  showList();
  const asked = addMessage("user", text);
  const out = addMessage("assistant", "");
  const controller = new AbortController();
  inFlight = controller;
  busy(true);
  const started = performance.now();
  let first = null, tokens = 0, answer = "", redraw = null;
  const draw = () => {
    redraw = null;
    renderMarkdown(out, answer, false);
    log.scrollTop = log.scrollHeight;
  };
  const messages = conv.messages.map(m => ({ role: m.role, content: m.content }));
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ model: conv.model, messages, stream: true, stream_options: { include_usage: true },
                             ...requestSettings() }),
      signal: controller.signal,
    });
    if (!r.ok) {
      const body = await r.json().catch(() => ({}));
      throw new Error((body.error && body.error.message) || r.statusText);
    }
    await readEvents(r, data => {
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) tokens = chunk.usage.completion_tokens;
      for (const c of chunk.choices || []) {
        const piece = c.delta && c.delta.content;
        if (piece) {
          if (first === null) first = performance.now();
          if (!chunk.usage) tokens += 1;
          answer += piece;
          if (redraw === null) redraw = setTimeout(draw, 40);  // at most ~25 renders a second
        }
      }
      if (first !== null) {
        const secs = Math.max((performance.now() - first) / 1000, 1e-3);
        stats.textContent = `${tokens} tokens, ${(tokens / secs).toFixed(1)} tokens/s, first token ${((first - started) / 1000).toFixed(2)} s`;
      }
    });
    conv.messages.push({ role: "assistant", content: answer });
    renderMarkdown(out, answer, true);
  } catch (e) {
    if (e.name === "AbortError" && answer) {
      // Stopped: the partial answer stays in the conversation, marked.
      conv.messages.push({ role: "assistant", content: answer, stopped: true });
      renderMarkdown(out, answer, true);
      out.classList.add("stopped");
    } else {
      // Failed, or stopped before any text: the question goes back to the input box.
      conv.messages.pop();
      if (!input.value) input.value = text;
      if (e.name === "AbortError") {
        asked.remove();
        out.remove();
      } else {
        out.className = "msg error";
        out.textContent = "error: " + e.message;
      }
    }
  } finally {
    clearTimeout(redraw);
    if (conv.messages.length === 0) {
      state.conversations = state.conversations.filter(c => c !== conv);
      if (state.current === conv.id) state.current = null;
    }
    conv.updated = Date.now();
    saveState();
    showList();
    if (inFlight === controller) {
      inFlight = null;
      busy(false);
    }
  }
}

$("form").addEventListener("submit", e => {
  e.preventDefault();
  const text = input.value.trim();
  if (!text || inFlight) return;
  input.value = "";
  send(text);
});
input.addEventListener("keydown", e => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("form").requestSubmit();
  }
});
document.addEventListener("keydown", e => {
  if (e.key === "Escape") stop();
});
stopButton.addEventListener("click", stop);
$("new-chat").addEventListener("click", newChat);
temperatureInput.addEventListener("change", keepSettings);
maxTokensInput.addEventListener("change", keepSettings);
// Another tab changed the conversations: show its state.
window.addEventListener("storage", e => {
  if (e.key === STORE_KEY && !inFlight) {
    state = loadState();
    showSettings();
    showConversation();
  }
});

showSettings();
showConversation();
loadModels();
