// The chat page: plain JS over the server's own OpenAI API, so the page exercises exactly
// what any client sees. No framework and no build step: the server embeds this file as is,
// with three vendored libraries for answers in markdown (marked renders, DOMPurify
// sanitizes, highlight.js colours code). The conversation, the sampling settings and the API
// key are kept in the browser (localStorage), so a reload goes on where it was.
"use strict";

const KEY_STORAGE = "smelt.apiKey";
const CONVERSATION_STORAGE = "smelt.conversation";
const SETTINGS_STORAGE = "smelt.settings";

const el = (id) => document.getElementById(id);
const modelSelect = el("model");
const keyInput = el("api-key");
const maxTokensInput = el("max-tokens");
const temperatureInput = el("temperature");
const systemBox = el("system-prompt");
/** Sampling settings: input id -> request field; empty means the server's default. */
const SAMPLING = {
  "top-p": "top_p",
  "top-k": "top_k",
  "min-p": "min_p",
  "repetition-penalty": "repetition_penalty",
  seed: "seed",
};
/** Every setting kept across reloads (the model too). */
const SETTINGS = ["model", "max-tokens", "temperature", "system-prompt", ...Object.keys(SAMPLING)];
const conversationList = el("conversation");
const promptBox = el("prompt");
const sendButton = el("send");
const stopButton = el("stop");
const statusLine = el("status");
const errorBox = el("error");

/** The conversation as OpenAI messages; only finished turns are kept. */
let messages = [];
/** Aborting this stops the running request; the server frees the sequence when it sees the
 * connection close. */
let controller = null;
/** Bumped by "New chat", so a request still ending does not write into the new conversation. */
let conversationId = 0;

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = keyInput.value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function showError(text) {
  errorBox.textContent = text;
  errorBox.hidden = false;
}

function clearError() {
  errorBox.textContent = "";
  errorBox.hidden = true;
}

/** Turns a non-2xx response into one readable line, from OpenAI's error shape when it has one. */
async function errorText(response) {
  let detail = response.statusText;
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) detail = body.error.message;
  } catch (_) {
    // Not JSON: keep the status text.
  }
  return `HTTP ${response.status}: ${detail}`;
}

/** Shows `text` (markdown) in `target` as sanitized HTML: whatever a model writes, no script
 * runs and no handler is kept. Without the libraries (blocked), plain text. */
function renderMarkdown(target, text) {
  target.dataset.raw = text;
  if (window.marked && window.DOMPurify) {
    target.innerHTML = DOMPurify.sanitize(marked.parse(text, { breaks: true, gfm: true }));
    highlightCode(target);
  } else {
    target.textContent = text;
  }
}

/** Colours the code blocks under `target` (highlight.js works on their text, which
 * DOMPurify has left as text, and writes only its own spans): by the fence's language, or
 * guessed when there is none and the block is not too long to guess on every token. */
function highlightCode(target) {
  if (!window.hljs) return;
  for (const code of target.querySelectorAll("pre code")) {
    const tagged = [...code.classList].some((c) => c.startsWith("language-"));
    if (tagged || code.textContent.length < 4000) hljs.highlightElement(code);
  }
}
if (window.hljs) hljs.configure({ ignoreUnescapedHTML: true });

function saveConversation() {
  if (messages.length) localStorage.setItem(CONVERSATION_STORAGE, JSON.stringify(messages));
  else localStorage.removeItem(CONVERSATION_STORAGE);
}

function saveSettings() {
  const values = {};
  for (const id of SETTINGS) values[id] = el(id).value;
  localStorage.setItem(SETTINGS_STORAGE, JSON.stringify(values));
}

/** The kept settings and conversation, shown again after a reload. */
function restore() {
  try {
    const values = JSON.parse(localStorage.getItem(SETTINGS_STORAGE) || "{}");
    for (const id of SETTINGS) {
      if (id !== "model" && typeof values[id] === "string") el(id).value = values[id];
    }
    const kept = JSON.parse(localStorage.getItem(CONVERSATION_STORAGE) || "[]");
    if (Array.isArray(kept)) {
      messages = kept.filter((m) => m && typeof m.role === "string" && typeof m.content === "string");
      for (const m of messages) {
        const body = addTurn(m.role, m.content);
        if (m.role === "assistant") renderMarkdown(body, m.content);
      }
    }
  } catch (_) {
    // Unreadable (an older page's format): start afresh.
    localStorage.removeItem(CONVERSATION_STORAGE);
  }
}

/** The model kept from the last visit, when the server still serves it. */
function keptModel() {
  try {
    return JSON.parse(localStorage.getItem(SETTINGS_STORAGE) || "{}").model || "";
  } catch (_) {
    return "";
  }
}

function addTurn(role, text) {
  const item = document.createElement("li");
  item.className = "turn " + role;
  const who = document.createElement("div");
  who.className = "role";
  who.textContent = role;
  const body = document.createElement("div");
  body.className = "content";
  body.textContent = text;
  item.append(who, body);
  conversationList.append(item);
  item.scrollIntoView({ block: "end" });
  return body;
}

