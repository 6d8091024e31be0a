// The dashboard's admission panel: its live cells (slots held, requests waiting) refreshed in
// place every few seconds from the same page's ?panel=admission; the rest of the page stays as
// loaded.
"use strict";

(function () {
  const EVERY = 5000; // ms between two refreshes
  const TIMEOUT = 4000; // ms a refresh may take before it is given up

  function refresh() {
    const panel = document.getElementById("admission");
    if (panel === null || document.hidden) {
      return;
    }
    fetch(panel.dataset.refresh, {
      credentials: "same-origin",
      signal: AbortSignal.timeout(TIMEOUT),
    })
      .then((response) => (response.ok ? response.text() : null))
      .then((html) => {
        if (html === null) {
          return;
        }
        const fresh = new DOMParser().parseFromString(html, "text/html");
        const cells = new Map();
        for (const cell of panel.querySelectorAll("[data-live]")) {
          cells.set(cell.dataset.live, cell);
        }
        for (const cell of fresh.querySelectorAll("[data-live]")) {
          const shown = cells.get(cell.dataset.live);
          if (shown !== undefined) {
            shown.textContent = cell.textContent;
          }
        }
      })
      .catch(() => {}); // the next refresh tries again
  }

  setInterval(refresh, EVERY);
})();
