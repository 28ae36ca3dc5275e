"""The publishing layer: a run's agents as Hugging Face folders (``export``), their
model cards and the upload to the Hub. It imports the evaluation, core and config layers."""
