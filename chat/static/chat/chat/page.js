/* What every part of the chat page shares: its DOM handles, config and state, the REST
 * helper, the banner, the connection status and the Send/Stop buttons. */

import { byId } from "../dom.js";

export const app = byId("app");
export const markdown = window.GatewayMarkdown;

export const ui = {
  sidebar: byId("sidebar"),
  toggle: byId("sessions-toggle"),
  backdrop: byId("backdrop"),
  newChat: byId("new-chat"),
  searchForm: byId("search-form"),
  search: byId("search"),
  searchBox: byId("search-box"),
  searchStatus: byId("search-status"),
  searchResults: byId("search-results"),
  searchMore: byId("search-more"),
  searchClear: byId("search-clear"),
  sessions: byId("sessions"),
  sessionsEmpty: byId("sessions-empty"),
  sessionsMore: byId("sessions-more"),
  connection: byId("connection"),
  title: byId("conversation-title"),
  banner: byId("banner"),
  thread: byId("thread"),
  welcome: byId("welcome"),
  messages: byId("messages"),
  form: byId("composer-form"),
  composer: byId("composer"),
  send: byId("send"),
  stop: byId("stop"),
};

const dataset = app ? app.dataset : {};
export const config = {
  wsPath: dataset.wsPath,
  sessionsUrl: dataset.sessionsUrl,
  messagesUrl: dataset.messagesUrl,
  searchUrl: dataset.searchUrl,
  loginUrl: dataset.loginUrl,
  csrfToken: dataset.csrfToken,
};

// What one module offers another that it cannot import without a cycle (the static files'
// manifest rewrites imports and cannot settle a cycle): socket.js fills these in.
export const hooks = {
  joinRunning: function () { return false; },
};

export const state = {
  sessionId: null, // the session on screen; null for a new chat not yet sent
  view: 0, // bumped whenever the screen switches sessions, to drop late responses
  sessions: new Map(), // id -> {id, title, ...}
  sessionsNext: null,
  socket: null,
  everOpened: false,
  reconnectAttempt: 0,
  reconnectTimer: null,
  signedOut: false,
  // {el, questionEl, text, view, sessionId, messageId, stopping, frame, reload, joined};
  // `reload`: a new version of the last exchange, whose thread is read again from the database
  // when it ends; `joined`: an answer this page joined (chat.live) rather than asked
  generation: null,
  notLive: new Set(), // answers a join found no process writing: not joined again
  searchNext: null,
  composing: false,
  pollTimer: null,
};

// --- REST ---------------------------------------------------------------------------

function isSignedOutResponse(status, data) {
  if (status === 401) return true;
  if (status !== 403 || !data) return false;
  const code = (data.error && data.error.code) || data.code || "";
  const detail = String(data.detail || (data.error && data.error.message) || "");
  return code === "not_authenticated" || /credentials were not provided|not authenticated/i.test(detail);
}

export function api(method, url, body) {
  return window.GatewayApi.request(method, url, body, {
    csrfToken: config.csrfToken,
    onFailure: function (status, data) {
      if (isSignedOutResponse(status, data)) showSignedOut();
    },
  });
}

export function sessionUrl(id) { return config.sessionsUrl + encodeURIComponent(id) + "/"; }

// --- Banner, connection status, controls ----------------------------------------------

export function showBanner(text, kind) {
  ui.banner.textContent = text;
  ui.banner.dataset.kind = kind || "";
  ui.banner.hidden = false;
}

export function hideBanner() {
  ui.banner.hidden = true;
  ui.banner.textContent = "";
}

export function showSignedOut() {
  if (state.signedOut) return;
  state.signedOut = true;
  clearTimeout(state.reconnectTimer);
  ui.banner.textContent = "You are signed out. ";
  const link = document.createElement("a");
  link.href = config.loginUrl + "?next=" + encodeURIComponent(location.pathname + location.search);
  link.textContent = "Sign in again";
  ui.banner.appendChild(link);
  ui.banner.hidden = false;
  setConnection("closed", "Signed out");
  updateControls();
}

export function setConnection(kind, text) {
  ui.connection.dataset.state = kind;
  ui.connection.textContent = text;
}

export function socketOpen() {
  return state.socket !== null && state.socket.readyState === WebSocket.OPEN;
}

export function updateControls() {
  const generation = state.generation;
  ui.send.hidden = !!generation;
  ui.stop.hidden = !generation;
  ui.stop.disabled = !!(generation && generation.stopping);
  ui.stop.textContent = generation && generation.stopping ? "Stopping…" : "Stop";
  ui.send.disabled = !socketOpen() || state.signedOut;
}
