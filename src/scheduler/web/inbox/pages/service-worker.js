// The inbox page's service worker (PUSH-9): each web push the scheduler sends (its payload,
// decrypted by the browser: the notification's id, kind, title, body and created_at) is shown
// as a notification, tagged with the notification's id so that a repeated delivery replaces
// the one shown instead of adding a second. A click opens (or focuses) the inbox page.
"use strict";

self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));

function text(value, fallback) {
  return typeof value === "string" && value.length > 0 ? value : fallback;
}

self.addEventListener("push", (event) => {
  let note = {};
  try {
    note = event.data ? event.data.json() : {};
  } catch (error) {
    note = {};
  }
  if (note === null || typeof note !== "object") note = {};
  const options = { body: text(note.body, ""), data: { id: text(note.id, null), kind: text(note.kind, null) } };
  if (typeof note.id === "string") options.tag = note.id;
  event.waitUntil(self.registration.showNotification(text(note.title, "New notification"), options));
});

self.addEventListener("notificationclick", (event) => {
  event.notification.close();
  const page = new URL("../inbox", self.registration.scope).href;
  event.waitUntil(self.clients.matchAll({ type: "window", includeUncontrolled: true }).then((windows) => {
    for (const client of windows) {
      if (client.url === page && "focus" in client) return client.focus();
    }
    return self.clients.openWindow(page);
  }));
});
