"""The served models' engine replicas and their supervision.

``model_service`` (one served model: its replicas, capacity, admission and metrics),
``replica`` (one engine process, supervised: started, watched, started again) and
``restart_policy`` (when to restart a lost engine, and when to stop trying).
"""
