/* The one WebSocket: connecting, reconnecting with backoff, and the frames of an answer.
 * The socket carries one generation at a time. When it drops, the page reconnects and
 * reloads the open session from the database, so a finished (or stopped) answer is shown
 * as the server stored it; one the server is still writing (after a reload, in another tab)
 * is joined: the text so far, then its tokens as they come, and Stop stops it (chat.live). */

import {
  api, config, hideBanner, hooks, setConnection, showBanner, showSignedOut, socketOpen, state, ui, updateControls,
} from "./page.js";
import { loadMessages, loadSessions, refreshCurrent, setUrl, upsertSession } from "./sessions.js";
import {
  endGeneration, flushGeneration, scheduleRender, setCitations, setRoute, setStatus, setTimings, showFeedback,
} from "./thread.js";

const RECONNECT_BASE_MS = 500;
const RECONNECT_MAX_MS = 15000;

function socketUrl() {
  return (location.protocol === "https:" ? "wss://" : "ws://") + location.host + config.wsPath;
}

export function connect() {
  clearTimeout(state.reconnectTimer);
  if (state.signedOut || state.socket) return;
  setConnection("connecting", state.everOpened ? "Reconnecting…" : "Connecting…");
  const socket = new WebSocket(socketUrl());
  let opened = false;
  state.socket = socket;
  socket.addEventListener("open", function () {
    if (socket !== state.socket) return;
    opened = true;
    state.reconnectAttempt = 0;
    setConnection("open", "Connected");
    if (ui.banner.dataset.kind === "connection") hideBanner();
    const reconnected = state.everOpened;
    state.everOpened = true;
    updateControls();
    if (reconnected) afterReconnect();
    else joinRunning();
  });
  socket.addEventListener("message", function (event) {
    if (socket !== state.socket) return;
    let frame;
    try {
      frame = JSON.parse(event.data);
    } catch {
      return;
    }
    if (frame && typeof frame === "object") handleFrame(frame);
  });
  socket.addEventListener("close", function (event) {
    if (socket !== state.socket) return;
    state.socket = null;
    connectionLost(event.code, opened);
  });
}

function connectionLost(code, opened) {
  const generation = state.generation;
  if (generation) {
    flushGeneration();
    setStatus(generation.el, "streaming", "Connection lost. The answer is shown once the page reconnects.");
    endGeneration();
  }
  updateControls();
  if (code === 4401) {
    showSignedOut();
    return;
  }
  if (!opened) {
    // A refused handshake looks like any network failure to the page (code 1006):
    // ask the API whether the session is still signed in before retrying.
    api("GET", config.sessionsUrl + "?page_size=1").then(scheduleReconnect, function () {
      if (!state.signedOut) scheduleReconnect();
    });
    return;
  }
  scheduleReconnect();
}

function scheduleReconnect() {
  if (state.signedOut) return;
  clearTimeout(state.reconnectTimer);
  let delay = Math.min(RECONNECT_MAX_MS, RECONNECT_BASE_MS * Math.pow(2, state.reconnectAttempt));
  delay = Math.round(delay * (0.75 + Math.random() * 0.5)); // jitter: tabs do not reconnect in step
  state.reconnectAttempt++;
  setConnection("closed", "Disconnected, retrying in " + Math.max(1, Math.round(delay / 1000)) + " s");
  state.reconnectTimer = setTimeout(connect, delay);
}

function afterReconnect() {
  // Whatever was streaming when the socket dropped has ended or goes on without
  // this page: show what the database holds.
  if (state.sessionId !== null) loadMessages(state.sessionId, state.view, 0);
  loadSessions();
}

// Join the answer on screen that the server is still writing, if any and if the socket is
// free: its frames then come as if this page had asked. Returns whether it joined.
export function joinRunning() {
  if (state.generation || !socketOpen()) return false;
  const running = ui.messages.querySelectorAll('.message.assistant[data-status="streaming"]');
  const li = running.length ? running[running.length - 1] : null;
  if (!li || !li.dataset.messageId || state.notLive.has(li.dataset.messageId)) return false;
  state.generation = {
    el: li, text: li._text || "", view: state.view, sessionId: state.sessionId,
    messageId: Number(li.dataset.messageId), stopping: false, frame: 0, joined: true,
  };
  sendFrame({ type: "join", message_id: state.generation.messageId });
  updateControls();
  return true;
}

