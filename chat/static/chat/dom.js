/* DOM helpers shared by the pages' modules (chat/chat/page.js, keys.js). */

export function byId(id) {
  return document.getElementById(id);
}
