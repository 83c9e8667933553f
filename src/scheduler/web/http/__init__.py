"""The HTTP kit every product of the web edge shares: strict query, header and path
parameters (``params``), bounded and validated request bodies (``bodies``), the answers and
their models (``answers``), the filter of scheduled events (``event_filter``), error answers
(``errors``), bearer tokens and permissions (``auth``), browser sessions (``sessions``) and
streams (``sse``).
"""