hooks.joinRunning = joinRunning;

export function sendFrame(frame) {
  if (!socketOpen()) return false;
  state.socket.send(JSON.stringify(frame));
  return true;
}

// --- Frames ---------------------------------------------------------------------------

function handleFrame(frame) {
  const generation = state.generation;
  switch (frame.type) {
    case "session":
      upsertSession({ id: frame.id, title: frame.title }, true);
      if (!generation) return;
      generation.sessionId = frame.id;
      if (frame.message_id !== undefined && frame.message_id !== null) {
        generation.messageId = frame.message_id;
        generation.el.dataset.messageId = frame.message_id;
      }
      if (generation.questionEl && frame.question_id) generation.questionEl.dataset.messageId = frame.question_id;
      if (generation.view === state.view && state.sessionId === null) {
        state.sessionId = frame.id;
        setUrl(frame.id, true);
        refreshCurrent();
      }
      return;
    case "route":
      if (!generation) return;
      if (frame.message_id !== undefined && frame.message_id !== null) {
        generation.messageId = frame.message_id;
        generation.el.dataset.messageId = frame.message_id;
      }
      setRoute(generation.el, frame.road, frame.target, frame.why);
      return;
    case "resume":
      resume(frame);
      return;
    case "token":
      if (!generation) return;
      generation.text += frame.text || "";
      scheduleRender();
      return;
    case "done": {
      if (!generation) return;
      setRoute(generation.el, frame.road, frame.target);
      const usage = frame.usage || {};
      setTimings(generation.el, frame.ttft_ms, frame.latency_ms, usage.completion_tokens);
      setCitations(generation.el, frame.citations);
      flushGeneration();
      setStatus(generation.el, frame.status || "complete");
      showFeedback(generation.el, "");
      endGeneration();
      reloadVersions(generation);
      return;
    }
    case "error":
      handleError(frame);
      return;
    default:
      return;
  }
}

function resume(frame) {
  const generation = state.generation;
  if (!generation || !generation.joined || generation.messageId !== frame.message_id) return;
  generation.text = frame.text || "";
  if (frame.road) setRoute(generation.el, frame.road, frame.target, frame.why);
  flushGeneration();
  if (frame.live) {
    setStatus(generation.el, "streaming");
    return;
  }
  // No process is writing it any more: as stored (a partial one lost its process).
  state.notLive.add(String(frame.message_id));
  setStatus(generation.el, frame.status, frame.status === "partial" ? "The answer was cut short." : "");
  showFeedback(generation.el, "");
  endGeneration();
}

// A new version of the last exchange has ended (or was refused): the thread as the database has
// it shows every version, and which one is current.
function reloadVersions(generation) {
  if (generation.reload && generation.view === state.view && generation.sessionId === state.sessionId) {
    loadMessages(state.sessionId, state.view, 0);
  }
}

function handleError(frame) {
  const generation = state.generation;
  const message = frame.message || frame.code || "Something went wrong.";
  if (frame.code === "busy" || !generation) {
    // Not about the answer on screen (or no answer is running): say it above the thread.
    showBanner(message);
    return;
  }
  if (generation.reload && (frame.message_id === undefined || frame.message_id === null)) {
    // A regenerate or an edit refused before it began (an earlier exchange, a limit): the thread
    // comes back as it was, and the reason above it.
    showBanner(message);
    endGeneration();
    reloadVersions(generation);
    return;
  }
  let status = frame.status || (generation.text ? "partial" : "failed");
  if (frame.code === "cancelled") status = "cancelled";
  flushGeneration();
  setStatus(generation.el, status, message);
  showFeedback(generation.el, "");
  endGeneration();
  reloadVersions(generation);
}
