"""The Textual front end of dstui (the only place textual/plotext are imported).

May import every core stage; the core never imports this package. Shared formatting lives in
:mod:`dstui.core.formatting`, not in the CLI's modules.
"""
