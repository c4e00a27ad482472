"""The headless front end: one module per `dstui` subcommand, each a thin layer over the stages.

May import every stage below it (core .. report, importer); never :mod:`dstui.tui`
(except ``commands.tui``, which only starts it lazily).
"""
