/* The thread: message elements built from stored messages or live frames, the versions of an
 * answer, Copy, and the throttled rendering of the answer being streamed (state.generation).
 * Text from the server only ever reaches the page through textContent or
 * GatewayMarkdown.render, whose HTML is sanitized to an allow-list (markdown.js). */

import { api, config, markdown, showBanner, state, ui, updateControls } from "./page.js";

const ROADS = { kb: "KB", local: "local", external: "external" };

// --- Messages -----------------------------------------------------------------------

export function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = text;
  return node;
}

export function nearBottom() {
  return ui.thread.scrollHeight - ui.thread.scrollTop - ui.thread.clientHeight < 80;
}

export function scrollToBottom() {
  ui.thread.scrollTop = ui.thread.scrollHeight;
}

function actionButton(action, text, label) {
  const button = element("button", "small-button " + action, text);
  button.type = "button";
  button.dataset.action = action;
  button.title = label;
  button.setAttribute("aria-label", label);
  return button;
}

export function userElement(text, id) {
  const li = element("li", "message user");
  if (id) li.dataset.messageId = id;
  // Its visible label comes from the style sheet: the question's element holds its text alone.
  const edit = actionButton("edit", "", "Edit your question and send it again");
  edit.hidden = true; // on the last question only (markLastExchange)
  li.append(element("div", "bubble", text), edit);
  return li;
}

export function assistantElement() {
  const li = element("li", "message assistant");
  li.dataset.status = "streaming";
  li.setAttribute("aria-busy", "true");
  const meta = element("div", "meta");
  const bubble = element("div", "bubble markdown");
  const citations = element("div", "citations");
  citations.hidden = true;
  const note = element("p", "status-note");
  note.hidden = true;
  li.append(meta, bubble, citations, note, feedbackElement(), actionsElement());
  return li;
}

// The versions of an answer (‹ 2/3 ›), Copy, and Regenerate on the last answer.
function actionsElement() {
  const bar = element("div", "answer-actions");
  const versions = element("span", "versions");
  versions.hidden = true;
  versions.append(
    actionButton("version-prev", "‹", "Earlier version"),
    element("span", "version-label"),
    actionButton("version-next", "›", "Later version"),
    element("span", "version-state"),
  );
  const copy = actionButton("copy", "Copy", "Copy the answer's Markdown");
  copy.hidden = true;
  const regenerate = actionButton("regenerate", "Regenerate", "Answer the question again");
  regenerate.hidden = true;
  const copied = element("span", "copied");
  copied.setAttribute("role", "status");
  bar.append(versions, copy, regenerate, copied);
  return bar;
}

// Regenerate and Edit belong to the last exchange, once it is stored and over, and not while
// another answer streams or an earlier version is on screen.
export function markLastExchange() {
  const answers = ui.messages.querySelectorAll(":scope > .message.assistant");
  const questions = ui.messages.querySelectorAll(":scope > .message.user");
  const lastAnswer = answers[answers.length - 1];
  const lastQuestion = questions[questions.length - 1];
  const open = !state.generation && !!lastAnswer && lastAnswer.dataset.status !== "streaming" &&
    !lastAnswer.classList.contains("earlier");
  answers.forEach(function (li) {
    part(li, ".regenerate").hidden = !(open && li === lastAnswer && li.dataset.messageId);
  });
  questions.forEach(function (li) {
    part(li, ".edit").hidden = !(open && li === lastQuestion && li.dataset.messageId &&
      !li.querySelector("form"));
  });
}

// --- Versions: a regenerated answer, an edited question and its answer --------------------

// The versions of each answer in a stored thread (oldest first), by the id of the first one;
// each with its question: an edit changed it, a regenerate did not.
export function answerVersions(list) {
  const versions = new Map();
  let question = null;
  list.forEach(function (message) {
    if (message.role === "user") question = message;
    if (message.role !== "assistant") return;
    const first = message.version_of || message.id;
    if (!versions.has(first)) versions.set(first, []);
    versions.get(first).push({ answer: message, question: question });
  });
  return versions;
}

export function setVersions(li, versions) {
  if (!versions || versions.length < 2) return;
  li._versions = versions;
  showVersionNav(li, versions.findIndex(function (version) { return !version.answer.superseded; }));
}

function showVersionNav(li, index) {
  const versions = li._versions;
  const current = index === versions.findIndex(function (version) { return !version.answer.superseded; });
  const nav = part(li, ".versions");
  nav.hidden = false;
  part(nav, ".version-label").textContent = index + 1 + "/" + versions.length;
  part(nav, ".version-state").textContent = current ? "current" : "earlier version";
  part(nav, ".version-prev").disabled = index === 0;
  part(nav, ".version-next").disabled = index === versions.length - 1;
  li.dataset.version = index;
  li.classList.toggle("earlier", !current);
}

