"""The HTTP edge, by product: the composition root (``app``), the shared HTTP kit (``http``),
the JSON API (``api``), the operator console (``console``) and the participants' inbox
(``inbox``). The products share only the kit; ``app`` alone wires them together."""
