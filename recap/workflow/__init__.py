"""The workflow: the content-addressed pipeline and the iteration loop, and what they plan and run.

- ``pipeline``: Steps 1-4 as one job (``recap-pipeline``): gin's ``pipeline.*`` at the edge, the
  plan, the launchers, sweeps, finished stages skipped.
- ``iterate``: iterative RECAP (``recap-iterate``): collect with policy k-1, Steps 1-4, K times.
- ``config``: ``PipelineConfig``, the pipeline's own settings as a typed value.
- ``stages``: the stages, what each runs and reads, and how its result reads.
- ``bindings``: what a stage hands the step that reads its result.
- ``store``: the markers of finished stages (shared with ``iterate``).
- ``launch``: the argv that runs one step module (shared with ``recap-sweep``).
- ``fingerprints``, ``code_versions``, ``lock``: stage fingerprints over the resolved config and
  the code, and the lock of the steps' code versions.
- ``report``: the summary (figures, table, MLflow run, picture).
"""
