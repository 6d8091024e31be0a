/* The sidebar's session list (load, rename, delete) and opening a session: the URL,
 * the thread loaded from the database, and polling while an answer is still being written. */

import { api, app, config, hideBanner, hooks, sessionUrl, showBanner, state, ui } from "./page.js";
import {
  answerVersions, element, markLastExchange, messageElement, nearBottom, scrollToBottom, setVersions,
} from "./thread.js";

const POLL_EVERY_MS = 1500;
const POLL_TRIES = 40;

// --- Session list -------------------------------------------------------------------

function sessionTitle(session) {
  return (session && session.title) || "Untitled chat";
}

function sessionElement(session) {
  const li = element("li", "session");
  li.dataset.sessionId = session.id;
  fillSessionElement(li, session);
  return li;
}

function fillSessionElement(li, session) {
  li.textContent = "";
  const open = element("button", "session-open", sessionTitle(session));
  open.type = "button";
  open.title = sessionTitle(session);
  open.dataset.action = "open";
  const actions = element("span", "session-actions");
  const rename = element("button", null, "✎");
  rename.type = "button";
  rename.dataset.action = "rename";
  rename.setAttribute("aria-label", "Rename chat: " + sessionTitle(session));
  rename.title = "Rename";
  const remove = element("button", null, "✕");
  remove.type = "button";
  remove.dataset.action = "delete";
  remove.setAttribute("aria-label", "Delete chat: " + sessionTitle(session));
  remove.title = "Delete";
  actions.append(rename, remove);
  li.append(open, actions);
  markCurrent(li);
}

function markCurrent(li) {
  if (String(li.dataset.sessionId) === String(state.sessionId)) {
    li.setAttribute("aria-current", "true");
  } else {
    li.removeAttribute("aria-current");
  }
}

function sessionItem(id) {
  return ui.sessions.querySelector('.session[data-session-id="' + String(Number(id)) + '"]');
}

export function refreshCurrent() {
  Array.prototype.forEach.call(ui.sessions.children, markCurrent);
  const session = state.sessions.get(String(state.sessionId));
  ui.title.textContent = state.sessionId === null ? "New chat" : sessionTitle(session);
  document.title = (state.sessionId === null ? "New chat" : sessionTitle(session)) + " · Answering gateway";
}

function updateSessionsEmpty() {
  ui.sessionsEmpty.hidden = ui.sessions.children.length > 0;
}

export function upsertSession(session, toTop) {
  const key = String(session.id);
  const known = state.sessions.get(key) || {};
  const merged = Object.assign({}, known, session);
  state.sessions.set(key, merged);
  let li = sessionItem(session.id);
  if (li && li.querySelector("form")) {
    // Being renamed: leave the form alone.
  } else if (li) {
    fillSessionElement(li, merged);
  } else {
    li = sessionElement(merged);
    ui.sessions.appendChild(li);
  }
  if (toTop && ui.sessions.firstChild !== li) ui.sessions.prepend(li);
  updateSessionsEmpty();
  refreshCurrent();
}

export async function loadSessions(url) {
  try {
    const page = await api("GET", url || config.sessionsUrl);
    (page.results || []).forEach(function (session) { upsertSession(session, false); });
    state.sessionsNext = page.next || null;
    ui.sessionsMore.hidden = !state.sessionsNext;
    updateSessionsEmpty();
  } catch (err) {
    showBanner("The chat list could not be loaded: " + err.message);
  }
}

export function startRename(li) {
  const id = li.dataset.sessionId;
  const session = state.sessions.get(String(id));
  li.textContent = "";
  const form = element("form", "session-rename");
  const label = element("label", "visually-hidden", "New title");
  const input = element("input");
  input.type = "text";
  input.maxLength = 200;
  input.value = session ? session.title || "" : "";
  input.id = "rename-" + id;
  label.htmlFor = input.id;
  const save = element("button", "small-button", "Save");
  save.type = "submit";
  const cancel = element("button", "small-button", "Cancel");
  cancel.type = "button";
  form.append(label, input, save, cancel);
  li.appendChild(form);
  input.focus();
  input.select();

  function restore() { fillSessionElement(li, state.sessions.get(String(id)) || { id: id }); }
  cancel.addEventListener("click", restore);
  input.addEventListener("keydown", function (event) {
    if (event.key === "Escape") {
      event.preventDefault();
      restore();
    }
  });
  form.addEventListener("submit", async function (event) {
    event.preventDefault();
    const title = input.value.trim();
    save.disabled = true;
    try {
      const updated = await api("PATCH", sessionUrl(id), { title: title });
      state.sessions.set(String(id), Object.assign({}, session, updated || { title: title }));
      restore();
      refreshCurrent();
      hideBanner();
    } catch (err) {
      save.disabled = false;
      showBanner("The chat could not be renamed: " + err.message);
    }
  });
}

