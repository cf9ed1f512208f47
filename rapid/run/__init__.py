"""What every role of a run shares: its config (``config``, ``config_schema``, ``config_validate``), the store's
keys (``store_map``), published parameters (``param_store``), the optimizer's lease and who watches it (``lease``,
``run_watch``), matches between two players (``matches``), the progress line and summary (``progress``) and
rate-limited warnings (``quiet_log``)."""
