"""Token layouts: how a model's tokens spell codec frames (``token_layout`` has the contract;
``flat``, ``delay_pattern`` and ``frame_rows``, a whole frame a step for two-level models,
the audio layouts).

=======================  ==============================  =====================================
layout                   module                          spoken by
=======================  ==============================  =====================================
``plain``                ``token_layout``                a text LM: EOS or ``max_new_steps``
``parallel+delay``       ``delay_pattern``               cadenza-tiny: ``K`` codebooks a step,
                                                         codebook ``k`` ``k`` steps late
``flat``                 ``flat``                        Orpheus, a Llama with a
                                                         ``cadenza.json``: ``K`` tokens a frame
``frames``               ``frame_rows``                  Sesame CSM: a whole frame a row
=======================  ==============================  =====================================

A layout says which ids each step may sample and which are forced, when a sequence is done and
which codec frames are complete; the scheduler applies what it says. A family may bring its own
layout (Bark's, in its package); one whose streams run through contexts that each start afresh
is a ``ContextRestarts`` (``token_layout``), and the scheduler restarts them.
"""