async function loadModels() {
  clearError();
  try {
    const response = await fetch("/v1/models", { headers: headers() });
    if (!response.ok) throw new Error(await errorText(response));
    const list = await response.json();
    const previous = modelSelect.value || keptModel();
    modelSelect.replaceChildren();
    for (const model of list.data || []) {
      const option = document.createElement("option");
      option.value = model.id;
      option.textContent = model.id;
      modelSelect.append(option);
    }
    if (previous && [...modelSelect.options].some((o) => o.value === previous)) {
      modelSelect.value = previous;
    }
    if (modelSelect.options.length === 0) showError("The server serves no model.");
  } catch (err) {
    showError("Could not list models: " + err.message);
  }
}

function setBusy(busy) {
  sendButton.disabled = busy;
  stopButton.disabled = !busy;
  promptBox.disabled = busy;
}

/**
 * Reads an SSE body and calls `onEvent` with each `data:` payload. Events are separated by a
 * blank line; a chunk from the network may end anywhere, so the unfinished tail is kept.
 */
async function readEvents(body, onEvent) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    buffer = buffer.replace(/\r\n/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""))
        .join("\n");
      if (data && onEvent(data) === false) return;
    }
  }
}

/** The sampling fields set on the page. */
function sampling() {
  const fields = {};
  for (const [id, field] of Object.entries(SAMPLING)) {
    const value = el(id).value;
    if (value !== "") fields[field] = Number(value);
  }
  return fields;
}

async function send(text) {
  const model = modelSelect.value;
  if (!model) {
    showError("Pick a model first.");
    return;
  }
  clearError();
  // The system prompt is sent with every request (it can change between turns) and is not
  // part of the kept conversation.
  const turns = [...messages, { role: "user", content: text }];
  const system = systemBox.value.trim();
  const request = system ? [{ role: "system", content: system }, ...turns] : turns;
  addTurn("user", text);
  const output = addTurn("assistant", "");
  output.classList.add("streaming");
  setBusy(true);
  statusLine.textContent = "generating…";
  controller = new AbortController();
  const conversation = conversationId;
  let reply = "";
  let finish = null;
  let usage = null;
  let firstAt = null;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify({
        model,
        messages: request,
        stream: true,
        stream_options: { include_usage: true },
        // Empty: the server's default (up to the context length).
        ...(maxTokensInput.value ? { max_tokens: Number(maxTokensInput.value) } : {}),
        ...(temperatureInput.value !== "" ? { temperature: Number(temperatureInput.value) } : {}),
        ...sampling(),
      }),
      signal: controller.signal,
    });
    if (!response.ok) throw new Error(await errorText(response));
    await readEvents(response.body, (data) => {
      if (data === "[DONE]") return false;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message || "stream error");
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        if (choice.delta && choice.delta.content) {
          if (firstAt === null) firstAt = performance.now();
          reply += choice.delta.content;
          renderMarkdown(output, reply);
          output.scrollIntoView({ block: "end" });
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
      return true;
    });
    if (conversation === conversationId) {
      messages = [...turns, { role: "assistant", content: reply }];
      saveConversation();
    }
    const tokens = usage ? `, ${usage.completion_tokens} tokens` : "";
    // Decode speed: the tokens after the first over the time since the first arrived.
    const secs = firstAt === null ? 0 : (performance.now() - firstAt) / 1000;
    const rate = usage && usage.completion_tokens > 1 && secs > 0
      ? `, ${((usage.completion_tokens - 1) / secs).toFixed(1)} tok/s` : "";
    statusLine.textContent = `done (${finish || "end"}${tokens}${rate})`;
  } catch (err) {
    if (err.name === "AbortError") {
      // Keep what arrived: the user may continue from a stopped answer.
      if (conversation === conversationId) {
        messages = [...turns, { role: "assistant", content: reply }];
        saveConversation();
      }
      statusLine.textContent = "stopped";
      output.classList.add("stopped");
    } else {
      output.closest("li").remove();
      showError(err.message);
      statusLine.textContent = "";
    }
  } finally {
    output.classList.remove("streaming");
    controller = null;
    setBusy(false);
    promptBox.focus();
  }
}

el("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = promptBox.value.trim();
  if (!text || controller) return;
  promptBox.value = "";
  send(text);
});

promptBox.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    el("composer").requestSubmit();
  }
});

stopButton.addEventListener("click", () => {
  if (controller) controller.abort();
});

el("clear").addEventListener("click", () => {
  if (controller) controller.abort();
  conversationId += 1;
  messages = [];
  saveConversation();
  conversationList.replaceChildren();
  statusLine.textContent = "";
  clearError();
});

keyInput.value = localStorage.getItem(KEY_STORAGE) || "";
keyInput.addEventListener("change", () => {
  const key = keyInput.value.trim();
  if (key) localStorage.setItem(KEY_STORAGE, key);
  else localStorage.removeItem(KEY_STORAGE);
  loadModels();
});
for (const id of SETTINGS) el(id).addEventListener("change", saveSettings);

restore();
loadModels();
