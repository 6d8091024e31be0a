/* The chat page's entry point (templates/chat/chat.html loads it as a module, after
 * api.js and markdown.js): the composer, the sidebar's controls, history, and the start. */

import { app, hideBanner, showBanner, socketOpen, state, ui, updateControls } from "./page.js";
import {
  closeSidebar, deleteSession, loadSessions, newChat, openSession, openSidebar, refreshCurrent, startRename,
} from "./sessions.js";
import { regenerate, startEdit } from "./exchange.js";
import { listenToSearch } from "./search.js";
import { connect, sendFrame } from "./socket.js";
import {
  assistantElement, copyAnswer, giveVerdict, markLastExchange, scrollToBottom, stepVersion, userElement,
} from "./thread.js";

// --- Composer: Enter sends, Shift+Enter breaks the line, IME Enter confirms -------------

function autosize() {
  ui.composer.style.height = "auto";
  ui.composer.style.height = Math.min(ui.composer.scrollHeight + 2, 192) + "px";
}

function submit() {
  const text = ui.composer.value;
  if (!text.trim() || state.generation) return;
  if (!socketOpen()) {
    showBanner("Not connected. The page is reconnecting; your question is kept.", "connection");
    return;
  }
  hideBanner();
  ui.welcome.hidden = true;
  const li = assistantElement();
  const question = userElement(text);
  state.generation = {
    el: li, questionEl: question, text: "", view: state.view, sessionId: state.sessionId, messageId: null,
    stopping: false, frame: 0,
  };
  ui.messages.appendChild(question);
  ui.messages.appendChild(li);
  markLastExchange();
  scrollToBottom();
  sendFrame({ type: "message", session: state.sessionId, content: text });
  ui.composer.value = "";
  autosize();
  updateControls();
}

function stop() {
  const generation = state.generation;
  if (!generation || generation.stopping) return;
  generation.stopping = true;
  sendFrame({ type: "stop" });
  updateControls();
}

function listenToComposer() {
  ui.composer.addEventListener("compositionstart", function () { state.composing = true; });
  ui.composer.addEventListener("compositionend", function () { state.composing = false; });
  ui.composer.addEventListener("keydown", function (event) {
    if (event.key !== "Enter") return;
    // The Enter that confirms a Chinese/Japanese IME composition is not a send:
    // isComposing is the standard signal, keyCode 229 covers Safari, where
    // compositionend fires before this keydown.
    if (event.isComposing || event.keyCode === 229 || state.composing) return;
    if (event.shiftKey || event.altKey) return;
    event.preventDefault();
    submit();
  });
  ui.composer.addEventListener("input", autosize);
  ui.form.addEventListener("submit", function (event) {
    event.preventDefault();
    submit();
  });
  ui.stop.addEventListener("click", stop);
}

// --- Sidebar -----------------------------------------------------------------------------

function listenToSidebar() {
  ui.toggle.addEventListener("click", function () {
    if (app.classList.contains("sidebar-open")) {
      closeSidebar();
      ui.toggle.focus();
    } else {
      openSidebar();
    }
  });
  ui.backdrop.addEventListener("click", closeSidebar);
  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape" && app.classList.contains("sidebar-open")) {
      closeSidebar();
      ui.toggle.focus();
    }
  });

  ui.newChat.addEventListener("click", function () {
    hideBanner();
    newChat(false);
  });
  ui.sessionsMore.addEventListener("click", function () {
    if (state.sessionsNext) loadSessions(state.sessionsNext);
  });
  ui.sessions.addEventListener("click", function (event) {
    const button = event.target.closest("button[data-action]");
    if (!button) return;
    const li = button.closest(".session");
    const action = button.dataset.action;
    if (action === "open") {
      hideBanner();
      openSession(li.dataset.sessionId);
    } else if (action === "rename") {
      startRename(li);
    } else if (action === "delete") {
      deleteSession(li, button);
    }
  });
}

const THREAD_ACTIONS = {
  copy: copyAnswer,
  regenerate: regenerate,
  edit: startEdit,
  "version-prev": stepVersion,
  "version-next": stepVersion,
};

function listenToThread() {
  ui.messages.addEventListener("click", function (event) {
    const button = event.target.closest(".feedback .verdict");
    if (button) giveVerdict(button);
    const action = event.target.closest("button[data-action]");
    if (action && Object.hasOwn(THREAD_ACTIONS, action.dataset.action)) THREAD_ACTIONS[action.dataset.action](action);
  });
}

function listenToWindow() {
  window.addEventListener("popstate", function () {
    const id = new URLSearchParams(location.search).get("session");
    if (id && /^\d+$/.test(id)) {
      openSession(id, { url: false });
    } else {
      newChat(true);
    }
  });
  window.addEventListener("online", function () {
    if (!state.socket && !state.signedOut) connect();
  });
}

// --- Start ---------------------------------------------------------------------------------

function start() {
  listenToComposer();
  listenToSidebar();
  listenToThread();
  listenToSearch();
  listenToWindow();
  updateControls();
  connect();
  loadSessions();
  const initial = new URLSearchParams(location.search).get("session");
  if (initial && /^\d+$/.test(initial)) {
    openSession(initial, { url: false });
  } else {
    refreshCurrent();
  }
}

if (app && window.GatewayMarkdown && window.GatewayApi) start();
