// The llmgw chat page: pick a model, chat with streaming, see which model and replica answered.
// Plain ES module, no build step. Model output is only ever put into the page as text.

const KEY_STORAGE = "llmgw.apiKey";

const $ = (id) => document.getElementById(id);
const select = $("model");
const simMark = $("sim-mark");
const messagesEl = $("messages");
const statusEl = $("status");
const keyPanel = $("key-panel");

let models = []; // [{id, simulated, serving}]
let history = []; // [{role, content}]
let busy = false;

function apiKey() {
  return sessionStorage.getItem(KEY_STORAGE) || ""; // the tab's only: never on disk, gone with it
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = apiKey();
  if (key) h["Authorization"] = `Bearer ${key}`;
  return h;
}

function setStatus(text) {
  statusEl.textContent = text;
}

// Real models first, simulated ones last, marked (the order /v1/models gives).
export function orderModels(data) {
  const chat = data.filter((m) => {
    const roles = (m.llmgw && m.llmgw.roles) || ["chat"];
    return roles.includes("chat");
  });
  const simulated = (m) => m.owned_by === "llmgw-sim" || (m.llmgw && m.llmgw.simulated);
  const real = chat.filter((m) => !simulated(m));
  const sims = chat.filter((m) => simulated(m));
  return [...real, ...sims].map((m) => ({
    id: m.id,
    simulated: Boolean(simulated(m)),
    state: (m.llmgw && m.llmgw.state) || "",
    serving: Boolean(m.llmgw && m.llmgw.state === "serving"),
    // A judge that cannot answer: every message would get 503 guard_unavailable.
    guardDown: Boolean(m.llmgw && m.llmgw.guard && m.llmgw.guard.available === false),
  }));
}

// The model a first message should go to: one that answers. Never one whose guard is
// down (its messages are refused), then one that serves now before one loaded on the
// first request (startable) or whose replica is starting (loading) before one that
// cannot answer, and a real one before a
// simulated one. Ties keep the list's order.
export function preselected(ordered) {
  const rank = (m) => [m.guardDown ? 1 : 0, m.serving ? 0 : ["startable", "loading"].includes(m.state) ? 1 : 2, m.simulated ? 1 : 0];
  let best = null;
  for (const m of ordered) {
    if (best === null || compareRanks(rank(m), rank(best)) < 0) best = m;
  }
  return best ? best.id : "";
}

function compareRanks(a, b) {
  for (let i = 0; i < a.length; i++) {
    if (a[i] !== b[i]) return a[i] - b[i];
  }
  return 0;
}

// While the preselected model does not serve yet (llmgw dev just started), the list is
// read again this often, until it serves or the user picks a model or sends a message.
const MODELS_REFRESH_MS = 2000;
let userChose = false;

function optionText(model) {
  if (model.guardDown) return `${model.id} (guard unavailable)`;
  return model.simulated ? `${model.id} (simulated)` : model.id;
}

async function loadModels() {
  if (!models.length) setStatus("Loading models…");
  const response = await fetch("/v1/models", { headers: headers() });
  if (response.status === 401) {
    keyPanel.hidden = false;
    setStatus("Enter an API key to list the models.");
    return;
  }
  if (!response.ok) {
    setStatus(`Could not list models: ${await errorText(response)}`);
    return;
  }
  keyPanel.hidden = true;
  const body = await response.json();
  models = orderModels(body.data || []);
  const chosen = select.value;
  select.replaceChildren();
  for (const model of models) {
    const option = document.createElement("option");
    option.value = model.id;
    option.textContent = optionText(model);
    if (model.simulated) option.dataset.simulated = "true";
    if (model.guardDown) option.dataset.guardDown = "true";
    option.dataset.state = model.state;
    select.append(option);
  }
  if (models.length) {
    select.value = userChose && models.some((m) => m.id === chosen) ? chosen : preselected(models);
  }
  updateSimMark();
  setStatus(models.length ? "" : "No chat models are available to this key.");
  const current = models.find((m) => m.id === select.value);
  if (current && !current.serving && !userChose) {
    setStatus(`${current.id} does not serve yet (${current.state}); the list is read again every few seconds…`);
    setTimeout(refreshModels, MODELS_REFRESH_MS);
  }
}

