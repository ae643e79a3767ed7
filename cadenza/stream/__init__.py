"""The edge process: FastAPI app, OpenAI-compatible HTTP, health and metrics.

Nothing here imports torch (a test checks it).
"""
