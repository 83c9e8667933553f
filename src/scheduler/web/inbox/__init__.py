"""The participants' live inbox: the hub that numbers and fans out notifications (``hub``),
its routes and page (``routes``) and the page's session (``session``).

This package stands where the module ``scheduler.web.inbox`` was (now ``hub``): the names
that module offered still resolve here, with a DeprecationWarning (ARCH-3).
"""

from scheduler.moved import forward

__getattr__ = forward(__name__)
