"""An OpenAI-compatible HTTP server over a FlashSpec pipeline (``flashspec serve``).

:mod:`flashspec_serve.engine` decodes with continuous batching in its own thread,
:mod:`flashspec_serve.app` is the FastAPI app, :mod:`flashspec_serve.metrics` its
Prometheus metrics and :mod:`flashspec_serve.cli` the command. docs/serving.md describes
the API and its limits.
"""
