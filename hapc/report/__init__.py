"""Views of a Plan for people. :mod:`hapc.report.model` computes what they show (headline,
baselines, per-device rows, the chart's series); the renderers format it: the summary and
report.md (:mod:`~hapc.report.summary`), the SVG chart (:mod:`~hapc.report.svg`), the notebook's
Markdown and HTML (:mod:`~hapc.report.notebook`), ``hapc explain`` (:mod:`~hapc.report.explain`),
pipeline descriptions (:mod:`~hapc.report.pipeline`) and the IR listing of ``hapc ir``
(:mod:`~hapc.report.ir_text`)."""
