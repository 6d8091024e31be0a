/* The browser chat: session list (REST), one WebSocket for answers, safe Markdown.
 *
 * The socket carries one generation at a time. When it drops, the page
 * reconnects with backoff and reloads the open session from the database, so a
 * finished (or stopped) answer is shown as the server stored it.
 * Text from the server only ever reaches the page through textContent or
 * GatewayMarkdown.render, whose HTML is sanitized to an allow-list (markdown.js).
 */
(function () {
  "use strict";

  var app = document.getElementById("app");
  if (!app || !window.GatewayMarkdown || !window.GatewayApi) return;
  var markdown = window.GatewayMarkdown;

  function byId(id) { return document.getElementById(id); }

  var ui = {
    sidebar: byId("sidebar"),
    toggle: byId("sessions-toggle"),
    backdrop: byId("backdrop"),
    newChat: byId("new-chat"),
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

  var config = {
    wsPath: app.dataset.wsPath,
    sessionsUrl: app.dataset.sessionsUrl,
    loginUrl: app.dataset.loginUrl,
    csrfToken: app.dataset.csrfToken,
  };

  var ROADS = { kb: "KB", local: "local", external: "external" };
  var RECONNECT_BASE_MS = 500;
  var RECONNECT_MAX_MS = 15000;
  var POLL_EVERY_MS = 1500;
  var POLL_TRIES = 40;

  var state = {
    sessionId: null, // the session on screen; null for a new chat not yet sent
    view: 0, // bumped whenever the screen switches sessions, to drop late responses
    sessions: new Map(), // id -> {id, title, ...}
    sessionsNext: null,
    socket: null,
    everOpened: false,
    reconnectAttempt: 0,
    reconnectTimer: null,
    signedOut: false,
    generation: null, // {el, text, view, sessionId, messageId, stopping, frame}
    composing: false,
    pollTimer: null,
  };

  // --- REST ---------------------------------------------------------------------------

  function isSignedOutResponse(status, data) {
    if (status === 401) return true;
    if (status !== 403 || !data) return false;
    var code = (data.error && data.error.code) || data.code || "";
    var detail = String(data.detail || (data.error && data.error.message) || "");
    return code === "not_authenticated" || /credentials were not provided|not authenticated/i.test(detail);
  }

  function api(method, url, body) {
    return window.GatewayApi.request(method, url, body, {
      csrfToken: config.csrfToken,
      onFailure: function (status, data) {
        if (isSignedOutResponse(status, data)) showSignedOut();
      },
    });
  }

  function sessionUrl(id) { return config.sessionsUrl + encodeURIComponent(id) + "/"; }

  // --- Banner and connection status -----------------------------------------------------

  function showBanner(text, kind) {
    ui.banner.textContent = text;
    ui.banner.dataset.kind = kind || "";
    ui.banner.hidden = false;
  }

  function hideBanner() {
    ui.banner.hidden = true;
    ui.banner.textContent = "";
  }

  function showSignedOut() {
    if (state.signedOut) return;
    state.signedOut = true;
    clearTimeout(state.reconnectTimer);
    ui.banner.textContent = "You are signed out. ";
    var link = document.createElement("a");
    link.href = config.loginUrl + "?next=" + encodeURIComponent(location.pathname + location.search);
    link.textContent = "Sign in again";
    ui.banner.appendChild(link);
    ui.banner.hidden = false;
    setConnection("closed", "Signed out");
    updateControls();
  }

  function setConnection(kind, text) {
    ui.connection.dataset.state = kind;
    ui.connection.textContent = text;
  }

  // --- Messages -----------------------------------------------------------------------

  function element(tag, className, text) {
    var node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  }

  function nearBottom() {
    return ui.thread.scrollHeight - ui.thread.scrollTop - ui.thread.clientHeight < 80;
  }

  function scrollToBottom() {
    ui.thread.scrollTop = ui.thread.scrollHeight;
  }

  function userElement(text, id) {
    var li = element("li", "message user");
    if (id) li.dataset.messageId = id;
    li.appendChild(element("div", "bubble", text));
    return li;
  }

  function assistantElement() {
    var li = element("li", "message assistant");
    li.dataset.status = "streaming";
    li.setAttribute("aria-busy", "true");
    var meta = element("div", "meta");
    var bubble = element("div", "bubble markdown");
    var citations = element("div", "citations");
    citations.hidden = true;
    var note = element("p", "status-note");
    note.hidden = true;
    li.append(meta, bubble, citations, note);
    return li;
  }

  function part(li, selector) { return li.querySelector(selector); }

  function setRoute(li, road, target) {
    var meta = part(li, ".meta");
    var badge = part(meta, ".badge");
    if (road) {
      if (!badge) {
        badge = element("span", "badge");
        meta.prepend(badge);
      }
      badge.dataset.road = road;
      badge.textContent = ROADS[road] || road;
      badge.title = "Answered by the " + (road === "kb" ? "knowledge base" : road + " model");
    }
    if (target) {
      var targetEl = part(meta, ".target") || meta.appendChild(element("span", "target"));
      targetEl.textContent = target;
    }
  }

  function milliseconds(value) {
    if (value === null || value === undefined || isNaN(value)) return null;
    return value < 1000 ? Math.round(value) + " ms" : (value / 1000).toFixed(value < 10000 ? 2 : 1) + " s";
  }

  function setTimings(li, ttft, latency, tokens) {
    var meta = part(li, ".meta");
    var timings = part(meta, ".timings") || meta.appendChild(element("span", "timings"));
    var pieces = [];
    if (milliseconds(ttft)) pieces.push("first token " + milliseconds(ttft));
    if (milliseconds(latency)) pieces.push("total " + milliseconds(latency));
    if (tokens) pieces.push(tokens + " tokens");
    timings.textContent = pieces.join(" · ");
    if (ttft !== null && ttft !== undefined) timings.dataset.ttftMs = ttft;
    if (latency !== null && latency !== undefined) timings.dataset.latencyMs = latency;
  }

  function setCitations(li, citations) {
    var box = part(li, ".citations");
    box.textContent = "";
    if (!citations || !citations.length) {
      box.hidden = true;
      return;
    }
    box.appendChild(element("span", "citations-label", "Sources: "));
    var list = element("ul");
    citations.forEach(function (citation) {
      var item = element("li", null, citation.label || "KB#" + citation.entry_id);
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

  var STATUS_NOTES = {
    cancelled: "Stopped.",
    partial: "The answer was cut off",
    failed: "No answer",
  };

  function setStatus(li, status, message) {
    li.dataset.status = status;
    if (status === "streaming") {
      li.setAttribute("aria-busy", "true");
    } else {
      li.removeAttribute("aria-busy");
    }
    var note = part(li, ".status-note");
    var text = "";
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
  }

  function messageElement(message) {
    if (message.role === "user") return userElement(message.content, message.id);
    var li = assistantElement();
    li.dataset.messageId = message.id;
    setRoute(li, message.road, message.target);
    setContent(li, message.content || "");
    if (message.status !== "streaming") {
      setTimings(li, message.ttft_ms, message.latency_ms, message.completion_tokens);
    }
    setCitations(li, message.citations);
    setStatus(li, message.status || "complete", message.status === "streaming"
      ? "Still being written…" : message.error);
    return li;
  }

  // --- Session list -------------------------------------------------------------------

  function sessionTitle(session) {
    return (session && session.title) || "Untitled chat";
  }

  function sessionElement(session) {
    var li = element("li", "session");
    li.dataset.sessionId = session.id;
    fillSessionElement(li, session);
    return li;
  }

  function fillSessionElement(li, session) {
    li.textContent = "";
    var open = element("button", "session-open", sessionTitle(session));
    open.type = "button";
    open.title = sessionTitle(session);
    open.dataset.action = "open";
    var actions = element("span", "session-actions");
    var rename = element("button", null, "✎");
    rename.type = "button";
    rename.dataset.action = "rename";
    rename.setAttribute("aria-label", "Rename chat: " + sessionTitle(session));
    rename.title = "Rename";
    var remove = element("button", null, "✕");
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

  function refreshCurrent() {
    Array.prototype.forEach.call(ui.sessions.children, markCurrent);
    var session = state.sessions.get(String(state.sessionId));
    ui.title.textContent = state.sessionId === null ? "New chat" : sessionTitle(session);
    document.title = (state.sessionId === null ? "New chat" : sessionTitle(session)) + " · Answering gateway";
  }

  function updateSessionsEmpty() {
    ui.sessionsEmpty.hidden = ui.sessions.children.length > 0;
  }

  function upsertSession(session, toTop) {
    var key = String(session.id);
    var known = state.sessions.get(key) || {};
    var merged = Object.assign({}, known, session);
    state.sessions.set(key, merged);
    var li = sessionItem(session.id);
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

  async function loadSessions(url) {
    try {
      var page = await api("GET", url || config.sessionsUrl);
      (page.results || []).forEach(function (session) { upsertSession(session, false); });
      state.sessionsNext = page.next || null;
      ui.sessionsMore.hidden = !state.sessionsNext;
      updateSessionsEmpty();
    } catch (err) {
      showBanner("The chat list could not be loaded: " + err.message);
    }
  }

  function startRename(li) {
    var id = li.dataset.sessionId;
    var session = state.sessions.get(String(id));
    li.textContent = "";
    var form = element("form", "session-rename");
    var label = element("label", "visually-hidden", "New title");
    var input = element("input");
    input.type = "text";
    input.maxLength = 200;
    input.value = session ? session.title || "" : "";
    input.id = "rename-" + id;
    label.htmlFor = input.id;
    var save = element("button", "small-button", "Save");
    save.type = "submit";
    var cancel = element("button", "small-button", "Cancel");
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
      var title = input.value.trim();
      save.disabled = true;
      try {
        var updated = await api("PATCH", sessionUrl(id), { title: title });
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

  async function deleteSession(li, button) {
    // Two clicks, no dialog: the first arms the button for a few seconds.
    if (!button.classList.contains("armed")) {
      var label = button.getAttribute("aria-label");
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
    var id = li.dataset.sessionId;
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

  // --- Opening a session ----------------------------------------------------------------

  function setUrl(id, replace) {
    var url = id === null ? location.pathname : location.pathname + "?session=" + encodeURIComponent(id);
    if (url === location.pathname + location.search) return;
    history[replace ? "replaceState" : "pushState"]({ session: id }, "", url);
  }

  function clearThread() {
    clearTimeout(state.pollTimer);
    ui.messages.textContent = "";
  }

  function newChat(replaceUrl) {
    state.view++;
    state.sessionId = null;
    clearThread();
    ui.welcome.hidden = false;
    setUrl(null, replaceUrl);
    refreshCurrent();
    closeSidebar();
    ui.composer.focus();
  }

  function openSession(id, options) {
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
    var url = sessionUrl(id) + "messages/";
    var all = [];
    // Oldest first; follow the pages to the newest.
    for (var pages = 0; url && pages < 40; pages++) {
      var page = await api("GET", url);
      all = all.concat(page.results || []);
      url = page.next || null;
    }
    return all;
  }

  async function loadMessages(id, view, pollTry) {
    var list;
    try {
      list = await fetchMessages(id);
    } catch (err) {
      if (view !== state.view) return;
      if (err.status === 404) {
        state.sessions.delete(String(id));
        var gone = sessionItem(id);
        if (gone) gone.remove();
        newChat(true);
        showBanner("That chat does not exist (any more).");
      } else {
        showBanner("The messages could not be loaded: " + err.message);
      }
      return;
    }
    if (view !== state.view) return;
    var live = state.generation && state.generation.sessionId === id ? state.generation : null;
    if (live) live.attached = false;
    var stickToBottom = pollTry === 0 || nearBottom();
    ui.messages.textContent = "";
    var stillWriting = false;
    list.forEach(function (message) {
      // An answer this page is streaming right now: show the live element, not the stored start.
      if (live && message.role === "assistant" && (message.id === live.messageId ||
          (live.messageId === null && message.status === "streaming"))) {
        ui.messages.appendChild(live.el);
        live.attached = true;
        return;
      }
      if (message.role !== "user" && message.role !== "assistant") return;
      if (message.role === "assistant" && message.status === "streaming") stillWriting = true;
      ui.messages.appendChild(messageElement(message));
    });
    if (live && !live.attached) ui.messages.appendChild(live.el);
    ui.welcome.hidden = list.length > 0 || !!live;
    if (stickToBottom) scrollToBottom();
    // Another tab or a dropped socket left an answer running: check back until it ends.
    clearTimeout(state.pollTimer);
    if (stillWriting && pollTry < POLL_TRIES) {
      state.pollTimer = setTimeout(function () {
        if (view === state.view) loadMessages(id, view, pollTry + 1);
      }, POLL_EVERY_MS);
    }
  }

  // --- WebSocket -------------------------------------------------------------------------

  function socketUrl() {
    return (location.protocol === "https:" ? "wss://" : "ws://") + location.host + config.wsPath;
  }

  function socketOpen() {
    return state.socket !== null && state.socket.readyState === WebSocket.OPEN;
  }

  function connect() {
    clearTimeout(state.reconnectTimer);
    if (state.signedOut || state.socket) return;
    setConnection("connecting", state.everOpened ? "Reconnecting…" : "Connecting…");
    var socket = new WebSocket(socketUrl());
    var opened = false;
    state.socket = socket;
    socket.addEventListener("open", function () {
      if (socket !== state.socket) return;
      opened = true;
      state.reconnectAttempt = 0;
      setConnection("open", "Connected");
      if (ui.banner.dataset.kind === "connection") hideBanner();
      var reconnected = state.everOpened;
      state.everOpened = true;
      updateControls();
      if (reconnected) afterReconnect();
    });
    socket.addEventListener("message", function (event) {
      if (socket !== state.socket) return;
      var frame;
      try {
        frame = JSON.parse(event.data);
      } catch (err) {
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
    var generation = state.generation;
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
      api("GET", config.sessionsUrl + "?page_size=1").then(scheduleReconnect, function (err) {
        if (!state.signedOut) scheduleReconnect();
      });
      return;
    }
    scheduleReconnect();
  }

  function scheduleReconnect() {
    if (state.signedOut) return;
    clearTimeout(state.reconnectTimer);
    var delay = Math.min(RECONNECT_MAX_MS, RECONNECT_BASE_MS * Math.pow(2, state.reconnectAttempt));
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

  function sendFrame(frame) {
    if (!socketOpen()) return false;
    state.socket.send(JSON.stringify(frame));
    return true;
  }

  // --- Generations -----------------------------------------------------------------------

  function renderGeneration() {
    var generation = state.generation;
    if (!generation) return;
    generation.frame = 0;
    var stick = nearBottom();
    var started = performance.now();
    setContent(generation.el, generation.text);
    generation.renderedAt = performance.now();
    generation.renderCost = generation.renderedAt - started;
    if (stick) scrollToBottom();
  }

  function scheduleRender() {
    var generation = state.generation;
    if (!generation || generation.frame || generation.timer) return;
    // Each render parses and sanitizes the whole answer again, so it costs more as the answer
    // grows: the next one waits four times the last one's cost, which keeps rendering to about
    // a fifth of the main thread however fast tokens come.
    var wait = (generation.renderedAt || 0) + 4 * (generation.renderCost || 0) - performance.now();
    if (wait > 0) {
      generation.timer = setTimeout(function () {
        generation.timer = 0;
        scheduleRender();
      }, wait);
      return;
    }
    generation.frame = requestAnimationFrame(renderGeneration);
  }

  function flushGeneration() {
    var generation = state.generation;
    if (generation.frame) cancelAnimationFrame(generation.frame);
    if (generation.timer) clearTimeout(generation.timer);
    generation.timer = 0;
    renderGeneration();
  }

  function endGeneration() {
    state.generation = null;
    updateControls();
  }

  function handleFrame(frame) {
    var generation = state.generation;
    switch (frame.type) {
      case "session":
        upsertSession({ id: frame.id, title: frame.title }, true);
        if (!generation) return;
        generation.sessionId = frame.id;
        if (frame.message_id !== undefined && frame.message_id !== null) {
          generation.messageId = frame.message_id;
          generation.el.dataset.messageId = frame.message_id;
        }
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
        setRoute(generation.el, frame.road, frame.target);
        return;
      case "token":
        if (!generation) return;
        generation.text += frame.text || "";
        scheduleRender();
        return;
      case "done":
        if (!generation) return;
        setRoute(generation.el, frame.road, frame.target);
        var usage = frame.usage || {};
        setTimings(generation.el, frame.ttft_ms, frame.latency_ms, usage.completion_tokens);
        setCitations(generation.el, frame.citations);
        flushGeneration();
        setStatus(generation.el, frame.status || "complete");
        endGeneration();
        return;
      case "error":
        handleError(frame);
        return;
      default:
        return;
    }
  }

  function handleError(frame) {
    var generation = state.generation;
    var message = frame.message || frame.code || "Something went wrong.";
    if (frame.code === "busy" || !generation) {
      // Not about the answer on screen (or no answer is running): say it above the thread.
      showBanner(message);
      return;
    }
    var status = frame.status || (generation.text ? "partial" : "failed");
    if (frame.code === "cancelled") status = "cancelled";
    flushGeneration();
    setStatus(generation.el, status, message);
    endGeneration();
  }

  function submit() {
    var text = ui.composer.value;
    if (!text.trim() || state.generation) return;
    if (!socketOpen()) {
      showBanner("Not connected. The page is reconnecting; your question is kept.", "connection");
      return;
    }
    hideBanner();
    ui.welcome.hidden = true;
    var li = assistantElement();
    state.generation = {
      el: li, text: "", view: state.view, sessionId: state.sessionId, messageId: null, stopping: false, frame: 0,
    };
    ui.messages.appendChild(userElement(text));
    ui.messages.appendChild(li);
    scrollToBottom();
    sendFrame({ type: "message", session: state.sessionId, content: text });
    ui.composer.value = "";
    autosize();
    updateControls();
  }

  function stop() {
    var generation = state.generation;
    if (!generation || generation.stopping) return;
    generation.stopping = true;
    sendFrame({ type: "stop" });
    updateControls();
  }

  function updateControls() {
    var generation = state.generation;
    ui.send.hidden = !!generation;
    ui.stop.hidden = !generation;
    ui.stop.disabled = !!(generation && generation.stopping);
    ui.stop.textContent = generation && generation.stopping ? "Stopping…" : "Stop";
    ui.send.disabled = !socketOpen() || state.signedOut;
  }

  // --- Composer: Enter sends, Shift+Enter breaks the line, IME Enter confirms -------------

  function autosize() {
    ui.composer.style.height = "auto";
    ui.composer.style.height = Math.min(ui.composer.scrollHeight + 2, 192) + "px";
  }

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

  // --- Sidebar -----------------------------------------------------------------------------

  function openSidebar() {
    app.classList.add("sidebar-open");
    ui.toggle.setAttribute("aria-expanded", "true");
    ui.backdrop.hidden = false;
    var first = ui.sidebar.querySelector("button");
    if (first) first.focus();
  }

  function closeSidebar() {
    if (!app.classList.contains("sidebar-open")) return;
    app.classList.remove("sidebar-open");
    ui.toggle.setAttribute("aria-expanded", "false");
    ui.backdrop.hidden = true;
  }

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
    var button = event.target.closest("button[data-action]");
    if (!button) return;
    var li = button.closest(".session");
    var action = button.dataset.action;
    if (action === "open") {
      hideBanner();
      openSession(li.dataset.sessionId);
    } else if (action === "rename") {
      startRename(li);
    } else if (action === "delete") {
      deleteSession(li, button);
    }
  });

  window.addEventListener("popstate", function () {
    var id = new URLSearchParams(location.search).get("session");
    if (id && /^\d+$/.test(id)) {
      openSession(id, { url: false });
    } else {
      newChat(true);
    }
  });
  window.addEventListener("online", function () {
    if (!state.socket && !state.signedOut) connect();
  });

  // --- Start ---------------------------------------------------------------------------------

  updateControls();
  connect();
  loadSessions();
  var initial = new URLSearchParams(location.search).get("session");
  if (initial && /^\d+$/.test(initial)) {
    openSession(initial, { url: false });
  } else {
    refreshCurrent();
  }
})();
