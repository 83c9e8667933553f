"""The operator console: server-rendered pages (``pages``), its sign-in (``auth``), reset and
cancel by filter (``bulk``, ``cancel``), with its templates and static files.

Importing it loads nothing else: a host without the console never loads its pages (EMB-10).
"""
