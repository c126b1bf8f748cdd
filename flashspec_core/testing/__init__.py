"""Test helpers shipped with FlashSpec so that third-party plugins inherit its suites.

* :mod:`~flashspec_core.testing.laws`: exact laws (filtered target law, acceptance
  masses, number-accepted law) in float64;
* :mod:`~flashspec_core.testing.chisq`: grouped chi-square goodness of fit with small
  bins merged, Holm's correction, KS against Uniform(0, 1);
* :mod:`~flashspec_core.testing.exactness`: the statistical exactness gate and the
  stationary-chain transition test;
* :mod:`~flashspec_core.testing.verifier_contract`: shape/range/determinism checks
  for any :class:`~flashspec_core.contracts.Verifier`;
* :mod:`~flashspec_core.testing.mutants`: planted bugs the gate must catch.
"""