function refreshModels() {
  if (!userChose) loadModels();
}

function updateSimMark() {
  const model = models.find((m) => m.id === select.value);
  simMark.hidden = !(model && model.simulated);
}

async function errorText(response) {
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) return body.error.message;
  } catch (_) {
    // not JSON
  }
  return `HTTP ${response.status}`;
}

function addMessage(role, text) {
  const el = document.createElement("div");
  el.className = `message ${role}`;
  const content = document.createElement("span");
  content.className = "content";
  content.textContent = text;
  el.append(content);
  messagesEl.append(el);
  el.scrollIntoView({ block: "end" });
  return el;
}

function setMeta(el, model, replica) {
  let meta = el.querySelector(".meta");
  if (!meta) {
    meta = document.createElement("span");
    meta.className = "meta";
    el.append(meta);
  }
  const simulated = models.find((m) => m.id === model)?.simulated || el.dataset.simulated === "true";
  meta.textContent = `answered by ${model || "?"}` + (replica ? ` on replica ${replica}` : "") +
    (simulated ? " (simulated output)" : "");
  el.dataset.model = model || "";
  el.dataset.replica = replica || "";
}

function fail(el, message) {
  el.classList.add("error");
  const content = el.querySelector(".content");
  content.textContent = (content.textContent ? content.textContent + "\n\n" : "") + message;
}

// Parses one SSE event block; returns false when the stream is done.
function handleEvent(block, state) {
  for (const line of block.split("\n")) {
    if (line.startsWith(":")) {
      const comment = line.slice(1).trim();
      if (comment === "loading model") setStatus("Loading the model… (the first answer can take a while)");
      const who = /^llmgw model=(\S+) replica=(\S+)/.exec(comment);
      if (who) {
        state.model = who[1];
        state.replica = who[2];
      }
      continue;
    }
    if (!line.startsWith("data:")) continue;
    const data = line.slice(5).trim();
    if (data === "[DONE]") return false;
    let chunk;
    try {
      chunk = JSON.parse(data);
    } catch (_) {
      continue;
    }
    if (chunk.error) {
      state.error = chunk.error.message || "The stream failed.";
      return false;
    }
    if (chunk.model && !state.model) state.model = chunk.model;
    const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
    if (delta && typeof delta.content === "string") state.text += delta.content;
  }
  return true;
}

async function send(text) {
  busy = true;
  userChose = true; // the conversation stays with the model it started with
  $("send").disabled = true;
  history.push({ role: "user", content: text });
  addMessage("user", text);
  const el = addMessage("assistant", "");
  const content = el.querySelector(".content");
  const model = select.value;
  el.dataset.simulated = String(Boolean(models.find((m) => m.id === model)?.simulated));
  setStatus("Waiting for the model…");
  const state = { text: "", model: "", replica: "", error: "" };
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify({ model, messages: history, stream: true }),
    });
    if (!response.ok) {
      if (response.status === 401) keyPanel.hidden = false;
      fail(el, await errorText(response));
      history.pop();
      return;
    }
    state.model = response.headers.get("x-llmgw-model") || "";
    state.replica = response.headers.get("x-llmgw-replica") || "";
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let going = true;
    while (going) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while (going && (end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        going = handleEvent(block, state);
        content.textContent = state.text;
        if (state.text) setStatus("");
      }
    }
    setMeta(el, state.model, state.replica);
    if (state.error) {
      fail(el, state.error);
    } else {
      history.push({ role: "assistant", content: state.text });
    }
  } catch (error) {
    fail(el, `The request failed: ${error}`);
    history.pop();
  } finally {
    // Every way out (an answer, an HTTP error, a failed fetch) ends the wait: the
    // message itself says what happened.
    setStatus("");
    busy = false;
    $("send").disabled = false;
  }
}

function start() {
  select.addEventListener("change", () => {
    userChose = true;
    updateSimMark();
  });
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const prompt = $("prompt");
    const text = prompt.value.trim();
    if (!text || busy || !select.value) return;
    prompt.value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY_STORAGE, $("key").value.trim());
    $("key").value = "";
    loadModels();
  });
  $("new-chat").addEventListener("click", () => {
    history = [];
    messagesEl.replaceChildren();
    setStatus("");
  });
  loadModels();
}

start();
