/* New versions of the last exchange: Regenerate (its question answered again) and Edit (the
 * question changed and answered). The new answer streams over the socket like any other; when
 * it ends, the thread is read again from the database, which holds every version. */

import { hideBanner, showBanner, socketOpen, state, updateControls } from "./page.js";
import { sendFrame } from "./socket.js";
import { assistantElement, element, markLastExchange, scrollToBottom } from "./thread.js";

function ready() {
  if (state.generation) {
    showBanner("An answer is still streaming; stop it or wait for it to finish.");
    return false;
  }
  if (!socketOpen()) {
    showBanner("Not connected. The page is reconnecting; try again in a moment.", "connection");
    return false;
  }
  hideBanner();
  return true;
}

// The new answer takes the place of the one it replaces.
function startVersion(replaced, questionEl, frame) {
  const li = assistantElement();
  replaced.replaceWith(li);
  state.generation = {
    el: li, questionEl: questionEl, text: "", view: state.view, sessionId: state.sessionId, messageId: null,
    stopping: false, frame: 0, reload: true,
  };
  markLastExchange();
  scrollToBottom();
  sendFrame(frame);
  updateControls();
}

export function regenerate(button) {
  const li = button.closest(".message.assistant");
  if (!li || !li.dataset.messageId || !ready()) return;
  const question = li.previousElementSibling;
  startVersion(li, question, { type: "regenerate", message_id: Number(li.dataset.messageId) });
}

export function startEdit(button) {
  const li = button.closest(".message.user");
  if (!li || !li.dataset.messageId || li.querySelector("form")) return;
  const bubble = li.querySelector(".bubble");
  const form = element("form", "edit-form");
  const label = element("label", "visually-hidden", "Your edited question");
  const area = element("textarea");
  area.id = "edit-" + li.dataset.messageId;
  area.rows = 3;
  area.value = bubble.textContent;
  label.htmlFor = area.id;
  const send = element("button", "primary small-button", "Send");
  send.type = "submit";
  const cancel = element("button", "small-button", "Cancel");
  cancel.type = "button";
  const actions = element("div", "edit-actions");
  actions.append(send, cancel);
  form.append(label, area, actions);
  bubble.hidden = true;
  li.appendChild(form);
  markLastExchange();
  area.focus();

  function close() {
    form.remove();
    bubble.hidden = false;
    markLastExchange();
  }
  cancel.addEventListener("click", close);
  area.addEventListener("keydown", function (event) {
    if (event.key === "Escape") {
      event.preventDefault();
      close();
    } else if (event.key === "Enter" && !event.shiftKey && !event.altKey && !event.isComposing &&
               event.keyCode !== 229) {
      // As in the composer: Enter sends, Shift+Enter breaks the line, IME Enter confirms.
      event.preventDefault();
      form.requestSubmit();
    }
  });
  form.addEventListener("submit", function (event) {
    event.preventDefault();
    const text = area.value;
    if (!text.trim() || !ready()) return;
    let answer = li.nextElementSibling;
    if (!answer || !answer.classList.contains("assistant")) {
      answer = element("li");
      li.after(answer);
    }
    close();
    bubble.textContent = text;
    startVersion(answer, li, { type: "edit", message_id: Number(li.dataset.messageId), content: text });
  });
}
