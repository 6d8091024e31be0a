/* JSON calls to the gateway's REST API from the browser pages (chat and keys).
 * Sends the CSRF token on unsafe methods and turns any error body the server
 * uses into one readable message. */
window.GatewayApi = (function () {
  "use strict";

  function csrfToken(fallback) {
    const match = /(?:^|;\s*)csrftoken=([^;]+)/.exec(document.cookie);
    return match ? decodeURIComponent(match[1]) : fallback;
  }

  // Every API error comes as {"error": {"code", "message", "fields"}} (core.errors), the message
  // already naming the fields; anything else (a proxy's page, a crash) by its status.
  function errorMessage(data, response) {
    if (data && data.error && typeof data.error === "object" && data.error.message) return String(data.error.message);
    return "The server answered " + response.status + " " + (response.statusText || "") + ".";
  }

  function failure(status, message) {
    const error = new Error(message);
    error.status = status;
    return error;
  }

  /* options.csrfToken: the token to use when the cookie is absent;
   * options.onFailure(status, data): called before an HTTP error is thrown. */
  async function request(method, url, body, options) {
    options = options || {};
    const headers = { Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (method !== "GET") headers["X-CSRFToken"] = csrfToken(options.csrfToken);
    let response;
    try {
      response = await fetch(url, {
        method: method,
        headers: headers,
        credentials: "same-origin",
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch {
      throw failure(0, "The server cannot be reached. Check the connection and try again.");
    }
    if (response.status === 204) return null;
    let data;
    try {
      data = await response.json();
    } catch {
      data = null;
    }
    if (!response.ok) {
      if (options.onFailure) options.onFailure(response.status, data);
      throw failure(response.status, errorMessage(data, response));
    }
    return data;
  }

  return { request: request, errorMessage: errorMessage };
})();
