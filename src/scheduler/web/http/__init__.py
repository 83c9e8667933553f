"""The HTTP kit every product of the web edge shares: bounded bodies and answers
(``plumbing``), strict query parameters (``params``), the filter of scheduled events
(``event_filter``), the wire schemas (``schemas``), error answers (``errors``), bearer tokens
and permissions (``auth``), browser sessions (``sessions``) and streams (``sse``).
"""
