"""The report of what torchfuse compiled: its data model (``model.py``), filled in by the
pipeline, and what reads it back as text, a summary, bytes moved and an HTML page."""
