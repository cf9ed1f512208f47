"""The optimizer side: what an optimizer rank runs besides the learner (``rapid.opt``). Loading experience
(``loader``, ``decode_pool``), balancing the batch against the rollouts (``balance``), publishing versions
(``publisher``) and checkpoints (``checkpoints``). It never imports the rollout side (``tests/test_layout.py``)."""
