"""The scale model behind ``benchmarks/bench_fleet.py``: a simulated clock, request-counting stores and a
discrete-event fleet that drives rapid's real data-plane objects (see that script's docstring)."""
