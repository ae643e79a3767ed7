"""The HTTP application and its life cycle: what starts, serves, watches and stops the edge.

``app`` (the FastAPI app: routes, lifespan, health, readiness, metrics, capacity, the browser
page in ``static/``), ``state`` (what the handlers share), ``lifecycle`` (whether the server
takes new streams, and the ones it has open: a drain), ``draining_server`` (uvicorn, with
SIGTERM turned into a drain), ``admin`` (operator routes: drain, rolling restart, replicas),
``metrics`` (Prometheus metrics, the engine's included) and ``lazy_modules`` (the web stack's
first-use imports, done at start).
"""
