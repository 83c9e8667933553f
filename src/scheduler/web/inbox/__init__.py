"""The participants' live inbox: the hub that numbers and fans out notifications (``hub``),
its routes and page (``routes``) and the page's session (``session``).
"""
