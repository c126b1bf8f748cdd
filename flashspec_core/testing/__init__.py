"""Test helpers shipped with FlashSpec so that third-party plugins inherit its suites.

* :mod:`~flashspec_core.testing.laws`: exact laws (filtered target law, acceptance
  masses, number-accepted law) in float64;
* :mod:`~flashspec_core.testing.chisq`: grouped chi-square goodness of fit with small
  bins merged, Holm's correction, KS against Uniform(0, 1);
* :mod:`~flashspec_core.testing.exactness`: the statistical exactness gate and the
  stationary-chain transition test;
* contract suites, one per interface, each a set of ``check_*`` functions a plugin's
  tests apply to its own component (FlashSpec's apply them to every registered one):
  :mod:`~flashspec_core.testing.target_contract` (shapes, rollback, re-scoring, text),
  :mod:`~flashspec_core.testing.draft_contract` (rollback, catch-up, shared gammas, empty
  proposals, probabilities), :mod:`~flashspec_core.testing.verifier_contract` (shapes,
  ranges, determinism, edge cases) and :mod:`~flashspec_core.testing.selector_contract`
  (range, rewards, seeds, ``begin_request``); :mod:`~flashspec_core.testing.components`
  builds a registered component from its config keys;
* :mod:`~flashspec_core.testing.mutants`: planted bugs the gate must catch.
* ``tree_exactness`` / ``tree_mutants``: the gate and planted bugs for :mod:`flashspec_core.tree`.
"""
