"""The operator console: server-rendered pages (``pages``), its sign-in (``auth``), reset and
cancel by filter (``bulk``, ``cancel``), with its templates and static files.

This package stands where the module ``scheduler.web.console`` was (now ``pages``): the names
that module offered still resolve here, with a DeprecationWarning (ARCH-3). Importing it
loads nothing else: a host without the console never loads its pages (EMB-10).
"""

from scheduler.moved import forward

__getattr__ = forward(__name__)
