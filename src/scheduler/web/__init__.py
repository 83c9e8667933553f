"""The HTTP edge, by product: the shared HTTP kit (``http``), the JSON API (``api``), the
operator console (``console``) and the participants' inbox (``inbox``), and the web app
(``app``) that mounts them. The products share only the kit; the composition root
(``scheduler.service``) builds their route modules and ``app`` mounts them together."""
