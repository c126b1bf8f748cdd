"""The ``triton`` verifier plugin: the kernels of :mod:`flashspec_kernels.verify` as a Verifier.

:mod:`flashspec_triton.plugin` registers the component and imports triton only when one is
built; :mod:`flashspec_triton.stepgraphs` replays a captured verify step on CUDA.
"""