// ‹ or ›: the answer's other version in its place, and the question it answered above it.
export function stepVersion(button) {
  const li = button.closest(".message.assistant");
  if (!li || !li._versions) return;
  const index = Number(li.dataset.version) + (button.dataset.action === "version-prev" ? -1 : 1);
  const version = li._versions[index];
  if (!version) return;
  const shown = messageElement(version.answer);
  shown._versions = li._versions;
  showVersionNav(shown, index);
  li.replaceWith(shown);
  const question = shown.previousElementSibling;
  if (question && question.classList.contains("user") && version.question) {
    part(question, ".bubble").textContent = version.question.content;
    question.classList.toggle("earlier", shown.classList.contains("earlier"));
  }
  markLastExchange();
  part(shown, "." + button.dataset.action).focus();
}

// --- Copy: the answer's Markdown, as the model or the KB wrote it --------------------------

export async function copyAnswer(button) {
  const li = button.closest(".message.assistant");
  if (!li) return;
  let copied = true;
  try {
    await navigator.clipboard.writeText(li._text || "");
  } catch {
    copied = copyBySelection(li._text || ""); // no clipboard API (plain HTTP) or no permission
  }
  const note = part(li, ".copied");
  note.textContent = copied ? "Copied" : "Not copied: select the text and press Ctrl+C (⌘C).";
  clearTimeout(li._copiedTimer);
  li._copiedTimer = setTimeout(function () { note.textContent = ""; }, 3000);
}

function copyBySelection(text) {
  const area = element("textarea", "visually-hidden");
  area.value = text;
  area.setAttribute("readonly", "");
  document.body.appendChild(area);
  area.select();
  try {
    return document.execCommand("copy");
  } catch {
    return false;
  } finally {
    area.remove();
  }
}

// --- Verdicts: 👍 / 👎 on a finished answer ------------------------------------------

const VERDICTS = [
  ["up", "👍", "Good answer"],
  ["down", "👎", "Wrong answer"],
];

function feedbackElement() {
  const bar = element("div", "feedback");
  bar.hidden = true;
  VERDICTS.forEach(function ([verdict, symbol, label]) {
    const button = element("button", "verdict", symbol);
    button.type = "button";
    button.dataset.verdict = verdict;
    button.title = label;
    button.setAttribute("aria-label", label);
    button.setAttribute("aria-pressed", "false");
    bar.appendChild(button);
  });
  return bar;
}

// A verdict once the answer is stored and over; `verdict` is the one given before ("" for none).
export function showFeedback(li, verdict) {
  const bar = part(li, ".feedback");
  if (!bar) return;
  bar.hidden = !li.dataset.messageId || li.dataset.status === "streaming" || !li._text;
  setVerdict(li, verdict || "");
}

function setVerdict(li, verdict) {
  li.dataset.verdict = verdict;
  li.querySelectorAll(".feedback .verdict").forEach(function (button) {
    button.setAttribute("aria-pressed", String(button.dataset.verdict === verdict));
  });
}

// A click on 👍 or 👎: gives that verdict, or takes it back when it was the one given.
export async function giveVerdict(button) {
  const li = button.closest(".message.assistant");
  if (!li || !li.dataset.messageId || button.disabled) return;
  const before = li.dataset.verdict || "";
  const verdict = before === button.dataset.verdict ? "" : button.dataset.verdict;
  setVerdict(li, verdict);
  button.disabled = true;
  try {
    const url = config.messagesUrl + encodeURIComponent(li.dataset.messageId) + "/feedback";
    const reply = await api("POST", url, { verdict: verdict });
    setVerdict(li, reply.verdict);
    if (reply.note) showBanner(reply.note);
  } catch (err) {
    setVerdict(li, before);
    showBanner("Your verdict was not saved: " + err.message);
  } finally {
    button.disabled = false;
  }
}

function part(li, selector) { return li.querySelector(selector); }

// `why`: the route frame's reason (a plain one for users, the details for the staff who may read
// the routing rules); a stored message has none, and the road says it in general.
export function setRoute(li, road, target, why) {
  const meta = part(li, ".meta");
  let badge = part(meta, ".badge");
  if (road) {
    if (!badge) {
      badge = element("span", "badge");
      meta.prepend(badge);
    }
    badge.dataset.road = road;
    badge.textContent = ROADS[road] || road;
    if (why) {
      badge.title = why.charAt(0).toUpperCase() + why.slice(1);
    } else if (!badge.title) {
      badge.title = "Answered by the " + (road === "kb" ? "knowledge base" : road + " model");
    }
  }
  if (target) {
    const targetEl = part(meta, ".target") || meta.appendChild(element("span", "target"));
    targetEl.textContent = target;
  }
}