export async function deleteSession(li, button) {
  // Two clicks, no dialog: the first arms the button for a few seconds.
  if (!button.classList.contains("armed")) {
    const label = button.getAttribute("aria-label");
    button.classList.add("armed");
    button.textContent = "Delete?";
    button.setAttribute("aria-label", "Press again to delete this chat");
    button._disarm = setTimeout(function () {
      button.classList.remove("armed");
      button.textContent = "✕";
      button.setAttribute("aria-label", label);
    }, 4000);
    return;
  }
  clearTimeout(button._disarm);
  button.disabled = true;
  const id = li.dataset.sessionId;
  try {
    await api("DELETE", sessionUrl(id));
  } catch (err) {
    if (err.status !== 404) {
      button.disabled = false;
      showBanner("The chat could not be deleted: " + err.message);
      return;
    }
  }
  state.sessions.delete(String(id));
  li.remove();
  updateSessionsEmpty();
  if (String(state.sessionId) === String(id)) newChat(true);
}

// --- The sidebar at phone width -----------------------------------------------------

export function openSidebar() {
  app.classList.add("sidebar-open");
  ui.toggle.setAttribute("aria-expanded", "true");
  ui.backdrop.hidden = false;
  const first = ui.sidebar.querySelector("button");
  if (first) first.focus();
}

export function closeSidebar() {
  if (!app.classList.contains("sidebar-open")) return;
  app.classList.remove("sidebar-open");
  ui.toggle.setAttribute("aria-expanded", "false");
  ui.backdrop.hidden = true;
}

// --- Opening a session ----------------------------------------------------------------

export function setUrl(id, replace) {
  const url = id === null ? location.pathname : location.pathname + "?session=" + encodeURIComponent(id);
  if (url === location.pathname + location.search) return;
  history[replace ? "replaceState" : "pushState"]({ session: id }, "", url);
}

function clearThread() {
  clearTimeout(state.pollTimer);
  ui.messages.textContent = "";
}

export function newChat(replaceUrl) {
  state.view++;
  state.sessionId = null;
  clearThread();
  ui.welcome.hidden = false;
  setUrl(null, replaceUrl);
  refreshCurrent();
  closeSidebar();
  ui.composer.focus();
}

export function openSession(id, options) {
  options = options || {};
  state.view++;
  state.sessionId = Number(id);
  clearThread();
  ui.welcome.hidden = true;
  if (options.url !== false) setUrl(state.sessionId, options.replaceUrl);
  refreshCurrent();
  closeSidebar();
  return loadMessages(state.sessionId, state.view, 0);
}

async function fetchMessages(id) {
  let url = sessionUrl(id) + "messages/";
  let all = [];
  // Oldest first; follow the pages to the newest.
  for (let pages = 0; url && pages < 40; pages++) {
    const page = await api("GET", url);
    all = all.concat(page.results || []);
    url = page.next || null;
  }
  return all;
}

export async function loadMessages(id, view, pollTry) {
  let list;
  try {
    list = await fetchMessages(id);
  } catch (err) {
    if (view !== state.view) return;
    if (err.status === 404) {
      state.sessions.delete(String(id));
      const gone = sessionItem(id);
      if (gone) gone.remove();
      newChat(true);
      showBanner("That chat does not exist (any more).");
    } else {
      showBanner("The messages could not be loaded: " + err.message);
    }
    return;
  }
  if (view !== state.view) return;
  const live = state.generation && state.generation.sessionId === id ? state.generation : null;
  if (live) live.attached = false;
  const stickToBottom = pollTry === 0 || nearBottom();
  ui.messages.textContent = "";
  let stillWriting = false;
  const versions = answerVersions(list);
  list.forEach(function (message) {
    // An earlier version: shown in its place by the current version's ‹ ›.
    if (message.superseded) return;
    // An answer this page is streaming right now: show the live element, not the stored start.
    if (live && message.role === "assistant" && (message.id === live.messageId ||
        (live.messageId === null && message.status === "streaming"))) {
      ui.messages.appendChild(live.el);
      live.attached = true;
      return;
    }
    if (message.role !== "user" && message.role !== "assistant") return;
    if (message.role === "assistant" && message.status === "streaming") stillWriting = true;
    const li = messageElement(message);
    if (message.role === "assistant") setVersions(li, versions.get(message.version_of || message.id));
    ui.messages.appendChild(li);
  });
  if (live && !live.attached) ui.messages.appendChild(live.el);
  markLastExchange();
  ui.welcome.hidden = list.length > 0 || !!live;
  if (stickToBottom) scrollToBottom();
  // Another tab or a dropped socket left an answer running: join it, or, when this socket is
  // busy or closed, check back until it ends.
  if (stillWriting && !live && hooks.joinRunning()) stillWriting = false;
  clearTimeout(state.pollTimer);
  if (stillWriting && pollTry < POLL_TRIES) {
    state.pollTimer = setTimeout(function () {
      if (view === state.view) loadMessages(id, view, pollTry + 1);
    }, POLL_EVERY_MS);
  }
}
