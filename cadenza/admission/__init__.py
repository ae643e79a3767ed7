"""Gateway policy applied to every transport.

Today: the validation limits (:mod:`cadenza.admission.validation`). API keys, rate limits,
priority queues and the capacity model build on it.
"""
