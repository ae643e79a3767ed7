"""Admission policy, in the edge process: when a stream may start (who may ask is
:mod:`cadenza.edge.auth`'s).

``validation`` (what is acceptable), ``guard`` (an input-text policy),
``rate_limit`` (how much per client) and ``shared_rate_limit`` (the same buckets, the fleet's,
in Redis), ``capacity`` (how many real-time streams an engine replica holds, from its measured
memory and step time; ``realtime_factor``: how much slower than calibrated its steps run live;
``factor_memory``: that factor kept across restarts; ``prefill_schedule``: whether the
admitted prompts can all be prefilled in time), ``priority_queues``, ``gate`` and ``ticket``
(waiting for capacity, refusing with a reason and ``Retry-After``), ``placement`` (which
replica a stream starts on), ``capacity_snapshot`` and ``capacity_report`` (what
``GET /v1/capacity`` says) and ``session_reservations`` (streams promised to WebSocket
sessions between their upgrade and their first ``speak``).
:mod:`cadenza.edge.streams.admission_sequence` runs them in one order for every transport;
docs/capacity.md has the whole model.
"""
