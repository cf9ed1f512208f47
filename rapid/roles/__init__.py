"""The role mains: each function wires one process of a run, top to bottom.

- :mod:`rapid.roles.rollout`: ``run_rollout``, a rollout worker process (env → policy → samples → uploader).
- :mod:`rapid.roles.optimizer`: ``run_optimizer``, one optimizer rank (loader → buffer → learner → publish).
- :mod:`rapid.roles.evaluator`: ``run_evaluator``, plays the newest version against a fixed baseline.
- :mod:`rapid.roles.launcher`: ``run_train``, `rapid train`: all the roles on one machine.
- :mod:`rapid.roles.startup`: what every role needs at start-up (store, spec, policy, stop flag, logs).
"""
