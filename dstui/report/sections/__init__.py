"""Sections of the markdown report, one function per section: ``section(ctx) -> str``.

Each takes the computed :class:`dstui.report.context.ReportContext` and returns
markdown ('' to leave the section out). A new section goes into the module
whose theme it shares and into the list in :func:`dstui.report.markdown.render`.
"""
