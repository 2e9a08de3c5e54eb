"""Views of a Plan for people: the summary and report.md, ``hapc explain``, the SVG chart,
the notebook rendering, pipeline descriptions, and the IR listing of ``hapc ir``."""
