"""Surgery: carry a trained run through a change of observations, model size or actions, keeping what it
computes (OpenAI Five §3.3 and appendix B; docs/surgery.md).

``shapes`` plans the growth of every tensor, ``transform`` grows the weights and Adam's moments, ``verify``
checks that old and new policies agree; ``run_store`` and ``cli`` apply all that to a run's store.
"""
