"""The HTTP application and its life cycle: what starts, serves, watches and stops the edge.

``app`` (the FastAPI app: routes, lifespan, health, readiness, metrics, capacity, the browser
page in ``static/``), ``state`` (what the handlers share), ``lifecycle`` (whether the server
takes new streams, and the ones it has open: a drain), ``draining_server`` (uvicorn, with
SIGTERM turned into a drain), ``admin`` (operator routes: drain, rolling restart, replicas),
``metrics`` and ``model_metrics`` (Prometheus metrics, the engine's included, one model's
view of them), ``agent_check`` and ``node_headroom`` (the free real-time headroom HAProxy
weights the node by), ``node_identity`` (the node's name on responses and metrics) and
``lazy_modules`` (the web stack's first-use imports, done at start), ``browser_policy`` (the
hosts, origins and CORS answers every request passes first, and the page's security headers).
``static/index.html`` (with its ``app.js`` and ``app.css``) is
the browser client served at ``/``: plain HTML/JS with no build step (a text box, Speak and
Stop, an optional microphone whose speech interrupts playback, live time to first audio,
underruns and buffer depth), tested in headless Chromium with Playwright (``tests/e2e/``).

Health and readiness: ``/healthz`` is 200 while the process serves. ``/readyz`` is 200 while
every served model has a ready replica and the server is not draining, else 503; its body lists
each model's replicas with their state, calibration, precision and native kernels (why a replica
was lost is only in ``/admin/replicas``: ``/readyz`` is public).
While no replica of a model is ready its stream requests get 503 ``engine_unavailable`` with
``Retry-After`` (5 s while restarting, 60 s once it gave up), and ``/v1/models`` still lists
it.

``/metrics`` holds the edge's own metrics (HTTP requests, streams per transport, WebRTC peers,
edge tasks, the event loop's lag, how long engine outputs take to reach the edge) and the
engine's, summed from its ``stats`` messages and labelled by model (step time, decodes per
step, running and waiting sequences, occupancy, KV pages, preemptions, prefix hits, skipped
steps, the step correction, chunk slack, readiness), with each replica's calibration and
native kernels from its ``ready``. docs/capacity.md, "Metrics", lists admission's.
"""
