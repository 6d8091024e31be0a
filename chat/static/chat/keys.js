/* The user's own API keys: list, create (the raw key is shown once), revoke.
 * Server text reaches the page through textContent only. templates/chat/keys.html loads it as
 * a module, after api.js. */

import { byId } from "./dom.js";

const root = byId("keys-app");

function start() {
  const ui = {
    error: byId("keys-error"),
    form: byId("key-form"),
    name: byId("key-name"),
    create: byId("key-create"),
    newKey: byId("new-key"),
    newKeyValue: byId("new-key-value"),
    copy: byId("new-key-copy"),
    copied: byId("new-key-copied"),
    empty: byId("keys-empty"),
    table: byId("keys-table"),
    rows: byId("keys"),
  };
  const keysUrl = root.dataset.keysUrl;

  function api(method, url, body) {
    return window.GatewayApi.request(method, url, body, { csrfToken: root.dataset.csrfToken });
  }

  function showError(text) {
    ui.error.textContent = text;
    ui.error.hidden = false;
  }

  function hideError() {
    ui.error.hidden = true;
    ui.error.textContent = "";
  }

  function cell(text, className) {
    const td = document.createElement("td");
    if (className) td.className = className;
    if (text !== undefined) td.textContent = text;
    return td;
  }

  function when(value) {
    if (!value) return "never";
    const date = new Date(value);
    return isNaN(date) ? String(value) : date.toLocaleString();
  }

  function row(key) {
    const tr = document.createElement("tr");
    tr.dataset.keyId = key.id;
    tr.dataset.revoked = key.revoked_at ? "true" : "false";
    tr.appendChild(cell(key.name, "key-name"));
    const prefix = cell(undefined, "key-prefix");
    const code = document.createElement("code");
    code.textContent = key.prefix + "…";
    prefix.appendChild(code);
    tr.appendChild(prefix);
    tr.appendChild(cell((key.scopes || []).join(", "), "key-scopes"));
    tr.appendChild(cell(when(key.created_at)));
    tr.appendChild(cell(key.last_used_at ? when(key.last_used_at) : "never"));
    const status = cell(undefined);
    const badge = document.createElement("span");
    badge.className = "state " + (key.revoked_at ? "revoked" : "active");
    badge.textContent = key.revoked_at ? "revoked " + when(key.revoked_at) : "active";
    status.appendChild(badge);
    tr.appendChild(status);
    const actions = cell(undefined);
    if (!key.revoked_at) {
      const revoke = document.createElement("button");
      revoke.type = "button";
      revoke.className = "small-button";
      revoke.dataset.action = "revoke";
      revoke.textContent = "Revoke";
      revoke.setAttribute("aria-label", "Revoke key " + key.name);
      actions.appendChild(revoke);
    }
    tr.appendChild(actions);
    return tr;
  }

  function render(keys) {
    ui.rows.textContent = "";
    keys.forEach(function (key) { ui.rows.appendChild(row(key)); });
    ui.table.hidden = keys.length === 0;
    ui.empty.hidden = keys.length > 0;
  }

  async function load() {
    try {
      const data = await api("GET", keysUrl);
      render(data.results || []);
    } catch (err) {
      showError("Your keys could not be loaded: " + err.message);
    }
  }

  ui.form.addEventListener("submit", async function (event) {
    event.preventDefault();
    hideError();
    const name = ui.name.value.trim();
    if (!name) {
      showError("Give the key a name.");
      ui.name.setAttribute("aria-invalid", "true");
      ui.name.focus();
      return;
    }
    ui.name.removeAttribute("aria-invalid");
    const scopes = Array.prototype.map.call(ui.form.querySelectorAll('input[name="scopes"]:checked'),
      function (box) { return box.value; });
    if (!scopes.length) {
      showError("Choose at least one scope.");
      return;
    }
    ui.create.disabled = true;
    try {
      const created = await api("POST", keysUrl, { name: name, scopes: scopes });
      ui.newKeyValue.value = created.key;
      ui.newKey.hidden = false;
      ui.copied.hidden = true;
      ui.newKeyValue.focus();
      ui.newKeyValue.select();
      ui.form.reset();
      await load();
    } catch (err) {
      showError("The key was not created: " + err.message);
    } finally {
      ui.create.disabled = false;
    }
  });

  ui.copy.addEventListener("click", async function () {
    ui.newKeyValue.select();
    try {
      await navigator.clipboard.writeText(ui.newKeyValue.value);
    } catch {
      // No clipboard API (plain HTTP): the key is selected for Ctrl+C instead.
      if (!document.execCommand || !document.execCommand("copy")) {
        ui.copied.textContent = "Selected: press Ctrl+C (⌘C) to copy.";
        ui.copied.hidden = false;
        return;
      }
    }
    ui.copied.textContent = "Copied.";
    ui.copied.hidden = false;
  });

  ui.rows.addEventListener("click", async function (event) {
    const button = event.target.closest('button[data-action="revoke"]');
    if (!button) return;
    // Two clicks, no dialog: the first arms the button for a few seconds.
    if (!button.classList.contains("armed")) {
      button.classList.add("armed");
      button.textContent = "Revoke now?";
      button._disarm = setTimeout(function () {
        button.classList.remove("armed");
        button.textContent = "Revoke";
      }, 4000);
      return;
    }
    clearTimeout(button._disarm);
    button.disabled = true;
    hideError();
    try {
      await api("DELETE", keysUrl + encodeURIComponent(button.closest("tr").dataset.keyId) + "/");
      await load();
    } catch (err) {
      button.disabled = false;
      showError("The key was not revoked: " + err.message);
    }
  });

  load();
}

if (root && window.GatewayApi) start();
