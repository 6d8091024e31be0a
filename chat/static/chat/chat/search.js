/* Searching one's own messages (GET /api/chat/search): the hits listed in the sidebar above the
 * history, each opening its session at the message. */

import { api, config, state, ui } from "./page.js";
import { openSession } from "./sessions.js";
import { element } from "./thread.js";

let query = "";

function searchUrl(q) {
  return config.searchUrl + "?q=" + encodeURIComponent(q);
}

// The snippet as text, with each word of the query in a <mark>.
function marked(text, q) {
  const fragment = document.createDocumentFragment();
  const terms = q.toLowerCase().split(/\s+/).filter(Boolean);
  const lower = text.toLowerCase();
  let at = 0;
  while (at < text.length) {
    let found = -1;
    let length = 0;
    terms.forEach(function (term) {
      const where = lower.indexOf(term, at);
      if (where >= 0 && (found < 0 || where < found)) {
        found = where;
        length = term.length;
      }
    });
    if (found < 0) break;
    fragment.append(text.slice(at, found), element("mark", null, text.slice(found, found + length)));
    at = found + length;
  }
  fragment.append(text.slice(at));
  return fragment;
}

function hitElement(hit) {
  const li = element("li", "search-hit");
  const open = element("button", "search-open");
  open.type = "button";
  open.dataset.sessionId = hit.session_id;
  open.dataset.messageId = hit.message_id;
  open.dataset.sessionTitle = hit.session_title || "";
  const title = element("span", "search-title", (hit.session_title || "Untitled chat") +
    (hit.role === "user" ? " · you" : " · answer"));
  const snippet = element("span", "search-snippet");
  snippet.appendChild(marked(hit.snippet, query));
  open.append(title, snippet);
  li.appendChild(open);
  return li;
}

async function search(url, more) {
  ui.searchBox.hidden = false;
  if (!more) {
    ui.searchResults.textContent = "";
    ui.searchStatus.textContent = "Searching…";
  }
  ui.searchMore.hidden = true;
  let page;
  try {
    page = await api("GET", url);
  } catch (err) {
    ui.searchStatus.textContent = err.message;
    return;
  }
  (page.results || []).forEach(function (hit) { ui.searchResults.appendChild(hitElement(hit)); });
  const count = page.count || 0;
  ui.searchStatus.textContent = count === 0 ? "Nothing found." : count === 1 ? "1 message" : count + " messages";
  state.searchNext = page.next || null;
  ui.searchMore.hidden = !state.searchNext;
}

async function openHit(button) {
  const sessionId = Number(button.dataset.sessionId);
  if (!state.sessions.has(String(sessionId))) {
    // Older than the sessions listed so far: known for its title only.
    state.sessions.set(String(sessionId), { id: sessionId, title: button.dataset.sessionTitle });
  }
  await openSession(sessionId);
  const target = ui.messages.querySelector(
    '.message[data-message-id="' + String(Number(button.dataset.messageId)) + '"]');
  if (!target || state.sessionId !== sessionId) return;
  ui.messages.querySelectorAll(".message.found").forEach(function (li) { li.classList.remove("found"); });
  target.classList.add("found");
  target.scrollIntoView({ block: "center" });
}

function closeResults() {
  ui.searchBox.hidden = true;
  ui.searchResults.textContent = "";
  ui.search.value = "";
  query = "";
  ui.search.focus();
}

export function listenToSearch() {
  ui.searchForm.addEventListener("submit", function (event) {
    event.preventDefault();
    query = ui.search.value;
    search(searchUrl(query), false);
  });
  ui.search.addEventListener("keydown", function (event) {
    if (event.key === "Escape" && !ui.searchBox.hidden) {
      event.preventDefault();
      event.stopPropagation(); // the sidebar stays open at phone width
      closeResults();
    }
  });
  ui.searchMore.addEventListener("click", function () {
    if (state.searchNext) search(state.searchNext, true);
  });
  ui.searchClear.addEventListener("click", closeResults);
  ui.searchResults.addEventListener("click", function (event) {
    const button = event.target.closest(".search-open");
    if (button) openHit(button);
  });
}