function milliseconds(value) {
  if (value === null || value === undefined || isNaN(value)) return null;
  return value < 1000 ? Math.round(value) + " ms" : (value / 1000).toFixed(value < 10000 ? 2 : 1) + " s";
}

export function setTimings(li, ttft, latency, tokens) {
  const meta = part(li, ".meta");
  const timings = part(meta, ".timings") || meta.appendChild(element("span", "timings"));
  const pieces = [];
  if (milliseconds(ttft)) pieces.push("first token " + milliseconds(ttft));
  if (milliseconds(latency)) pieces.push("total " + milliseconds(latency));
  if (tokens) pieces.push(tokens + " tokens");
  timings.textContent = pieces.join(" · ");
  if (ttft !== null && ttft !== undefined) timings.dataset.ttftMs = ttft;
  if (latency !== null && latency !== undefined) timings.dataset.latencyMs = latency;
}

export function setCitations(li, citations) {
  const box = part(li, ".citations");
  box.textContent = "";
  if (!citations || !citations.length) {
    box.hidden = true;
    return;
  }
  box.appendChild(element("span", "citations-label", "Sources: "));
  const list = element("ul");
  citations.forEach(function (citation) {
    const item = element("li", null, citation.label || "KB#" + citation.entry_id);
    if (citation.entry_id !== undefined) item.dataset.entryId = citation.entry_id;
    list.appendChild(item);
  });
  box.appendChild(list);
  box.hidden = false;
}

function setContent(li, text) {
  li._text = text;
  // Raw HTML in the text is escaped, and the result sanitized to an allow-list (markdown.js).
  part(li, ".bubble").innerHTML = markdown.render(text);
}

const STATUS_NOTES = {
  cancelled: "Stopped.",
  partial: "The answer was cut off",
  failed: "No answer",
};

export function setStatus(li, status, message) {
  li.dataset.status = status;
  if (status === "streaming") {
    li.setAttribute("aria-busy", "true");
  } else {
    li.removeAttribute("aria-busy");
  }
  const note = part(li, ".status-note");
  let text = "";
  if (status === "streaming") {
    text = message || "";
  } else if (STATUS_NOTES[status]) {
    text = STATUS_NOTES[status];
    if (message && status !== "cancelled") text += ": " + message;
    if (message && status === "cancelled" && message !== "Stopped.") text = "Stopped: " + message;
  }
  note.textContent = text;
  note.hidden = !text;
  // A failed or stopped turn with no text: the note says it all.
  part(li, ".bubble").hidden = status !== "streaming" && !li._text;
  part(li, ".copy").hidden = status === "streaming" || !li._text;
}

export function messageElement(message) {
  if (message.role === "user") return userElement(message.content, message.id);
  const li = assistantElement();
  li.dataset.messageId = message.id;
  setRoute(li, message.road, message.target);
  setContent(li, message.content || "");
  if (message.status !== "streaming") {
    setTimings(li, message.ttft_ms, message.latency_ms, message.completion_tokens);
  }
  setCitations(li, message.citations);
  setStatus(li, message.status || "complete", message.status === "streaming"
    ? "Still being written…" : message.error);
  showFeedback(li, message.verdict);
  return li;
}

// --- The answer being streamed ------------------------------------------------------

function renderGeneration() {
  const generation = state.generation;
  if (!generation) return;
  generation.frame = 0;
  const stick = nearBottom();
  const started = performance.now();
  setContent(generation.el, generation.text);
  generation.renderedAt = performance.now();
  generation.renderCost = generation.renderedAt - started;
  if (stick) scrollToBottom();
}

export function scheduleRender() {
  const generation = state.generation;
  if (!generation || generation.frame || generation.timer) return;
  // Each render parses and sanitizes the whole answer again, so it costs more as the answer
  // grows: the next one waits four times the last one's cost, which keeps rendering to about
  // a fifth of the main thread however fast tokens come.
  const wait = (generation.renderedAt || 0) + 4 * (generation.renderCost || 0) - performance.now();
  if (wait > 0) {
    generation.timer = setTimeout(function () {
      generation.timer = 0;
      scheduleRender();
    }, wait);
    return;
  }
  generation.frame = requestAnimationFrame(renderGeneration);
}

export function flushGeneration() {
  const generation = state.generation;
  if (generation.frame) cancelAnimationFrame(generation.frame);
  if (generation.timer) clearTimeout(generation.timer);
  generation.timer = 0;
  renderGeneration();
}

export function endGeneration() {
  state.generation = null;
  updateControls();
  markLastExchange();
}
